"""Re-predict the measured tensor-group runs on 4x H100 with the current cost model: the "predicted
now" column the README quotes for them.

Reads ``benchmarks/results/runtime_gpu_tensor_x4.json`` (one run of ``benchmarks/runtime_gpu.py
--gpus 4`` per plan), predicts each plan file it names (``benchmarks/plans/h100x4-tensor*.yaml``,
``h100x4-pipeline-tensor*.yaml``) on ``topologies/local/h100-x4.yaml`` (with ``--calibration FILE``,
calibrated by it, as ``plan --calibration``), and prints the recorded and the current prediction of
the iteration time and of each device's peak allocated memory next to the measured ones. Writes
``benchmarks/results/repredict_tensor_x4.json``.
"""

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.inputs.calibration import apply_calibration, read_calibration  # noqa: E402
from planner.plan.plan import validate_plan  # noqa: E402
from planner.prediction.predict import predict  # noqa: E402
from planner.runtime.inputs import load_run_inputs  # noqa: E402

RUNS = ROOT / "benchmarks" / "results" / "runtime_gpu_tensor_x4.json"
TOPOLOGY = ROOT / "topologies" / "local" / "h100-x4.yaml"
OUT = ROOT / "benchmarks" / "results" / "repredict_tensor_x4.json"
GB = 1e9


def repredict(run: dict, calibration=None) -> dict:
    """One measured run against its plan's prediction now (memory: allocated bytes, the reserved
    memory left out, as the runtime's peak counts them)."""
    inputs = load_run_inputs(ROOT / run["file"], TOPOLOGY)
    topology = apply_calibration(inputs.topology, calibration) if calibration else inputs.topology
    validate_plan(inputs.plan, topology, inputs.model, inputs.training)
    prediction = predict(inputs.plan, topology, inputs.model, inputs.training)[0]
    allocated = {name: used - topology.devices[topology.index(name)].memory_reserved_bytes
                 for name, used in prediction.memory_bytes.items()}
    measured_memory = {name: gb * GB for name, gb in run["peak_memory_gb"].items()}
    recorded = {name: gb * GB - topology.devices[topology.index(name)].memory_reserved_bytes
                for name, gb in run["predicted_memory_gb"].items()}
    return {"plan": run["plan"], "file": run["file"], "micro_batch_size": inputs.plan.micro_batch_size,
            "measured_s": run["measured_s"], "recorded_predicted_s": run["predicted_s"],
            "predicted_s": prediction.iteration_s, "error": prediction.iteration_s / run["measured_s"] - 1,
            "recorded_error": run["predicted_s"] / run["measured_s"] - 1,
            "floor_s": {d.type_name: d.tensor_block_issue_s for d in topology.devices},
            "memory": [{"device": name, "measured_bytes": measured_memory[name], "predicted_bytes": allocated[name],
                        "error": allocated[name] / measured_memory[name] - 1,
                        "recorded_predicted_bytes": recorded[name],
                        "recorded_error": recorded[name] / measured_memory[name] - 1}
                       for name in sorted(measured_memory)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default=str(RUNS), help="runtime_gpu.py results to re-predict")
    parser.add_argument("--calibration", help="calibration file to predict with (as 'plan --calibration')")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    calibration = read_calibration(args.calibration) if args.calibration else None
    report = json.loads(Path(args.runs).read_text())
    rows = [repredict(run, calibration) for run in report["runs"]
            if Path(run["file"]).name.startswith(("h100x4-tensor", "h100x4-pipeline-tensor"))]
    print(f"{'plan':44} {'mb':>3} {'measured s':>11} {'recorded s':>16} {'now s':>16}")
    for r in rows:
        print(f"{r['plan']:44} {r['micro_batch_size']:3d} {r['measured_s']:11.3f} "
              f"{r['recorded_predicted_s']:8.3f} ({100 * r['recorded_error']:+6.1f}%) "
              f"{r['predicted_s']:8.3f} ({100 * r['error']:+6.1f}%)")
    print(f"\n{'plan':44} peak allocated memory, measured: recorded prediction -> now (GB)")
    for r in rows:
        print(f"{r['plan']:44} " + ", ".join(f"{m['device']} {m['measured_bytes'] / GB:.2f}: "
                                              f"{m['recorded_predicted_bytes'] / GB:.2f} -> "
                                              f"{m['predicted_bytes'] / GB:.2f} ({100 * m['error']:+.1f}%)"
                                              for m in r["memory"]))
    out = Path(args.out)
    out.write_text(json.dumps({"runs": rows, "source": str(Path(args.runs).relative_to(ROOT)
                                                           if Path(args.runs).is_relative_to(ROOT) else args.runs),
                               "topology": str(TOPOLOGY.relative_to(ROOT)),
                               "calibration": args.calibration}, indent=1) + "\n")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
