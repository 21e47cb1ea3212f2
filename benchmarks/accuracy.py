"""Accuracy of the cost model: plans executed by the runtime, predicted against measured.

    python benchmarks/accuracy.py emulated   # CPU: >= 12 plans over 3 topologies, network and devices emulated
    python benchmarks/accuracy.py gpu        # 2 CUDA GPUs: calibrate, then >= 6 plans on real hardware
    python benchmarks/accuracy.py gpu4       # 4 CUDA GPUs: every plan dimension and schedule (GPU4_CASES)

Each mode prints a table, writes ``accuracy_<mode>.json`` and keeps every run's ``results.json``
under ``benchmarks/results/accuracy_<mode>/`` (small JSON, so ``plan plot`` redraws the figures
without a GPU). Plans mix the planner's pick, the same with the other schedule, even layers and
batch on contiguous (Megatron's default) and random placements, and DTFM's objective; GPipe and
1F1B; even and uneven splits.
"""

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.report.accuracy import mean_absolute_percentage_error, memory_rows, rank_correlation, run_row  # noqa: E402
from planner.prediction.predict import predict  # noqa: E402
from planner.inputs.job import load_job  # noqa: E402
from planner.plan.document import plan_to_document
from planner.plan.document import write_plan  # noqa: E402
from planner.plan.plan import interleave_plan  # noqa: E402

EMULATED_TOPOLOGIES = ("topologies/emulated/dtfm-case5-mini.yaml", "topologies/emulated/two-datacenters-mini.yaml",
                       "topologies/emulated/home-mini.yaml")
GPU_TOPOLOGY = "topologies/local/h100-x2.yaml"
EMULATED_SECONDS = 3.0  # the planner's pick of each topology is emulated at about this many seconds per iteration


def _even_plans(job, seed: int) -> dict:
    """Even layers and batch on all devices: contiguous, random and DTFM-objective placements."""
    from planner.search.dtfm_plan import dtfm_degrees, dtfm_style_plan
    from planner.search.dtfm_search import contiguous_allocation, random_allocation

    topology, model, training = job.topology, job.model, job.training
    total = training.global_batch // training.micro_batch_size
    pairs = [(s, r) for s, r in dtfm_degrees(topology.size, model.layers) if total % r == 0 and 2 <= s <= 4]
    stages, replicas = pairs[0]
    n = topology.size
    rng = np.random.default_rng(seed)
    return {
        f"even-contiguous-{stages}x{replicas}-gpipe": dtfm_style_plan(
            topology, model, training, stages, replicas, contiguous_allocation(n, stages, replicas), schedule="gpipe"),
        f"even-random-{stages}x{replicas}-1f1b": dtfm_style_plan(
            topology, model, training, stages, replicas, random_allocation(n, stages, replicas, rng), schedule="1f1b"),
        f"even-dtfm-objective-{stages}x{replicas}-1f1b": dtfm_style_plan(
            topology, model, training, stages, replicas, seed=seed, schedule="1f1b"),
    }


def _write(plan, job, topology_path: str, path: Path, calibration=None) -> Path:
    if calibration is not None:
        from planner.inputs.calibration import calibration_record

        plan = replace(plan, calibration=calibration_record(calibration))
    plan = plan.with_prediction(predict(plan, job.topology, job.model, job.training)[0])
    path.parent.mkdir(parents=True, exist_ok=True)
    write_plan(plan_to_document(plan, model=job.model, training=job.training, topology_source=topology_path), path)
    return path


