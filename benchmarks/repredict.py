"""Re-predict recorded runs with the current cost model: does a change of the model move the
predictions of runs measured earlier (on GPUs, say) without running them again?

Reads ``benchmarks/results/accuracy_<mode>.json`` and each run's plan under
``accuracy_<mode>/plans/`` (or, where that folder is absent, the plan inside each run's
``results.json``; with the calibration the runs were planned with, checked by hash), predicts again
and prints recorded vs current prediction and the error against the measurement, and, where the
report holds measured peak memory (GPU runs), the recorded and current prediction of each device's
allocated bytes. Writes ``benchmarks/results/repredict_<mode>.json``.

``mode`` names the recorded runs: emulated, gpu, gpu4, or any NAME with ``accuracy_NAME.json``
under ``--results`` (``gpu4_h200_rerun``, say). ``--calibration FILE`` predicts every run with that
calibration instead of the one it was made with where FILE holds the same ``measured_at_utc`` (a
what-if: a copy of that calibration with a measured field added; each such plan's calibration
record is pointed at FILE and its hash, the other plans keep theirs) and writes
``repredict_<mode>_<FILE's stem>.json``.
"""

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.inputs.calibration import read_calibration  # noqa: E402
from planner.prediction.predict import predict  # noqa: E402
from planner.report.accuracy import mean_absolute_percentage_error  # noqa: E402
from planner.runtime.inputs import load_run_inputs  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", help="emulated, gpu, gpu4, or NAME of accuracy_NAME.json under --results")
    parser.add_argument("--results", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--calibration", help="predict with this calibration file instead of each plan's own")
    args = parser.parse_args()
    results = Path(args.results)
    runs = results / f"accuracy_{args.mode}"
    if not (results / f"accuracy_{args.mode}.json").is_file():
        parser.error(f"no recorded runs {results / f'accuracy_{args.mode}.json'}: name another mode or --results")
    if args.calibration and not Path(args.calibration).is_file():
        parser.error(f"--calibration {args.calibration} is not a file")
    report = json.loads((results / f"accuracy_{args.mode}.json").read_text())
    # FILE stands in for the calibration measured at the same time (a copy with fields added)
    stand_in = read_calibration(args.calibration) if args.calibration else None
    rows, memory = [], []
    measured_memory = {(m["run"], m["device"]): m for m in report.get("memory", [])}
    with tempfile.TemporaryDirectory() as folder:
        for row in report["rows"]:
            plan = Path(folder) / f"{row['label']}.yaml"  # beside its calibration, wherever it was made
            if (runs / "plans").is_dir():
                shutil.copy(runs / "plans" / plan.name, plan)
            else:
                plan.write_text(yaml.safe_dump(json.loads((runs / row["label"] / "results.json").read_text())["plan"]))
            document = yaml.safe_load(plan.read_text())
            record = document.get("calibration") or {}
            kept = Path(record.get("path", "calibration.yaml")).name  # the run's calibration, kept beside the runs
            if (runs / kept).exists():
                shutil.copy(runs / kept, Path(folder) / kept)
            if stand_in and record.get("measured_at_utc") == stand_in.measured_at_utc:
                beside = Path(folder) / f"what-if-{kept}"  # the what-if: FILE under the plan's record
                shutil.copy(args.calibration, beside)
                record.update(path=str(beside), sha256=hashlib.sha256(beside.read_bytes()).hexdigest())
                plan.write_text(yaml.safe_dump(document))
                row = {**row, "calibration": "what-if"}
            topology = yaml.safe_load(plan.read_text())["topology"]["path"]  # relative to the project
            inputs = load_run_inputs(plan, ROOT / topology)
            prediction = predict(inputs.plan, inputs.topology, inputs.model, inputs.training)[0]
            now = prediction.iteration_s
            for name, used in sorted(prediction.memory_bytes.items()):
                if (row["label"], name) in measured_memory:
                    m = measured_memory[(row["label"], name)]
                    allocated = used - inputs.topology.devices[inputs.topology.index(name)].memory_reserved_bytes
                    memory.append({"run": row["label"], "device": name, "measured_bytes": m["measured_bytes"],
                                   "recorded_predicted_bytes": m["predicted_bytes"], "predicted_bytes": allocated,
                                   "recorded_error": m["error"], "error": allocated / m["measured_bytes"] - 1})
            scale = row.get("time_scale", 1.0)
            rows.append({"label": row["label"], "what_if": row.get("calibration") == "what-if",
                         "recorded_predicted_s": row["predicted_s"], "predicted_s": now,
                         "measured_s": row["measured_s"], "change": now / row["predicted_s"] - 1,
                         "error": (now - row["measured_s"]) / row["measured_s"], "time_scale": scale})
    print(f"{'run':34} {'recorded s':>11} {'now s':>9} {'change':>8} {'measured s':>11} {'error':>7}")
    for r in rows:
        print(f"{r['label']:34} {r['recorded_predicted_s']:11.4f} {r['predicted_s']:9.4f} {100 * r['change']:+7.3f}% "
              f"{r['measured_s']:11.4f} {100 * r['error']:+6.1f}%")
    mape = mean_absolute_percentage_error([r["predicted_s"] for r in rows], [r["measured_s"] for r in rows])
    print(f"{len(rows)} runs: MAPE now {100 * mape:.2f}% (recorded {100 * report['summary']['mape']:.2f}%)")
    if memory:
        print(f"\n{'run':34} {'device':8} {'measured GB':>11} {'recorded GB':>19} {'now GB':>17}")
        for m in memory:
            print(f"{m['run']:34} {m['device']:8} {m['measured_bytes'] / 1e9:11.2f} "
                  f"{m['recorded_predicted_bytes'] / 1e9:10.2f} ({100 * m['recorded_error']:+5.1f}%) "
                  f"{m['predicted_bytes'] / 1e9:8.2f} ({100 * m['error']:+5.1f}%)")
    out = results / f"repredict_{args.mode}{'_' + Path(args.calibration).stem if args.calibration else ''}.json"
    out.write_text(json.dumps({"rows": rows, "mape": mape, "recorded_mape": report["summary"]["mape"],
                               "memory": memory, **({"calibration": os.path.relpath(args.calibration, ROOT)}
                                                    if args.calibration else {})}, indent=1) + "\n")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
