"""Benchmark 1: DTFM's five cases under DTFM's own objective and constants.

Ours (constructive + local search) against the GCMA re-implementation, random allocation (mean of
20 seeds) and contiguous allocation, on the same machine in the same run. Prints a table and writes
``benchmarks/results/dtfm_objective.json``.

    python benchmarks/dtfm_objective.py [--trials 4900] [--seed 0]
"""

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np

from cost_models.dtfm import dtfm_cost
from planner.job import load_job
from planner.search.dtfm_search import contiguous_allocation, dtfm_search, gcma, random_allocation

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=4900, help="GCMA's steady-state trials (DTFM: 4,900)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "dtfm_objective.json"))
    args = parser.parse_args()
    rows = []
    header = f"{'case':<28} {'ours s':>9} {'ours wall':>10} {'GCMA s':>9} {'GCMA wall':>10} {'wall %':>7} " \
             f"{'random s':>9} {'contig s':>9}"
    print(header)
    print("-" * len(header))
    for path in sorted((ROOT / "topologies" / "dtfm").glob("case*.yaml")):
        topology = load_job(path).topology
        lat, bw = topology.latency_s, topology.bandwidth_bytes_per_s
        ours = dtfm_search(topology, 8, 8, seed=args.seed)
        base = gcma(topology, 8, 8, seed=args.seed, trials=args.trials)
        rng = np.random.default_rng(args.seed)
        random_costs = [dtfm_cost(lat, bw, random_allocation(64, 8, 8, rng)).total_s for _ in range(20)]
        contiguous = dtfm_cost(lat, bw, contiguous_allocation(64, 8, 8)).total_s
        row = {"case": path.stem, "ours_s": ours.cost_s, "ours_wall_s": ours.wall_s, "ours_evaluations": ours.evaluations,
               "gcma_s": base.cost_s, "gcma_wall_s": base.wall_s, "gcma_evaluations": base.evaluations,
               "wall_fraction": ours.wall_s / base.wall_s, "random_mean_s": float(np.mean(random_costs)),
               "contiguous_s": contiguous}
        rows.append(row)
        print(f"{path.stem:<28} {ours.cost_s:9.3f} {ours.wall_s:9.2f}s {base.cost_s:9.3f} {base.wall_s:9.1f}s "
              f"{100 * row['wall_fraction']:6.2f}% {row['random_mean_s']:9.3f} {contiguous:9.3f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"machine": platform.platform(), "processor": platform.processor(),
                                          "trials": args.trials, "seed": args.seed, "date": time.strftime("%Y-%m-%d"),
                                          "rows": rows}, indent=2) + "\n")
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
