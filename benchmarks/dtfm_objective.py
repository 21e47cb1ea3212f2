"""Benchmark 1: DTFM's five cases under DTFM's own objective and constants.

Ours (constructive starts, structural local search, CP-SAT's class model, ``--time-limit`` seconds
per case) against the GCMA re-implementation, random allocation (mean of 20 seeds) and contiguous
allocation, on the same machine in the same run. Bounds: the one our search reports with its
answer, and CP-SAT's class model run ``--cpsat-seconds`` per case on 2 workers, hinted with ours
(``planner.search.cpsat_dtfm``). ``before``: our cost in the results file this run replaces (or
``--before``). Then ``--small`` random instances of 6-12 devices (every device used, both degrees
>= 2), where CP-SAT proves the optimum: how often ours and GCMA reach it. Prints tables and writes
``benchmarks/results/dtfm_objective.json``.

    python benchmarks/dtfm_objective.py [--time-limit 3] [--trials 4900] [--seed 0] [--cpsat-seconds 60]
                                        [--small 30] [--before FILE]
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
from planner.search.cpsat_dtfm import class_dtfm_allocation, exact_dtfm_allocation  # noqa: E402
from planner.search.dtfm_search import contiguous_allocation, dtfm_search, gcma, random_allocation  # noqa: E402
from tests.instances import random_small_topology  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=4900, help="GCMA's steady-state trials (DTFM: 4,900)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cpsat-seconds", type=float, default=60.0, help="CP-SAT time per case (bound)")
    parser.add_argument("--small", type=int, default=30, help="random small instances solved to optimality")
    parser.add_argument("--time-limit", type=float, default=3.0, help="our search's time limit per case (s)")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "dtfm_objective.json"))
    parser.add_argument("--before", help="an earlier results file whose 'ours' is the before column "
                                         "(default: the file this run replaces)")
    args = parser.parse_args()
    before_path = Path(args.before or args.out)
    before = {r["case"]: r["ours_s"] for r in json.loads(before_path.read_text())["rows"]} \
        if before_path.exists() else {}
    rows = []
    header = f"{'case':<28} {'before s':>9} {'ours s':>9} {'ours wall':>10} {'bound':>9} {'status':>9} " \
             f"{'GCMA s':>9} {'GCMA wall':>10} {'random s':>9} {'contig s':>9} {'CP-SAT bnd':>11} {'ours gap':>9}"
    print(header)
    print("-" * len(header))
    for path in sorted((ROOT / "topologies" / "dtfm").glob("case*.yaml")):
        topology = load_job(path).topology
        lat, bw = topology.network.latency_s, topology.network.bandwidth_bytes_per_s
        ours = dtfm_search(topology, 8, 8, seed=args.seed, time_limit_s=args.time_limit)
        base = gcma(topology, 8, 8, seed=args.seed, trials=args.trials)
        rng = np.random.default_rng(args.seed)
        random_costs = [dtfm_cost(lat, bw, random_allocation(64, 8, 8, rng)).total_s for _ in range(20)]
        contiguous = dtfm_cost(lat, bw, contiguous_allocation(64, 8, 8)).total_s
        exact = class_dtfm_allocation(topology, 8, 8, time_limit_s=args.cpsat_seconds, hint=ours.groups, workers=2)
        bound = max(ours.bound_s, exact.bound_s)
        row = {"case": path.stem, "before_s": before.get(path.stem), "ours_s": ours.cost_s, "ours_wall_s": ours.wall_s,
               "ours_evaluations": ours.evaluations, "ours_bound_s": ours.bound_s, "ours_status": ours.exact_status,
               "ours_algorithm": ours.algorithm, "ours_clock_cut": ours.clock_cut,
               "gcma_s": base.cost_s, "gcma_wall_s": base.wall_s, "gcma_evaluations": base.evaluations,
               "wall_fraction": ours.wall_s / base.wall_s, "random_mean_s": float(np.mean(random_costs)),
               "contiguous_s": contiguous, "cpsat_status": exact.status, "cpsat_s": exact.cost_s,
               "cpsat_wall_s": exact.wall_s, "cpsat_bound_s": exact.bound_s, "ours_gap": 1 - bound / ours.cost_s}
        rows.append(row)
        shown = f"{row['before_s']:9.3f}" if row["before_s"] is not None else f"{'-':>9}"
        print(f"{path.stem:<28} {shown} {ours.cost_s:9.3f} {ours.wall_s:9.2f}s {ours.bound_s:9.3f} "
              f"{ours.exact_status or '-':>9} {base.cost_s:9.3f} {base.wall_s:9.1f}s {row['random_mean_s']:9.3f} "
              f"{contiguous:9.3f} {exact.bound_s:11.3f} {100 * row['ours_gap']:8.1f}%", flush=True)
    small = _small_instances(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"machine": platform.platform(), "processor": platform.processor(),
                                          "trials": args.trials, "seed": args.seed, "time_limit_s": args.time_limit,
                                          "date": time.strftime("%Y-%m-%d"),
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
        ours = dtfm_search(topology, stages, replicas, seed=args.seed, time_limit_s=args.time_limit)
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
