"""Exactness of the search on small instances, against two exact references, degrees pinned at random.

- Brute force (up to ``--brute-max-devices`` devices): every placement, each with the search's
  own layer and batch splits (``planner.search.brute``).
- CP-SAT (``planner.search.cpsat_placement``): placement, layer split and batch split decided
  together, minimising the same estimate; counted where CP-SAT proves optimality within
  ``--cpsat-seconds``. It is never above brute force.

Two searches are compared: the heuristic alone (construct + iterated local search + genetic +
split refinement, ``exact=False``) and the front door as ``plan`` runs it (CP-SAT on the leading
shapes of topologies up to 12 devices).

    python benchmarks/exactness.py [--instances 200] [--max-devices 8] [--seed 0]

Prints a table per device count band, writes ``benchmarks/results/exactness.json``.
"""

import argparse
import json
import multiprocessing
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.inputs.model import model_preset, parse_training  # noqa: E402
from planner.search.brute import brute_force_placement  # noqa: E402
from tests.instances import random_small_topology  # noqa: E402
from planner.search.cpsat_placement import exact_placement  # noqa: E402
from planner.search.evaluate import evaluate_placement, make_context  # noqa: E402
from planner.search.front import SearchOptions, search  # noqa: E402

MATCH = 1e-7  # relative: equal up to the CP-SAT model's 1 ns resolution
TRAINING = {"global_batch": 16, "micro_batch_size": 2, "schedule": "1f1b", "precision": "fp16"}


def _instance(task: tuple) -> dict | None:
    k, topology, stages, replicas, brute_max, cpsat_seconds = task
    model, training = model_preset("small"), parse_training(TRAINING)
    ctx = make_context(topology, model, training)
    row = {"instance": k, "devices": topology.size, "stages": stages, "replicas": replicas}
    options = SearchOptions(seed=k, stages=stages, replicas=replicas)
    try:
        started = time.perf_counter()
        heuristic = search(topology, model, training, SearchOptions(seed=k, stages=stages, replicas=replicas,
                                                                     exact=False))
        row["heuristic_wall_s"] = time.perf_counter() - started
        started = time.perf_counter()
        front = search(topology, model, training, options)
        row["front_wall_s"] = time.perf_counter() - started
    except Exception as error:  # noqa: BLE001 - an instance no plan fits is skipped, like brute force does
        if "no plan fits" in str(error):
            return None
        raise
    row["heuristic_s"] = min(h[2] for h in heuristic.history)
    row["front_s"] = min(h[2] for h in front.history)
    names = topology.names
    assign = np.array([[names.index(d) for d in r] for r in heuristic.plan.assignment])
    hint = evaluate_placement(ctx, assign, 2, "1f1b")
    exact = exact_placement(ctx, stages, replicas, 2, "1f1b", time_limit_s=cpsat_seconds, hint=hint)
    row.update(cpsat_status=exact.status, cpsat_s=exact.objective_s, cpsat_bound_s=exact.bound_s,
               cpsat_wall_s=exact.wall_s)
    if topology.size <= brute_max:
        started = time.perf_counter()
        row["brute_force_s"] = brute_force_placement(ctx, stages, replicas, 2, "1f1b")
        row["brute_force_wall_s"] = time.perf_counter() - started
    return row


def _band(rows: list, label: str) -> list:
    proven = [r for r in rows if r["cpsat_status"] == "optimal"]
    brute = [r for r in rows if "brute_force_s" in r]

    def share(found, reference, pool):
        hits = sum(r[found] <= r[reference] * (1 + MATCH) for r in pool)
        return f"{hits}/{len(pool)}" if pool else "-"

    def worst(found, pool):
        return f"{100 * max((r[found] / r['cpsat_s'] - 1 for r in pool), default=0.0):.2f}%" if pool else "-"

    return [label, str(len(rows)), share("heuristic_s", "brute_force_s", brute), share("front_s", "brute_force_s", brute),
            str(len(proven)), share("heuristic_s", "cpsat_s", proven), worst("heuristic_s", proven),
            share("front_s", "cpsat_s", proven), worst("front_s", proven),
            f"{np.median([r['front_wall_s'] for r in rows]):.1f}" if rows else "-",
            f"{np.median([r['cpsat_wall_s'] for r in rows]):.1f}" if rows else "-"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=200)
    parser.add_argument("--max-devices", type=int, default=8)
    parser.add_argument("--brute-max-devices", type=int, default=8)
    parser.add_argument("--cpsat-seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2, help="instances solved in parallel")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "exactness.json"))
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    tasks = [(k, *random_small_topology(rng, args.max_devices), args.brute_max_devices, args.cpsat_seconds)
             for k in range(args.instances)]
    started = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
        rows = []
        for k, row in enumerate(pool.imap(_instance, tasks), 1):
            if row is not None:
                rows.append(row)
            if k % 20 == 0:
                print(f"  {k}/{len(tasks)} instances, {time.perf_counter() - started:.0f} s", file=sys.stderr)
    rows = [r for r in rows if "brute_force_s" not in r or np.isfinite(r["brute_force_s"])]
    header = ["devices", "instances", "heur.=brute", "front=brute", "CP-SAT proven", "heur.=CP-SAT",
              "heur. worst", "front=CP-SAT", "front worst", "front wall s", "CP-SAT wall s"]
    bands = [(3, 6), (7, 8), (9, 12)]
    table = [_band([r for r in rows if lo <= r["devices"] <= hi], f"{lo}-{hi}") for lo, hi in bands
             if lo <= args.max_devices]
    table.append(_band(rows, "all"))
    widths = [max(len(str(x)) for x in col) for col in zip(header, *table)]
    for line in [header] + table:
        print("  ".join(str(x).rjust(w) for x, w in zip(line, widths)))
    print(f"{len(rows)} feasible instances of 3-{args.max_devices} devices (seed {args.seed}), "
          f"{time.perf_counter() - started:.0f} s; 'a=b': a within {MATCH:g} of b; 'worst': largest excess over "
          f"CP-SAT's proven optimum")
    Path(args.out).write_text(json.dumps({"args": vars(args), "header": header, "table": table, "rows": rows},
                                         indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
