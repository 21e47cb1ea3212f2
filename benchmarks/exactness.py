"""Exactness of the search on tiny instances: its best estimate against brute force over every
placement (the same estimate, ``planner.search.evaluate.evaluate_placement``, with exact layer and
batch splits inside), degrees pinned at random.

    python benchmarks/exactness.py [--instances 200] [--max-devices 6]

Prints the agreement rate and the worst relative excess, writes ``benchmarks/results/exactness.json``.
"""

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.model import model_preset, parse_training  # noqa: E402
from planner.search.evaluate import evaluate_placement, make_context  # noqa: E402
from planner.search.front import SearchOptions, search  # noqa: E402
from planner.topology import parse_topology  # noqa: E402

TYPES = ("A100-80GB", "V100-16GB", "T4", "RTX-4090", "L4")


def random_instance(rng, max_devices: int) -> tuple:
    n = int(rng.integers(3, max_devices + 1))
    devices = [{"name": f"d{i}", "type": TYPES[int(rng.integers(len(TYPES)))], "region": f"r{int(rng.integers(2))}"}
               for i in range(n)]
    latency = rng.uniform(0.1, 50.0, (n, n))
    bandwidth = rng.uniform(0.5, 50.0, (n, n))
    np.fill_diagonal(latency, 0.0)
    document = {"devices": devices, "network": {"matrix": {
        "latency_unit": "ms", "bandwidth_unit": "Gbps", "latency": latency.round(3).tolist(),
        "bandwidth": bandwidth.round(3).tolist()}}}
    topology = parse_topology(document, name="random")
    pairs = [(s, d) for s in range(1, n + 1) for d in range(1, n // s + 1)]
    stages, replicas = pairs[int(rng.integers(len(pairs)))]
    return topology, stages, replicas


def brute_force(ctx, n: int, stages: int, replicas: int, micro_batch: int, schedule: str) -> float:
    """Minimum estimate over every placement, replicas taken in canonical (sorted) order."""
    best = np.inf
    for chosen in itertools.permutations(range(n), stages * replicas):
        rows = [chosen[r * stages:(r + 1) * stages] for r in range(replicas)]
        if rows != sorted(rows):
            continue
        candidate = evaluate_placement(ctx, np.array(rows), micro_batch, schedule)
        if candidate is not None:
            best = min(best, candidate.score_s)
    return best


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
        topology, stages, replicas = random_instance(rng, args.max_devices)
        ctx = make_context(topology, model, training)
        exact = brute_force(ctx, topology.size, stages, replicas, 2, "1f1b")
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
