"""Benchmark 2: shipped topologies under the full cost model (event simulator).

Our search against the best DTFM-style plan (all devices, even layers, even batch, allocation found
under DTFM's objective, GPipe or 1F1B, every valid degree pair) and against contiguous placement
with even splits. Prints a table and writes ``benchmarks/results/full_cost.json``.

    python benchmarks/full_cost.py [--seed 0] [--time-limit 30]
"""

import argparse
import json
import platform
import time
from pathlib import Path

from planner.inputs.job import load_job
from planner.search.dtfm_plan import best_dtfm_style_plan, dtfm_degrees, dtfm_style_plan
from planner.search.dtfm_search import contiguous_allocation
from planner.search.front import SearchOptions, search

ROOT = Path(__file__).resolve().parent.parent


def _contiguous(job):
    best = None
    micro = job.training.micro_batch_size or 1
    for stages, replicas in dtfm_degrees(job.topology.size, job.model.layers):
        if (job.training.global_batch // micro) % replicas:
            continue
        groups = contiguous_allocation(job.topology.size, stages, replicas)
        plan = dtfm_style_plan(job.topology, job.model, job.training, stages, replicas, groups, schedule="1f1b")
        if plan.prediction.fits and (best is None or plan.prediction.iteration_s < best):
            best = plan.prediction.iteration_s
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-limit", type=float, default=30.0)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "full_cost.json"))
    args = parser.parse_args()
    paths = sorted((ROOT / "topologies" / "dtfm").glob("*.yaml")) + sorted((ROOT / "topologies" / "hetero").glob("*.yaml"))
    header = f"{'topology':<36} {'ours s':>9} {'S x D':>7} {'wall':>6} {'gap':>6} {'DTFM-style s':>13} {'speed-up':>9} " \
             f"{'contig s':>9}"
    print(header)
    print("-" * len(header))
    rows = []
    for path in paths:
        job = load_job(path)
        result = search(job.topology, job.model, job.training, SearchOptions(seed=args.seed, time_limit_s=args.time_limit))
        dtfm = best_dtfm_style_plan(job.topology, job.model, job.training, seed=args.seed)
        dtfm_s = dtfm.prediction.iteration_s if dtfm else None
        contiguous_s = _contiguous(job)
        plan = result.plan
        row = {"topology": path.stem, "ours_s": result.predicted_s, "stages": plan.stages, "replicas": plan.replicas,
               "idle": len(plan.idle), "wall_s": result.wall_s, "lower_bound_s": result.lower_bound_s,
               "gap": result.gap, "dtfm_style_s": dtfm_s, "contiguous_s": contiguous_s,
               "speedup_vs_dtfm_style": (dtfm_s / result.predicted_s) if dtfm_s else None}
        rows.append(row)
        fmt = lambda v: f"{v:9.2f}" if v is not None else f"{'no fit':>9}"
        speed = f"{row['speedup_vs_dtfm_style']:8.2f}x" if dtfm_s else f"{'-':>9}"
        print(f"{path.stem:<36} {result.predicted_s:9.2f} {plan.stages:>3}x{plan.replicas:<3} {result.wall_s:5.1f}s "
              f"{100 * result.gap:5.1f}% {fmt(dtfm_s):>13} {speed} {fmt(contiguous_s)}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"machine": platform.platform(), "seed": args.seed,
                                          "date": time.strftime("%Y-%m-%d"), "rows": rows}, indent=2) + "\n")
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
