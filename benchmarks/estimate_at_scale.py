"""The search's estimate against the event simulator at scale, with a shared NIC per host.

    python benchmarks/estimate_at_scale.py [--sizes 1024] [--nic 100Gbps] [--time-limit 30]

The topologies are ``benchmarks/scale.py``'s (8-GPU hosts of five types, regions joined by 1-10
Gbit/s links) with every host's traffic leaving through one NIC of ``--nic``. The search ranks
candidates by its estimate and simulates the best few (its finalists); this prints, for every
simulated finalist, the estimate, the simulator's iteration time and the error, and writes
``benchmarks/results/estimate_at_scale.json``.
"""

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.scale import generated_topology  # noqa: E402
from planner.inputs.model import model_preset, parse_training  # noqa: E402
from planner.inputs.topology import parse_topology  # noqa: E402
from planner.search.front import SearchOptions, search  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024])
    parser.add_argument("--nic", default="100Gbps", help="each host's shared NIC")
    parser.add_argument("--time-limit", type=float, default=30.0)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "estimate_at_scale.json"))
    args = parser.parse_args()
    model = model_preset("gpt3-6.7b")
    rows = []
    print(f"{'devices':>7} {'finalist':>8} {'S x D':>9} {'estimate s':>10} {'simulated s':>11} {'error':>7}")
    for n in args.sizes:
        document = generated_topology(n)
        document["network"]["nic"] = args.nic
        topology = parse_topology(document, name=f"generated-{n}-nic-{args.nic}")
        training = parse_training({"global_batch": 2 * n, "micro_batch_size": 1, "precision": "auto",
                                   "recompute": True, "flash_attention": True})
        started = time.perf_counter()
        result = search(topology, model, training, SearchOptions(seed=0, time_limit_s=args.time_limit))
        wall = time.perf_counter() - started
        finalists = result.plan.search.get("finalists", [])
        for i, f in enumerate(finalists):
            error = f["estimate_s"] / f["simulated_s"] - 1 if np.isfinite(f["simulated_s"]) else float("inf")
            rows.append({"devices": n, "finalist": i, **f, "error": error})
            print(f"{n:7d} {i:8d} {f['stages']:>4} x {f['replicas']:<3} {f['estimate_s']:10.3f} "
                  f"{f['simulated_s']:11.3f} {100 * error:+6.1f}%", flush=True)
        print(f"{n} devices: chosen {result.plan.stages} x {result.plan.replicas}, simulated "
              f"{result.predicted_s:.3f} s, search {wall:.1f} s", flush=True)
    errors = np.abs([r["error"] for r in rows if np.isfinite(r["error"])])
    summary = {"finalists": len(rows), "mean_abs_error": float(errors.mean()) if len(errors) else None,
               "max_abs_error": float(errors.max()) if len(errors) else None}
    if len(errors):
        print(f"{len(rows)} finalists: estimate vs simulator mean |error| {100 * summary['mean_abs_error']:.1f}%, "
              f"max {100 * summary['max_abs_error']:.1f}%")
    Path(args.out).write_text(json.dumps({"machine": platform.platform(), "nic": args.nic,
                                          "time_limit_s": args.time_limit, "rows": rows, "summary": summary},
                                         indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
