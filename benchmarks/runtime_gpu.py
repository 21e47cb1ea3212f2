"""The runtime on real GPUs: the committed 2-GPU plans, measured against their prediction, and our
runtime against torch.distributed.pipelining on the same split, with a fused Adam and each of two
precision recipes (the runtime's own bf16 weights with fp32 masters, and fp32 weights under autocast).

Run on a host with 2 (or 4, with ``--gpus 4``) CUDA GPUs, from the repository root:

    python benchmarks/runtime_gpu.py --out benchmarks/results [--gpus 4]

Prints a table and writes ``runtime_gpu.json`` (``runtime_gpu_x4.json`` with 4 GPUs; and each run's
results folder) under ``--out``. The comparison with pipelining uses the pipeline plan's split.
"""

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PLANS = {2: {"pipeline (2 stages)": "benchmarks/plans/h100x2-pipeline.yaml",
             "pipeline, zb-h1 (2 stages)": "benchmarks/plans/h100x2-zero-bubble.yaml",
             "pipeline, zb-h1 warm-up depth 2 (2 stages)": "benchmarks/plans/h100x2-zero-bubble-depth-2.yaml",
             "pipeline, warm-up depth 3 (2 stages)": "benchmarks/plans/h100x2-warmup-depth-3.yaml",
             "pipeline, interleaved (2x2)": "benchmarks/plans/h100x2-interleaved.yaml",
             "pipeline, interleaved (2x4)": "benchmarks/plans/h100x2-interleaved-v4.yaml",
             "data parallel (2 replicas)": "benchmarks/plans/h100x2-data-parallel.yaml",
             "tensor parallel (degree 2)": "benchmarks/plans/h100x2-tensor.yaml"},
         4: {"pipeline (4 stages)": "benchmarks/plans/h100x4-pipeline.yaml",
             "pipeline, zb-h1 (4 stages)": "benchmarks/plans/h100x4-zero-bubble.yaml",
             "pipeline, interleaved (4x2)": "benchmarks/plans/h100x4-interleaved.yaml",
             "data parallel (4 replicas)": "benchmarks/plans/h100x4-data-parallel.yaml",
             "tensor parallel (degree 4)": "benchmarks/plans/h100x4-tensor.yaml",
             "2 stages x tensor 2": "benchmarks/plans/h100x4-pipeline-tensor.yaml",
             "tensor parallel (degree 4), micro-batch 8": "benchmarks/plans/h100x4-tensor-mb8.yaml",
             "2 stages x tensor 2, micro-batch 4": "benchmarks/plans/h100x4-pipeline-tensor-mb4.yaml"}}
# Our runtime against pipelining on the pipeline plan's split: (schedule, compiled). torch ships no
# ZB-H1 for one stage per rank, so zb-h1 is set against pipelining's 1F1B (compiled: both compiled).
# ``interleaved`` runs the interleaved plan's pieces, ours and ``ScheduleInterleaved1F1B``;
# ``zb-h1-depth-2`` ours at warm-up depth 2 (``cost_models.schedule.stage_ops``), against 1F1B too.
COMPARISONS = ("1f1b:eager", "1f1b:compiled", "gpipe:compiled", "zb-h1:eager", "zb-h1:compiled",
               "zb-h1-depth-2:compiled", "interleaved:compiled")


def _schedule_depth(name: str) -> tuple:
    """(schedule, warm-up depth) of a comparison's schedule: ``zb-h1-depth-2`` is (zb-h1, 2)."""
    schedule, _, depth = name.partition("-depth-")
    return schedule, int(depth or 1)


