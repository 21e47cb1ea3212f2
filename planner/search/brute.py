"""Brute force for tiny instances: the reference the search is checked against.

``brute_force_placement`` evaluates every placement of ``stages x replicas`` devices (replicas in
canonical order, since they are interchangeable) with the search's own estimate, exact layer and
batch splits included. ``random_small_topology`` draws the random instances the tests and
``benchmarks/exactness.py`` use.
"""

import itertools

import numpy as np

from planner.search.evaluate import evaluate_placement
from planner.topology import parse_topology

__all__ = ["brute_force_placement", "random_small_topology"]

_TYPES = ("A100-80GB", "V100-16GB", "T4", "RTX-4090", "L4")


def brute_force_placement(ctx, stages: int, replicas: int, micro_batch: int, schedule: str) -> float:
    """Minimum estimate over every placement (inf when none fits). ``n!/(n-SR)!/R!`` evaluations."""
    n = ctx.topology.size
    best = np.inf
    for chosen in itertools.permutations(range(n), stages * replicas):
        rows = [chosen[r * stages:(r + 1) * stages] for r in range(replicas)]
        if rows != sorted(rows):
            continue
        candidate = evaluate_placement(ctx, np.array(rows), micro_batch, schedule)
        if candidate is not None:
            best = min(best, candidate.score_s)
    return best


def random_small_topology(rng, max_devices: int) -> tuple:
    """(topology, stages, replicas): 3..``max_devices`` devices of random catalog types in two
    regions, a random asymmetric link matrix (0.1-50 ms, 0.5-50 Gbit/s), random valid degrees."""
    n = int(rng.integers(3, max_devices + 1))
    devices = [{"name": f"d{i}", "type": _TYPES[int(rng.integers(len(_TYPES)))],
                "region": f"r{int(rng.integers(2))}"} for i in range(n)]
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
