"""Random tiny instances for the differential tests and ``benchmarks/exactness.py``."""

import itertools

import numpy as np

from planner.inputs.topology import parse_topology

__all__ = ["random_small_topology", "partitions"]

_TYPES = ("A100-80GB", "V100-16GB", "T4", "RTX-4090", "L4")


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


def partitions(items: list, stages: int, replicas: int):
    """Every split of ``items`` into ``stages`` unordered groups of ``replicas`` (brute-force references)."""
    if stages == 0:
        yield []
        return
    first = items[0]
    for rest in itertools.combinations(items[1:], replicas - 1):
        group = [first, *rest]
        for tail in partitions([x for x in items if x not in group], stages - 1, replicas):
            yield [group] + tail
