"""Search at scale: generated heterogeneous topologies of 64 to 4,096 devices.

    python benchmarks/scale.py [--sizes 64 256 1024 4096] [--time-limit 60]

Each topology has regions of 8-GPU hosts of mixed types (H100, A100-80GB, A100-40GB, V100-32GB,
RTX-4090), NVLink inside a host, 100 Gbit/s inside a region and seeded random 1-10 Gbit/s,
20-150 ms links between regions; GPT-3 6.7B, two sequences per device per iteration. Prints wall
time, predicted iteration time, bound and gap, and writes ``benchmarks/results/scale.json``.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.inputs.model import model_preset, parse_training  # noqa: E402
from planner.search.front import SearchOptions, search  # noqa: E402
from planner.inputs.topology import parse_topology  # noqa: E402

TYPES = ("H100-SXM", "A100-80GB", "A100-40GB", "V100-32GB", "RTX-4090")


def generated_topology(devices: int, *, seed: int = 0) -> dict:
    """A topology document: ``devices`` GPUs on 8-GPU hosts, about 16 hosts per region."""
    rng = np.random.default_rng(seed)
    hosts = devices // 8
    regions = max(2, hosts // 16)
    entries = []
    for h in range(hosts):
        region = f"region{h % regions}"
        kind = TYPES[(h * 7 + h // regions) % len(TYPES)]
        entries.append({"name": f"h{h}-{kind.lower()}", "count": 8, "type": kind, "host": f"host{h}",
                        "region": region})
    pairs = []
    for a in range(regions):
        for b in range(a + 1, regions):
            pairs.append({"regions": [f"region{a}", f"region{b}"], "latency": f"{rng.uniform(20, 150):.1f}ms",
                          "bandwidth": f"{rng.uniform(1, 10):.2f}Gbps"})
    return {"name": f"generated-{devices}", "devices": entries,
            "network": {"host": {"latency": "0.01ms", "bandwidth": "2400Gbps"},
                        "region": {"latency": "0.1ms", "bandwidth": "100Gbps"},
                        "global": {"latency": "100ms", "bandwidth": "1Gbps"}, "region_pairs": pairs}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024, 4096])
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "scale.json"))
    args = parser.parse_args()
    model = model_preset("gpt3-6.7b")
    rows = []
    print(f"{'devices':>7} {'wall s':>7} {'S x D':>8} {'used':>5} {'predicted s':>11} {'bound s':>8} {'gap':>6} "
          f"{'evaluations':>11}")
    for n in args.sizes:
        topology = parse_topology(generated_topology(n), name=f"generated-{n}")
        training = parse_training({"global_batch": 2 * n, "micro_batch_size": 1, "precision": "auto",
                                   "recompute": True, "flash_attention": True})
        started = time.perf_counter()
        result = search(topology, model, training, SearchOptions(seed=0, time_limit_s=args.time_limit))
        wall = time.perf_counter() - started
        plan = result.plan
        row = {"devices": n, "wall_s": wall, "stages": plan.stages, "replicas": plan.replicas,
               "used": plan.stages * plan.replicas, "predicted_s": result.predicted_s,
               "lower_bound_s": result.lower_bound_s, "gap": result.gap, "evaluations": result.evaluations}
        rows.append(row)
        print(f"{n:7d} {wall:7.1f} {plan.stages:>3} x {plan.replicas:<3} {row['used']:5d} {result.predicted_s:11.2f} "
              f"{result.lower_bound_s:8.2f} {100 * result.gap:5.1f}% {result.evaluations:11d}", flush=True)
    Path(args.out).write_text(json.dumps({"rows": rows, "time_limit_s": args.time_limit}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
