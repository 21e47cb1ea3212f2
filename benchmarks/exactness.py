"""Exactness of the search on tiny instances: its best estimate against brute force over every
placement (the same estimate, ``planner.search.evaluate.evaluate_placement``, with exact layer and
batch splits inside), degrees pinned at random.

    python benchmarks/exactness.py [--instances 200] [--max-devices 6]

Prints the agreement rate and the worst relative excess, writes ``benchmarks/results/exactness.json``.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.model import model_preset, parse_training  # noqa: E402
from planner.search.brute import brute_force_placement, random_small_topology  # noqa: E402
from planner.search.evaluate import make_context  # noqa: E402
from planner.search.front import SearchOptions, search  # noqa: E402

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=200)
    parser.add_argument("--max-devices", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "exactness.json"))
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    model = model_preset("small")
    training = parse_training({"global_batch": 16, "micro_batch": 2, "schedule": "1f1b", "precision": "fp16"})
    rows, started = [], time.perf_counter()
    for k in range(args.instances):
        topology, stages, replicas = random_small_topology(rng, args.max_devices)
        exact = brute_force_placement(make_context(topology, model, training), stages, replicas, 2, "1f1b")
        if not np.isfinite(exact):
            continue
        result = search(topology, model, training, SearchOptions(seed=k, stages=stages, replicas=replicas))
        found = min(h[2] for h in result.history)
        rows.append({"devices": topology.size, "stages": stages, "replicas": replicas, "brute_force_s": exact,
                     "search_s": found, "excess": found / exact - 1})
    agree = sum(r["excess"] <= 1e-9 for r in rows)
    worst = max(r["excess"] for r in rows)
    print(f"{len(rows)} feasible instances of 3-{args.max_devices} devices: search = brute force in {agree} "
          f"({100 * agree / len(rows):.1f}%), worst excess {100 * worst:.3f}%, {time.perf_counter() - started:.0f} s")
    Path(args.out).write_text(json.dumps({"rows": rows, "agree": agree, "worst_excess": worst}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
