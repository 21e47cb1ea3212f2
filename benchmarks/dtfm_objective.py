"""Benchmark 1: DTFM's five cases under DTFM's own objective and constants.

Ours (constructive + local search) against the GCMA re-implementation, random allocation (mean of
20 seeds) and contiguous allocation, on the same machine in the same run, with CP-SAT's lower bound
on DTFM's objective (``planner.search.cpsat_dtfm``, ``--cpsat-seconds`` per case, hinted with ours).
Then ``--small`` random instances of 6-12 devices (every device used, both degrees >= 2), where
CP-SAT proves the optimum: how often ours and GCMA reach it. Prints tables and writes
``benchmarks/results/dtfm_objective.json``.

    python benchmarks/dtfm_objective.py [--trials 4900] [--seed 0] [--cpsat-seconds 60] [--small 30]
"""

import argparse
import json
import platform
import time
from pathlib import Path

import sys

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the random instances of the tests

from cost_models.dtfm import dtfm_cost  # noqa: E402
from planner.inputs.job import load_job  # noqa: E402
from planner.search.cpsat_dtfm import exact_dtfm_allocation  # noqa: E402
from planner.search.dtfm_search import contiguous_allocation, dtfm_search, gcma, random_allocation  # noqa: E402
from tests.instances import random_small_topology  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=4900, help="GCMA's steady-state trials (DTFM: 4,900)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cpsat-seconds", type=float, default=60.0, help="CP-SAT time per case (bound)")
    parser.add_argument("--small", type=int, default=30, help="random small instances solved to optimality")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "dtfm_objective.json"))
    args = parser.parse_args()
    rows = []
    header = f"{'case':<28} {'ours s':>9} {'ours wall':>10} {'GCMA s':>9} {'GCMA wall':>10} {'wall %':>7} " \
             f"{'random s':>9} {'contig s':>9} {'CP-SAT bound':>13} {'ours gap':>9}"
    print(header)
    print("-" * len(header))
    for path in sorted((ROOT / "topologies" / "dtfm").glob("case*.yaml")):
        topology = load_job(path).topology
        lat, bw = topology.network.latency_s, topology.network.bandwidth_bytes_per_s
        ours = dtfm_search(topology, 8, 8, seed=args.seed)
        base = gcma(topology, 8, 8, seed=args.seed, trials=args.trials)
        rng = np.random.default_rng(args.seed)
        random_costs = [dtfm_cost(lat, bw, random_allocation(64, 8, 8, rng)).total_s for _ in range(20)]
        contiguous = dtfm_cost(lat, bw, contiguous_allocation(64, 8, 8)).total_s
        exact = exact_dtfm_allocation(topology, 8, 8, time_limit_s=args.cpsat_seconds, hint=ours.groups, workers=2)
        row = {"case": path.stem, "ours_s": ours.cost_s, "ours_wall_s": ours.wall_s, "ours_evaluations": ours.evaluations,
               "gcma_s": base.cost_s, "gcma_wall_s": base.wall_s, "gcma_evaluations": base.evaluations,
               "wall_fraction": ours.wall_s / base.wall_s, "random_mean_s": float(np.mean(random_costs)),
               "contiguous_s": contiguous, "cpsat_status": exact.status, "cpsat_s": exact.cost_s,
               "cpsat_bound_s": exact.bound_s, "ours_gap": 1 - exact.bound_s / ours.cost_s}
        rows.append(row)
        print(f"{path.stem:<28} {ours.cost_s:9.3f} {ours.wall_s:9.2f}s {base.cost_s:9.3f} {base.wall_s:9.1f}s "
              f"{100 * row['wall_fraction']:6.2f}% {row['random_mean_s']:9.3f} {contiguous:9.3f} "
              f"{exact.bound_s:13.3f} {100 * row['ours_gap']:8.1f}%")
    small = _small_instances(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"machine": platform.platform(), "processor": platform.processor(),
                                          "trials": args.trials, "seed": args.seed, "date": time.strftime("%Y-%m-%d"),
                                          "rows": rows, "small": small}, indent=2) + "\n")
    print(f"\nwritten to {args.out}")


def _small_instances(args) -> list:
    """Random instances of 6-12 devices, every device used, both degrees >= 2: ours and GCMA against
    CP-SAT's proven optimum."""
    rng = np.random.default_rng(args.seed)
    rows = []
    while len(rows) < args.small:
        topology, _, _ = random_small_topology(rng, 12)
        n = topology.size
        pairs = [(s, n // s) for s in range(2, n // 2 + 1) if n % s == 0 and n // s >= 2]
        if n < 6 or not pairs:
            continue
        stages, replicas = pairs[int(rng.integers(len(pairs)))]
        ours = dtfm_search(topology, stages, replicas, seed=args.seed)
        base = gcma(topology, stages, replicas, seed=args.seed, trials=args.trials)
        exact = exact_dtfm_allocation(topology, stages, replicas, time_limit_s=args.cpsat_seconds, workers=2)
        if exact.status != "optimal":
            continue
        rows.append({"devices": n, "stages": stages, "replicas": replicas, "ours_s": ours.cost_s,
                     "ours_wall_s": ours.wall_s, "gcma_s": base.cost_s, "gcma_wall_s": base.wall_s,
                     "optimum_s": exact.cost_s, "cpsat_wall_s": exact.wall_s})
    print(f"\n{len(rows)} random instances of 6-12 devices, CP-SAT's proven optimum of DTFM's objective:")
    for name in ("ours", "gcma"):
        hits = sum(r[f"{name}_s"] <= r["optimum_s"] * (1 + 1e-7) for r in rows)
        worst = max(r[f"{name}_s"] / r["optimum_s"] - 1 for r in rows)
        wall = np.median([r[f"{name}_wall_s"] for r in rows])
        print(f"  {'ours' if name == 'ours' else 'GCMA':<5} optimal in {hits}/{len(rows)}, worst excess "
              f"{100 * worst:.2f}%, median wall {wall:.2f} s")
    print(f"  CP-SAT median wall {np.median([r['cpsat_wall_s'] for r in rows]):.2f} s")
    return rows


if __name__ == "__main__":
    main()
