"""Re-predict recorded runs with the current cost model: does a change of the model move the
predictions of runs measured earlier (on GPUs, say) without running them again?

Three kinds of recorded runs, one kind a call; each prints a table and writes JSON.

``MODE``: ``benchmarks/results/accuracy_<mode>.json`` (``benchmarks/accuracy.py``) and each run's
plan under ``accuracy_<mode>/plans/`` (or, where that folder is absent, the plan inside each run's
``results.json``; with the calibration the runs were planned with, checked by hash): the recorded
vs current prediction and the error against the measurement, and, where the report holds measured
peak memory (GPU runs), the recorded and current prediction of each device's allocated bytes.
Writes ``benchmarks/results/repredict_<mode>.json``. ``mode`` names the recorded runs: emulated,
gpu, gpu4, or any NAME with ``accuracy_NAME.json`` under ``--results`` (``gpu4_h200_rerun``, say).
``--calibration FILE`` predicts every run with that calibration instead of the one it was made with
where FILE holds the same ``measured_at_utc`` (a what-if: a copy of that calibration with a measured
field added; each such plan's calibration record is pointed at FILE and its hash, the other plans
keep theirs) and writes ``repredict_<mode>_<FILE's stem>.json``.

``--runs FOLDER --topology FILE``: a folder of ``plan launch`` outputs, per run the plan file
``NAME.yaml`` and the run's ``NAME/results.json`` (``plan launch PLAN --out NAME``), and the
``calibration.yaml`` the plans were made with. Each plan is loaded as ``plan launch`` loads it on
``--topology`` (the calibration it records applied, checked by hash; ``validate_plan``), a plan that
records none calibrated by the folder's file, and predicted beside the prediction the run recorded
and the measured median. Writes ``repredict.json`` into the folder.

``--runtime-runs [FILE]``: ``benchmarks/runtime_gpu.py``'s results (``runtime_gpu_tensor_x4.json``
when FILE is left out), its tensor-group plans (``benchmarks/plans/h100x4-tensor*.yaml``,
``h100x4-pipeline-tensor*.yaml``) predicted on ``topologies/local/h100-x4.yaml`` (with
``--calibration FILE``, calibrated by it, as ``plan --calibration``): the recorded and current
iteration time and each device's peak allocated memory next to the measured ones. Writes ``--out``
(``benchmarks/results/repredict_tensor_x4.json``).
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

from planner.errors import InputError  # noqa: E402
from planner.inputs.calibration import apply_calibration, read_calibration  # noqa: E402
from planner.plan.plan import validate_plan  # noqa: E402
from planner.prediction.predict import predict  # noqa: E402
from planner.report.accuracy import mean_absolute_percentage_error  # noqa: E402
from planner.runtime.inputs import load_run_inputs  # noqa: E402

RUNTIME_RUNS = ROOT / "benchmarks" / "results" / "runtime_gpu_tensor_x4.json"
RUNTIME_TOPOLOGY = ROOT / "topologies" / "local" / "h100-x4.yaml"
RUNTIME_OUT = ROOT / "benchmarks" / "results" / "repredict_tensor_x4.json"
GB = 1e9


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", help="emulated, gpu, gpu4, or NAME of accuracy_NAME.json under --results")
    parser.add_argument("--results", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--calibration", help="predict with this calibration file (MODE: instead of each plan's own "
                                              "of the same measured_at_utc; --runtime-runs: as 'plan --calibration')")
    parser.add_argument("--runs", help="a folder of 'plan launch' outputs (NAME.yaml, NAME/results.json and "
                                       "calibration.yaml)")
    parser.add_argument("--topology", help="the topology the --runs plans ran on")
    parser.add_argument("--runtime-runs", nargs="?", const=str(RUNTIME_RUNS),
                        help=f"benchmarks/runtime_gpu.py results to re-predict (default {RUNTIME_RUNS.name})")
    parser.add_argument("--out", default=str(RUNTIME_OUT), help="where --runtime-runs writes its JSON")
    args = parser.parse_args(argv)
    kinds = [kind for kind, given in (("MODE", args.mode), ("--runs", args.runs),
                                      ("--runtime-runs", args.runtime_runs)) if given]
    if len(kinds) != 1:
        parser.error(f"give one of MODE, --runs FOLDER or --runtime-runs, not {' and '.join(kinds) or 'none'}")
    if args.calibration and not Path(args.calibration).is_file():
        parser.error(f"--calibration {args.calibration} is not a file")
    if args.runs and args.calibration:
        parser.error("--runs predicts with each plan's own calibration: leave out --calibration")
    if args.runs and not args.topology:
        parser.error("--runs needs --topology FILE, the topology its plans ran on")
    if args.topology and not args.runs:
        parser.error("--topology goes with --runs FOLDER")
    try:
        if args.runs:
            return _launches(parser, Path(args.runs), args.topology)
        if args.runtime_runs:
            return _runtime(parser, Path(args.runtime_runs), args.calibration, Path(args.out))
        return _accuracy(parser, args.mode, Path(args.results), args.calibration)
    except InputError as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")


# -- MODE: benchmarks/accuracy.py's reports ---------------------------------------------------------
def _accuracy(parser, mode: str, results: Path, calibration: str | None) -> int:
    runs = results / f"accuracy_{mode}"
    if not (results / f"accuracy_{mode}.json").is_file():
        parser.error(f"no recorded runs {results / f'accuracy_{mode}.json'}: name another mode or --results")
    report = json.loads((results / f"accuracy_{mode}.json").read_text())
    # FILE stands in for the calibration measured at the same time (a copy with fields added)
    stand_in = read_calibration(calibration) if calibration else None
    rows, memory, unrecorded = [], [], []
    measured_memory = {(m["run"], m["device"]): m for m in report.get("memory", [])}
    with tempfile.TemporaryDirectory() as folder:
        for row in report["rows"]:
            if not (runs / row["label"] / "results.json").is_file():  # its results did not come back from the host
                unrecorded.append(row["label"])
                continue
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
                shutil.copy(calibration, beside)
                record.update(path=str(beside), sha256=hashlib.sha256(beside.read_bytes()).hexdigest())
                plan.write_text(yaml.safe_dump(document))
                row = {**row, "calibration": "what-if"}
            topology = yaml.safe_load(plan.read_text())["topology"]["path"]  # relative to the project
            inputs = load_run_inputs(plan, ROOT / topology)
            # as the run computed its loss: runs recorded before ``compiled`` was, ran eager
            compiled = json.loads((runs / row["label"] / "results.json").read_text())["run"].get("compiled", False)
            prediction = predict(inputs.plan, inputs.topology, inputs.model, inputs.training, compiled=compiled)[0]
            now = prediction.iteration_s
            for name, used in sorted(prediction.memory_bytes.items()):
                if (row["label"], name) in measured_memory:
                    m = measured_memory[(row["label"], name)]
                    allocated = used - inputs.topology.devices[inputs.topology.index(name)].memory_reserved_bytes
                    memory.append({"run": row["label"], "device": name, "compiled": compiled,
                                   "measured_bytes": m["measured_bytes"],
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
    if unrecorded:
        print(f"not re-predicted (no results.json kept): {', '.join(unrecorded)}")
    if memory:
        print(f"\n{'run':34} {'device':8} {'loss':8} {'measured GB':>11} {'recorded GB':>19} {'now GB':>17}")
        for m in memory:
            print(f"{m['run']:34} {m['device']:8} {'compiled' if m['compiled'] else 'eager':8} "
                  f"{m['measured_bytes'] / 1e9:11.2f} "
                  f"{m['recorded_predicted_bytes'] / 1e9:10.2f} ({100 * m['recorded_error']:+5.1f}%) "
                  f"{m['predicted_bytes'] / 1e9:8.2f} ({100 * m['error']:+5.1f}%)")
    out = results / f"repredict_{mode}{'_' + Path(calibration).stem if calibration else ''}.json"
    out.write_text(json.dumps({"rows": rows, "mape": mape, "recorded_mape": report["summary"]["mape"],
                               "memory": memory, "not_repredicted": unrecorded, **({"calibration": os.path.relpath(calibration, ROOT)}
                                                    if calibration else {})}, indent=1) + "\n")
    print(f"written to {out}")
    return 0


# -- --runs FOLDER: plan launch outputs --------------------------------------------------------------
def repredict_launches(folder: Path, topology_path: Path) -> list:
    """Each ``plan launch`` run in ``folder`` against its plan's prediction now (rows by run name)."""
    calibration = read_calibration(folder / "calibration.yaml")
    rows = []
    for results_path in sorted(folder.glob("*/results.json")):
        name = results_path.parent.name
        results = json.loads(results_path.read_text())
        inputs = load_run_inputs(folder / f"{name}.yaml", topology_path)  # its recorded calibration, by hash
        topology = inputs.topology if inputs.plan.calibration else apply_calibration(inputs.topology, calibration)
        validate_plan(inputs.plan, topology, inputs.model, inputs.training)
        now = predict(inputs.plan, topology, inputs.model, inputs.training)[0].iteration_s
        measured, recorded = results["measured"]["median_s"], results["predicted"]["iteration_s"]
        rows.append({"run": name, "measured_s": measured, "recorded_predicted_s": recorded,
                     "recorded_error": recorded / measured - 1, "predicted_s": now, "error": now / measured - 1})
    return rows


