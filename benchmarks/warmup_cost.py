"""What ``warmup_depth: auto`` costs the search: CPU milliseconds per estimate of a 1F1B placement
at depth 1 and under auto, where each estimate also finds the deepest warm-up the placement's
memory holds (``planner.search.evaluate.fitting_depth``, a bisection over ``AUTO_WARMUP_DEPTHS``).

    python benchmarks/warmup_cost.py [--repeats 5]

For each topology below, the constructive layouts (``planner.search.construct.layouts``) of three
degree pairs, each estimated ``--repeats`` times at micro-batch 1, timed by ``time.process_time``
(CPU time, so the machine's load matters less than to wall time). The search's work budget counts
estimates at fixed rates (``planner.search.deadline``), so a ratio above 1 is how much more wall
time the same ``--budget`` takes under auto. Prints a table and writes
``benchmarks/results/warmup_cost.json``.
"""

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.inputs.job import load_job  # noqa: E402
from planner.search.construct import layouts  # noqa: E402
from planner.search.evaluate import evaluate_placement, make_context  # noqa: E402

TOPOLOGIES = ("dtfm/case1-datacenter-ondemand", "dtfm/case5-worldwide", "hetero/home-consumer-gpus",
              "hetero/h100-a100-two-regions")
PAIRS = ((4, 2), (6, 2), (8, 4))  # (stages, replicas), where the topology holds them


def _ms_per_estimate(job, depth, repeats: int) -> tuple:
    """(CPU ms per estimate, estimates) of the 1F1B layouts of ``PAIRS`` at warm-up ``depth``."""
    ctx = make_context(job.topology, job.model, replace(job.training, warmup_depth=depth))
    assigns = [a for stages, replicas in PAIRS if stages * replicas <= job.topology.size
               for a in layouts(job.topology, ctx.speed, ctx.capacity, stages, replicas).values()]
    started = time.process_time()
    for _ in range(repeats):
        for assign in assigns:
            evaluate_placement(ctx, assign, 1, "1f1b")
    return 1e3 * (time.process_time() - started) / (repeats * len(assigns)), repeats * len(assigns)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "warmup_cost.json"))
    args = parser.parse_args()
    rows = []
    for name in TOPOLOGIES:
        job = load_job(ROOT / "topologies" / f"{name}.yaml")
        (flat_ms, count), (auto_ms, _) = (_ms_per_estimate(job, depth, args.repeats) for depth in (1, "auto"))
        rows.append({"topology": name, "estimates": count, "depth_1_ms": flat_ms, "auto_ms": auto_ms,
                     "ratio": auto_ms / flat_ms})
    print(f"{'topology':36} {'estimates':>9} {'depth 1 ms':>10} {'auto ms':>8} {'ratio':>6}")
    for r in rows:
        print(f"{r['topology']:36} {r['estimates']:9d} {r['depth_1_ms']:10.2f} {r['auto_ms']:8.2f} {r['ratio']:5.2f}x")
    Path(args.out).write_text(json.dumps({"repeats": args.repeats, "rows": rows}, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