def emulated(out: Path, iterations: int, warmup: int, seed: int) -> dict:
    from planner.runtime.launch import LaunchOptions, launch
    from planner.search.front import SearchOptions, search

    rows, picks = [], {}
    for topology_path in EMULATED_TOPOLOGIES:
        job = load_job(ROOT / topology_path)
        name = job.topology.name
        result = search(job.topology, job.model, job.training, SearchOptions(seed=seed, time_limit_s=20))
        # The training the pick runs (precision and recompute resolved); sharding stays per plan.
        pick, job = result.plan, replace(job, training=replace(result.training, shard_optimizer="auto"))
        other = "gpipe" if pick.schedule == "1f1b" else "1f1b"
        plans = {f"planner-{pick.stages}x{pick.replicas}-{pick.schedule}": pick,
                 f"planner-{pick.stages}x{pick.replicas}-{other}": replace(pick, schedule=other)}
        layers, total = job.model.layers, sum(pick.micro_batches)
        if layers % pick.stages == 0 and total % pick.replicas == 0:
            even = replace(pick, layer_bounds=tuple(range(0, layers + 1, layers // pick.stages)),
                           micro_batches=(total // pick.replicas,) * pick.replicas)
            if (tuple(map(int, even.layer_bounds)), tuple(map(int, even.micro_batches))) != \
                    (tuple(map(int, pick.layer_bounds)), tuple(map(int, pick.micro_batches))):
                plans[f"planner-placement-even-split-{pick.schedule}"] = even
        plans.update(_even_plans(job, seed))
        plans = {label: (plan, job) for label, plan in plans.items()}
        # The plan space's dimensions on the pick: recomputation flipped, the optimizer state not sharded.
        flipped = not job.training.recompute
        plans[f"planner-recompute-{'on' if flipped else 'off'}"] = (
            pick, replace(job, training=replace(job.training, recompute=flipped)))
        if pick.replicas > 1:
            plans["planner-unsharded"] = (pick, replace(job, training=replace(job.training, shard_optimizer=False)))
        scale = EMULATED_SECONDS / predict(pick, job.topology, job.model, job.training)[0].iteration_s
        for label, (plan, run_job) in plans.items():
            path = _write(plan, run_job, topology_path, out / "plans" / f"{name}--{label}.yaml")
            run_dir = out / f"{name}--{label}"
            results = launch(path, LaunchOptions(iterations=iterations, warmup=warmup, out_dir=str(run_dir),
                                                 emulate=True, time_scale=scale, backend="gloo"), log=lambda s: None)
            row = run_row(results, f"{name}--{label}")
            row["planner_pick"] = label == next(iter(plans))
            row["fits"] = predict(plan, run_job.topology, run_job.model, run_job.training)[0].fits
            rows.append(row)
            print(f"{row['label']:58} predicted {row['predicted_s']:8.3f} s  measured {row['measured_s']:8.3f} s  "
                  f"{100 * row['error']:+6.1f}%", flush=True)
        ours = [r for r in rows if r["topology"] == name]
        fastest = min(r["measured_s"] for r in ours if r["fits"])
        pick_row = next(r for r in ours if r["planner_pick"])
        picks[name] = {"pick": pick_row["label"], "pick_measured_s": pick_row["measured_s"],
                       "fastest_measured_s": fastest, "pick_over_fastest": pick_row["measured_s"] / fastest - 1}
    return {"rows": rows, "picks": picks}


def gpu(out: Path, iterations: int, warmup: int, seed: int, only: tuple = ()) -> dict:
    """Calibrate, then run the GPU plans (``only``: just those labels, and the searches they need)."""
    from planner.inputs.calibration import apply_calibration, read_calibration
    from planner.runtime.calibrate import CalibrateOptions, calibrate
    from planner.runtime.launch import LaunchOptions, launch
    from planner.search.front import SearchOptions, search

    out.mkdir(parents=True, exist_ok=True)
    cal_path = out / "calibration.yaml"
    calibrate(ROOT / GPU_TOPOLOGY, CalibrateOptions(out=str(cal_path)), log=print)
    calibration = read_calibration(cal_path)
    base = load_job(ROOT / GPU_TOPOLOGY)
    job = replace(base, topology=apply_calibration(base.topology, calibration))
    plans = {}
    for stages, replicas, micro, schedule in ((2, 1, 2, "1f1b"), (2, 1, 1, "gpipe"), (1, 2, 2, "1f1b"),
                                              (2, 1, 4, "1f1b"), (1, 1, 2, "1f1b")):
        shape = f"{stages}x{replicas}-mb{micro}-{schedule}"
        if only and shape not in ("2x1-mb2-1f1b", "1x2-mb2-1f1b") and not any(l.startswith(shape) for l in only):
            continue  # the two kept shapes are the base of the variants below
        training = replace(job.training, micro_batch_size=micro, schedule=schedule)
        pinned = replace(job, training=training)
        plan = search(pinned.topology, pinned.model, training,
                      SearchOptions(seed=seed, time_limit_s=10, stages=stages, replicas=replicas)).plan
        plans[f"{stages}x{replicas}-mb{micro}-{schedule}"] = (plan, pinned)
    plan, pinned = plans["2x1-mb2-1f1b"]
    plans["2x1-mb2-1f1b-even-12-12"] = (replace(plan, layer_bounds=(0, 12, 24)), pinned)
    plan, pinned = plans["1x2-mb2-1f1b"]
    plans["1x2-mb2-1f1b-uneven-batch-6-2"] = (replace(plan, micro_batches=(6, 2)), pinned)
    # The plan space's dimensions: the optimizer state sharded (the default above) or not, fp16.
    plans["1x2-mb2-1f1b-unsharded"] = (plan, replace(pinned, training=replace(pinned.training, shard_optimizer=False)))
    plans["1x2-mb2-1f1b-fp16"] = (plan, replace(pinned, training=replace(pinned.training, precision="fp16")))
    plan, pinned = plans["2x1-mb2-1f1b"]
    plans["2x1-mb2-1f1b-fp16"] = (plan, replace(pinned, training=replace(pinned.training, precision="fp16")))
    plans["2x1-mb2-1f1b-recompute"] = (plan, replace(pinned, training=replace(pinned.training, recompute=True)))
    plan, pinned = plans["1x2-mb2-1f1b"]
    plans["1x2-mb2-1f1b-recompute"] = (plan, replace(pinned, training=replace(pinned.training, recompute=True)))
    # Interleaved 1F1B: the 2-stage plan's layers, each stage's in two chunks (compiled per chunk).
    interleaved = replace(pinned, training=replace(pinned.training, virtual_stages=2))
    plans["2x1-mb2-1f1b-interleaved-v2"] = (interleave_plan(plan, 2), interleaved)
    calibrations = dict.fromkeys(plans, calibration)
    if not only or "2x1-mb2-zb-h1" in only:
        # zb-h1 runs eager (its backward is split at the linear layers): calibrated on eager blocks.
        eager_path = out / "calibration-eager.yaml"
        calibrate(ROOT / GPU_TOPOLOGY, CalibrateOptions(out=str(eager_path), compile="off"), log=print)
        eager = read_calibration(eager_path)
        eager_job = replace(base, topology=apply_calibration(base.topology, eager))
        training = replace(eager_job.training, micro_batch_size=2, schedule="zb-h1")
        pinned = replace(eager_job, training=training)
        plans["2x1-mb2-zb-h1"] = (search(pinned.topology, pinned.model, training,
                                         SearchOptions(seed=seed, time_limit_s=10, stages=2, replicas=1)).plan, pinned)
        calibrations["2x1-mb2-zb-h1"] = eager
    rows, memory = [], []
    for label, (plan, pinned) in plans.items():
        if only and label not in only:
            continue
        path = _write(plan, pinned, GPU_TOPOLOGY, out / "plans" / f"{label}.yaml", calibrations[label])
        results = launch(path, LaunchOptions(iterations=iterations, warmup=warmup, out_dir=str(out / label)),
                         log=lambda s: None)
        row = run_row(results, label)
        rows.append(row)
        for device, predicted, measured in memory_rows(results):
            memory.append({"run": label, "device": device, "predicted_bytes": predicted, "measured_bytes": measured,
                           "error": (predicted - measured) / measured})
        print(f"{label:34} predicted {row['predicted_s']:.4f} s  measured {row['measured_s']:.4f} s  "
              f"{100 * row['error']:+6.1f}%", flush=True)
    eager = calibrations.get("2x1-mb2-zb-h1")
    return {"rows": rows, "memory": memory, "device": results["run"]["device_name"],
            "calibration": calibration.document, "calibration_eager": eager.document if eager else None}


GPU4_TOPOLOGY = "topologies/local/h100-x4.yaml"
# label: (stages, replicas, schedule, tensor degrees, training overrides, eager). Eager runs (ZB-H1
# split at its linear layers, tensor groups) are predicted with a calibration of eager blocks.
GPU4_CASES = {
    "4x1-mb2-1f1b": (4, 1, "1f1b", (1,), {}, False),
    "4x1-mb2-gpipe": (4, 1, "gpipe", (1,), {}, False),
    "4x1-mb2-zb-h1": (4, 1, "zb-h1", (1,), {}, True),
    "4x1-mb2-zb-h1-compiled-between": (4, 1, "zb-h1", (1,), {}, False),
    "2x2-mb2-1f1b": (2, 2, "1f1b", (1,), {}, False),
    "1x4-mb2-1f1b-sharded": (1, 4, "1f1b", (1,), {"shard_optimizer": True}, False),
    "1x4-mb2-1f1b-unsharded": (1, 4, "1f1b", (1,), {"shard_optimizer": False}, False),
    "4x1-mb2-1f1b-fp16": (4, 1, "1f1b", (1,), {"precision": "fp16"}, False),
    "4x1-mb2-1f1b-recompute": (4, 1, "1f1b", (1,), {"recompute": True}, False),
    "1x1-mb2-tensor-4": (1, 1, "1f1b", (4,), {}, True),
    "2x1-mb2-tensor-2": (2, 1, "1f1b", (2,), {}, True),
    # A member of a group of t runs 1/t of each matrix product: at micro-batch 2 the launches, not
    # the GPUs, set the pace; at t times the micro-batch each member's products are the plain ones'.
    "1x1-mb8-tensor-4": (1, 1, "1f1b", (4,), {"micro_batch_size": 8}, False),
    "2x1-mb4-tensor-2": (2, 1, "1f1b", (2,), {"micro_batch_size": 4}, False),
    "4x1-mb2-1f1b-interleaved-v2": (4, 1, "1f1b", (1,), {"virtual_stages": 2}, False),
}

# The 4-stage runs as ``plan launch`` runs each schedule by default (compiled; ZB-H1 between its linears).
GPU4_SCHEDULE_ROWS = ("4x1-mb2-1f1b", "4x1-mb2-gpipe", "4x1-mb2-zb-h1-compiled-between", "4x1-mb2-1f1b-interleaved-v2")


def _calibrated(topology_path: str, path: Path, compile: str):
    """The calibration at ``path`` (measured there first unless a previous run left it) and the
    topology's job with it applied."""
    from planner.inputs.calibration import apply_calibration, read_calibration
    from planner.runtime.calibrate import CalibrateOptions, calibrate

    if not path.exists():
        calibrate(ROOT / topology_path, CalibrateOptions(out=str(path), compile=compile), log=print)
    calibration = read_calibration(path)
    base = load_job(ROOT / topology_path)
    return calibration, replace(base, topology=apply_calibration(base.topology, calibration))


def gpu4(out: Path, iterations: int, warmup: int, seed: int, only: tuple = ()) -> dict:
    """Calibrate (compiled and eager blocks), then run ``GPU4_CASES`` on 4 GPUs; rows of an earlier
    run in ``out`` are kept unless rerun (``only``), so the cases can be split over several calls;
    then the schedule ``schedule: auto`` picks for 4 stages against the fastest measured one."""
    from planner.runtime.launch import LaunchOptions, launch
    from planner.search.front import SearchOptions, search

    out.mkdir(parents=True, exist_ok=True)
    compiled, compiled_job = _calibrated(GPU4_TOPOLOGY, out / "calibration.yaml", "auto")
    cases = {label: case for label, case in GPU4_CASES.items() if not only or label in only}
    eager, eager_job = _calibrated(GPU4_TOPOLOGY, out / "calibration-eager.yaml", "off") \
        if any(case[-1] for case in cases.values()) else (None, None)
    partial = out / "partial.json"
    report = json.loads(partial.read_text()) if partial.exists() else {"rows": [], "memory": []}
    for label, (stages, replicas, schedule, tensor, overrides, is_eager) in cases.items():
        job = eager_job if is_eager else compiled_job
        training = replace(job.training, **{"micro_batch_size": 2, "schedule": schedule, **overrides})
        pinned = replace(job, training=training)
        # The search plans one chunk per device; an interleaved case splits its stages after.
        plan = search(pinned.topology, pinned.model, replace(training, virtual_stages=1),
                      SearchOptions(seed=seed, time_limit_s=10, stages=stages, replicas=replicas,
                                    tensor_degrees=tensor)).plan
        if training.virtual_stages > 1:
            plan = interleave_plan(plan, training.virtual_stages)
        path = _write(plan, pinned, GPU4_TOPOLOGY, out / "plans" / f"{label}.yaml", eager if is_eager else compiled)
        results = launch(path, LaunchOptions(iterations=iterations, warmup=warmup, out_dir=str(out / label),
                                             compile="off" if is_eager else "auto"), log=lambda s: None)
        row = {**run_row(results, label), "compiled": results["run"].get("compiled")}
        report["rows"] = [r for r in report["rows"] if r["label"] != label] + [row]
        report["memory"] = [m for m in report["memory"] if m["run"] != label] + [
            {"run": label, "device": device, "predicted_bytes": predicted, "measured_bytes": measured,
             "error": (predicted - measured) / measured} for device, predicted, measured in memory_rows(results)]
        report["device"] = results["run"]["device_name"]
        partial.write_text(json.dumps(report, indent=1, default=float) + "\n")
        print(f"{label:34} predicted {row['predicted_s']:.4f} s  measured {row['measured_s']:.4f} s  "
              f"{100 * row['error']:+6.1f}%", flush=True)
    # Which schedule auto picks for 4 stages on the compiled calibration, against the measurements.
    training = replace(compiled_job.training, micro_batch_size=2, schedule="auto")
    pick = search(compiled_job.topology, compiled_job.model, training,
                  SearchOptions(seed=seed, time_limit_s=10, stages=4, replicas=1, tensor_degrees=(1,))).plan
    four = [r for r in report["rows"] if r["label"] in GPU4_SCHEDULE_ROWS]
    if four:
        fastest = min(four, key=lambda r: r["measured_s"])
        report["schedule_pick"] = {"auto_picks": str(pick.schedule), "fastest_measured": fastest["label"],
                                   "measured_s": {r["label"]: r["measured_s"] for r in four}}
    report["calibration"] = compiled.document
    if eager is not None:
        report["calibration_eager"] = eager.document
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description="Predicted vs measured iteration time of executed plans.")
    parser.add_argument("mode", choices=["emulated", "gpu", "gpu4"])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", nargs="+", default=(), metavar="LABEL", help="gpu: run only these plans")
    args = parser.parse_args()
    out = Path(args.out)
    runs = out / f"accuracy_{args.mode}"
    if args.mode == "gpu":
        report = gpu(runs, args.iterations, args.warmup, args.seed, tuple(args.only))
    elif args.mode == "gpu4":
        report = gpu4(runs, args.iterations, args.warmup, args.seed, tuple(args.only))
    else:
        report = emulated(runs, args.iterations, args.warmup, args.seed)
    rows = report["rows"]
    predicted, measured = [r["predicted_s"] for r in rows], [r["measured_s"] for r in rows]
    report["summary"] = {"runs": len(rows), "mape": mean_absolute_percentage_error(predicted, measured),
                         "max_abs_error": max(abs(r["error"]) for r in rows),
                         "spearman": rank_correlation(predicted, measured)}
    if report.get("memory"):
        report["summary"]["memory_max_abs_error"] = max(abs(m["error"]) for m in report["memory"])
    print(f"\n{'run':58} {'predicted s':>11} {'measured s':>10} {'error':>7}  fits in memory")
    for r in rows:
        print(f"{r['label']:58} {r['predicted_s']:11.4f} {r['measured_s']:10.4f} {100 * r['error']:+6.1f}%  "
              f"{'yes' if r.get('fits', True) else 'no'}")
    s = report["summary"]
    print(f"\n{s['runs']} runs: MAPE {100 * s['mape']:.2f}%, max |error| {100 * s['max_abs_error']:.2f}%, "
          f"Spearman {s['spearman']:.3f}")
    for name, p in report.get("picks", {}).items():
        print(f"{name}: planner's pick {p['pick']} measured {100 * p['pick_over_fastest']:+.1f}% vs the fastest "
              "plan that fits in memory")
    if "schedule_pick" in report:
        p = report["schedule_pick"]
        print(f"4 stages: schedule auto picks {p['auto_picks']}; fastest measured {p['fastest_measured']}")
    for m in report.get("memory", []):
        print(f"memory {m['run']:34} {m['device']:8} predicted {m['predicted_bytes'] / 1e9:6.2f} GB "
              f"measured {m['measured_bytes'] / 1e9:6.2f} GB {100 * m['error']:+6.1f}%")
    (out / f"accuracy_{args.mode}.json").write_text(json.dumps(report, indent=1, default=float) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