def _untied_copy(plan_path: str, folder: Path, schedule: str, depth: int = 1) -> Path:
    """The same split with an untied head, ``schedule`` and warm-up ``depth`` (pipelining cannot split
    a tied embedding)."""
    import yaml

    document = yaml.safe_load(Path(plan_path).read_text())
    document["model"]["tied_embeddings"] = False
    document["schedule"] = schedule
    document["training"]["schedule"] = schedule
    document["warmup_depth"] = document["training"]["warmup_depth"] = depth
    document.pop("prediction", None)
    path = folder / f"untied-{Path(plan_path).stem}-{schedule}{f'-depth-{depth}' if depth > 1 else ''}.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def main() -> int:
    import torch

    from planner.inputs.model import parse_model
    from planner.report.accuracy import prediction_error
    from planner.runtime.launch import LaunchOptions, launch
    from planner.runtime.reference import PIPELINING_RECIPES, run_pipelining

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--gpus", type=int, choices=sorted(PLANS), default=2)
    parser.add_argument("--plans", nargs="+", choices=[p for plans in PLANS.values() for p in plans],
                        help="default: every plan of --gpus")
    parser.add_argument("--comparisons", nargs="*", choices=COMPARISONS, default=list(COMPARISONS))
    args = parser.parse_args()
    plans = PLANS[args.gpus]
    args.plans = args.plans or list(plans)
    if any(p not in plans for p in args.plans):
        print(f"--plans: {', '.join(p for p in args.plans if p not in plans)} not a plan for --gpus {args.gpus}",
              file=sys.stderr)
        return 2
    if torch.cuda.device_count() < args.gpus:
        print(f"needs {args.gpus} CUDA GPUs", file=sys.stderr)
        return 2
    out = Path(args.out)
    runs = out / ("runtime_gpu_runs" if args.gpus == 2 else f"runtime_gpu_runs_x{args.gpus}")
    runs.mkdir(parents=True, exist_ok=True)
    rows = []
    for label in args.plans:
        plan = plans[label]
        name = Path(plan).stem
        r = launch(ROOT / plan, LaunchOptions(iterations=args.iterations, warmup=args.warmup,
                                              out_dir=str(runs / name)), log=print)
        m, p = r["measured"], r["predicted"]
        rows.append({"plan": label, "file": plan, "measured_s": m["median_s"], "p10_s": m["p10_s"], "p90_s": m["p90_s"],
                     "predicted_s": p["iteration_s"],
                     "error": prediction_error(r["comparison"]["predicted_s"], r["comparison"]["measured_s"]),
                     "tokens_per_s": m["tokens_per_s"], "mfu": m["mfu"],
                     "peak_memory_gb": {d: b / 1e9 for d, b in m["peak_memory_bytes"].items()},
                     "predicted_memory_gb": {d: b / 1e9 for d, b in p["memory_bytes"].items()},
                     "device": r["run"]["device_name"], "torch": r["run"]["torch"]})
        print(f"{label}: {m['median_s']:.4f} s, MFU {100 * m['mfu']:.1f}%, predicted {p['iteration_s']:.4f} s",
              flush=True)
        _write(out, rows, [], args)
    comparison = []
    for name, compiled in (c.split(":") for c in args.comparisons):
        compiled = compiled == "compiled"
        interleaved = name == "interleaved"
        schedule, depth = _schedule_depth(name)
        source = next(p for label, p in plans.items() if "interleaved" in label) if interleaved \
            else plans[f"pipeline ({args.gpus} stages)"]
        plan = _untied_copy(source, runs, "1f1b" if interleaved else schedule, depth)
        label = f"{name}{', compiled' if compiled else ''}"
        ours = launch(plan, LaunchOptions(iterations=args.iterations, warmup=args.warmup,
                                          compile="on" if compiled else "off",
                                          out_dir=str(runs / f"ours-{name}{'-compiled' if compiled else ''}")),
                      log=print)
        document = json.loads(json.dumps(ours["plan"]))
        spec = parse_model(document["model"])
        v = document.get("virtual_stages", 1)
        pieces = sorted((c["chunk"] * len(document["stages"]) + s["index"], c["layers"])
                        for s in document["stages"] for c in (s.get("chunks") or [{"chunk": 0, "layers": s["layers"]}]))
        bounds = [layers[0] for _, layers in pieces] + [pieces[-1][1][1]]
        row = {"schedule": name, "compiled": compiled, "ours_s": ours["measured"]["median_s"],
               "ours_mfu": ours["measured"]["mfu"]}
        # The autocast recipe only eager: compiled, its fp32 weights cast in every block.
        for recipe in PIPELINING_RECIPES if not compiled else PIPELINING_RECIPES[:1]:
            _, theirs = run_pipelining(spec, bounds, micro_batch_size=document["micro_batch_size"],
                                       micro_batches=document["replicas"][0]["micro_batches"],
                                       schedule="1f1b" if schedule in ("zb-h1", "interleaved") else schedule,
                                       virtual_stages=v,
                                       iterations=args.iterations, warmup=args.warmup, backend="nccl",
                                       optimizer=document["training"]["optimizer"], recipe=recipe, compile=compiled)
            seconds = statistics.median(theirs)
            row[recipe] = {"pipelining_s": seconds, "mfu": ours["measured"]["mfu"] * row["ours_s"] / seconds,
                           "speedup": seconds / row["ours_s"]}
        comparison.append(row)
        print(label, json.dumps(row), flush=True)
        _write(out, rows, comparison, args)
    print(f"\n{'plan':28} {'measured s':>10} {'p10-p90':>15} {'predicted s':>11} {'error':>7} "
          f"{'tokens/s':>9} {'MFU':>6}  peak memory GB (predicted)")
    for row in rows:
        memory = ", ".join(f"{d} {row['peak_memory_gb'][d]:.1f} ({row['predicted_memory_gb'][d]:.1f})"
                           for d in sorted(row["peak_memory_gb"]))
        print(f"{row['plan']:28} {row['measured_s']:10.4f} {row['p10_s']:7.4f}-{row['p90_s']:7.4f} "
              f"{row['predicted_s']:11.4f} {100 * row['error']:+6.1f}% {row['tokens_per_s']:9.0f} "
              f"{100 * row['mfu']:5.1f}%  {memory}")
    print("\nsame split, untied head; torch.distributed.pipelining with a fused Adam in two precision recipes "
          "(bf16-master: ours; autocast: fp32 weights under bf16 autocast); both runtimes eager or both compiled")
    print(f"{'schedule':28} {'ours s':>8} {'MFU':>6} " + " ".join(f"{r + ' s':>16} {'MFU':>6} {'speedup':>8}"
                                                           for r in PIPELINING_RECIPES))
    for row in comparison:
        cells = [f"{row[r]['pipelining_s']:16.4f} {100 * row[r]['mfu']:5.1f}% {row[r]['speedup']:8.3f}"
                 if r in row else f"{'-':>16} {'':6} {'':8}" for r in PIPELINING_RECIPES]
        label = f"{row['schedule']}{', compiled' if row['compiled'] else ', eager'}"
        label += " (vs 1f1b)" if row["schedule"].startswith("zb-h1") else ""
        print(f"{label:28} {row['ours_s']:8.4f} {100 * row['ours_mfu']:5.1f}% " + " ".join(cells))
    _write(out, rows, comparison, args)
    return 0


def _write(out: Path, rows: list, comparison: list, args) -> None:
    """``runtime_gpu.json`` as it stands (rewritten after every run, so a cut run keeps what it measured)."""
    (out / ("runtime_gpu.json" if args.gpus == 2 else f"runtime_gpu_x{args.gpus}.json")).write_text(json.dumps({"runs": rows, "versus_pipelining": comparison,
                                                      "iterations": args.iterations, "warmup": args.warmup,
                                                      "gpus": args.gpus,
                                                      "env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE",)}},
                                                     indent=1) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
