"""Re-predict measured ``plan launch`` runs with the current cost model.

A folder holds, per run, the plan file ``NAME.yaml`` and the run's ``NAME/results.json`` (``plan
launch PLAN --out NAME``), and the ``calibration.yaml`` the plans were made with. Each plan is
predicted again on ``--topology`` calibrated by that file, beside the prediction the run recorded
and the measured median. Prints a table and writes ``repredict.json`` into the folder.

    python benchmarks/repredict_launches.py benchmarks/results/compression_gpu_h100x2 \\
        --topology topologies/local/h100-x2.yaml
"""

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def repredict(folder: Path, topology_path: Path) -> list:
    from planner.inputs.calibration import apply_calibration, read_calibration
    from planner.prediction.predict import predict
    from planner.runtime.inputs import load_run_inputs

    calibration = read_calibration(folder / "calibration.yaml")
    rows = []
    for results_path in sorted(folder.glob("*/results.json")):
        name = results_path.parent.name
        results = json.loads(results_path.read_text())
        inputs = load_run_inputs(folder / f"{name}.yaml", topology_path)
        topology = apply_calibration(inputs.topology, calibration)
        now = predict(inputs.plan, topology, inputs.model, inputs.training)[0].iteration_s
        measured, recorded = results["measured"]["median_s"], results["predicted"]["iteration_s"]
        rows.append({"run": name, "measured_s": measured, "recorded_predicted_s": recorded,
                     "recorded_error": recorded / measured - 1, "predicted_s": now, "error": now / measured - 1})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("--topology", required=True)
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    rows = repredict(folder, Path(args.topology))
    print(f"{'run':22} {'measured s':>10} {'recorded s':>10} {'error':>7} {'now s':>8} {'error':>7}")
    for r in rows:
        print(f"{r['run']:22} {r['measured_s']:>10.4f} {r['recorded_predicted_s']:>10.4f} "
              f"{100 * r['recorded_error']:>+6.1f}% {r['predicted_s']:>8.4f} {100 * r['error']:>+6.1f}%")
    (folder / "repredict.json").write_text(json.dumps({"topology": args.topology, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
