"""Re-predict recorded runs with the current cost model: does a change of the model move the
predictions of runs measured earlier (on GPUs, say) without running them again?

Reads ``benchmarks/results/accuracy_<mode>.json`` and each run's plan under
``accuracy_<mode>/plans/`` (with the calibration the runs were planned with, checked by hash),
predicts again and prints recorded vs current prediction and the error against the measurement.
Writes ``benchmarks/results/repredict_<mode>.json``.
"""

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.prediction.predict import predict  # noqa: E402
from planner.report.accuracy import mean_absolute_percentage_error  # noqa: E402
from planner.runtime.inputs import load_run_inputs  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["emulated", "gpu"])
    parser.add_argument("--results", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args()
    results = Path(args.results)
    runs = results / f"accuracy_{args.mode}"
    report = json.loads((results / f"accuracy_{args.mode}.json").read_text())
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for row in report["rows"]:
            plan = Path(folder) / f"{row['label']}.yaml"  # beside its calibration, wherever it was made
            shutil.copy(runs / "plans" / plan.name, plan)
            if (runs / "calibration.yaml").exists():
                shutil.copy(runs / "calibration.yaml", Path(folder) / "calibration.yaml")
            topology = yaml.safe_load(plan.read_text())["topology"]["path"]  # relative to the project
            inputs = load_run_inputs(plan, ROOT / topology)
            now = predict(inputs.plan, inputs.topology, inputs.model, inputs.training)[0].iteration_s
            scale = row.get("time_scale", 1.0)
            rows.append({"label": row["label"], "recorded_predicted_s": row["predicted_s"], "predicted_s": now,
                         "measured_s": row["measured_s"], "change": now / row["predicted_s"] - 1,
                         "error": (now - row["measured_s"]) / row["measured_s"], "time_scale": scale})
    print(f"{'run':34} {'recorded s':>11} {'now s':>9} {'change':>8} {'measured s':>11} {'error':>7}")
    for r in rows:
        print(f"{r['label']:34} {r['recorded_predicted_s']:11.4f} {r['predicted_s']:9.4f} {100 * r['change']:+7.3f}% "
              f"{r['measured_s']:11.4f} {100 * r['error']:+6.1f}%")
    mape = mean_absolute_percentage_error([r["predicted_s"] for r in rows], [r["measured_s"] for r in rows])
    print(f"{len(rows)} runs: MAPE now {100 * mape:.2f}% (recorded {100 * report['summary']['mape']:.2f}%)")
    out = results / f"repredict_{args.mode}.json"
    out.write_text(json.dumps({"rows": rows, "mape": mape, "recorded_mape": report["summary"]["mape"]}, indent=1)
                   + "\n")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