def _launches(parser, folder: Path, topology: str) -> int:
    if not (folder / "calibration.yaml").is_file():
        parser.error(f"--runs {folder} holds no calibration.yaml: name a folder of 'plan launch' outputs")
    rows = repredict_launches(folder, Path(topology))
    print(f"{'run':22} {'measured s':>10} {'recorded s':>10} {'error':>7} {'now s':>8} {'error':>7}")
    for r in rows:
        print(f"{r['run']:22} {r['measured_s']:>10.4f} {r['recorded_predicted_s']:>10.4f} "
              f"{100 * r['recorded_error']:>+6.1f}% {r['predicted_s']:>8.4f} {100 * r['error']:>+6.1f}%")
    (folder / "repredict.json").write_text(json.dumps({"topology": topology, "rows": rows}, indent=1) + "\n")
    return 0


# -- --runtime-runs FILE: benchmarks/runtime_gpu.py's tensor-group runs ------------------------------
def repredict_runtime(run: dict, calibration=None) -> dict:
    """One measured run against its plan's prediction now (memory: allocated bytes, the reserved
    memory left out, as the runtime's peak counts them)."""
    inputs = load_run_inputs(ROOT / run["file"], RUNTIME_TOPOLOGY)
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


def _runtime(parser, runs: Path, calibration_path: str | None, out: Path) -> int:
    if not runs.is_file():
        parser.error(f"--runtime-runs {runs} is not a file: name benchmarks/runtime_gpu.py's results")
    calibration = read_calibration(calibration_path) if calibration_path else None
    report = json.loads(runs.read_text())
    rows = [repredict_runtime(run, calibration) for run in report["runs"]
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
    out.write_text(json.dumps({"runs": rows, "source": str(runs.relative_to(ROOT) if runs.is_relative_to(ROOT)
                                                          else runs),
                               "topology": str(RUNTIME_TOPOLOGY.relative_to(ROOT)),
                               "calibration": calibration_path}, indent=1) + "\n")
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
