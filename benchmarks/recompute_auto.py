"""What ``recompute: auto`` returns against fixing recomputation off or on, at one work budget.

    python benchmarks/recompute_auto.py [--budget 5] [--seed 0] [--time-limit 300]

For each topology in ``topologies/hetero/`` (and a100-t4-small-memory again at micro-batch 8, where
activations bind), the plan-space settings of ``benchmarks/warmup_depth.py`` (precision and
optimizer sharding chosen, warm-up depth searched) with ``recompute`` auto, false and true, each
search at the same seed and work budget (``auto`` splits it in half between a search without
recomputation and one with it: ``planner.search.front._best_recompute``); and the search without
recomputation at half the budget, then again at the other half from its plan (``x0``, seed + 1):
whether what ``auto`` leaves to the second half could be spent on the first search's plan instead.
Under ``auto`` the plan of full recomputation has its workers at the lightest mode that fits and
its layers moved (``planner.search.recompute_cells``): the last column counts its workers per mode.
The limit is far above the budget, so the same plans on any machine. Prints a table and writes
``benchmarks/results/recompute_auto.json``.
"""

import json
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from budgeted import budget_parser, search_options, write_rows  # noqa: E402
from plan_space import _run  # noqa: E402
from planner.inputs.job import load_job  # noqa: E402
from planner.search.front import search  # noqa: E402


def main() -> int:
    args = budget_parser(__doc__.splitlines()[0], budget_s=5.0, time_limit_s=300.0,
                         out_name="recompute_auto.json").parse_args()
    options = search_options(args)
    cases = [(path, None) for path in sorted((ROOT / "topologies" / "hetero").glob("*.yaml"))]
    cases.append((ROOT / "topologies" / "hetero" / "a100-t4-small-memory.yaml", 8))
    rows = []
    for path, micro_batch in cases:
        job = load_job(path)
        space = replace(job.training, precision="auto", shard_optimizer="auto", warmup_depth="auto",
                        **({"micro_batch_size": micro_batch} if micro_batch else {}))
        row = {"topology": job.topology.name, "micro_batch_size": space.micro_batch_size}
        for recompute in ("auto", False, True):
            row[str(recompute).lower()] = _run(job.topology, job.model, replace(space, recompute=recompute), options)
        off = replace(space, recompute=False)
        half = options.share(0.5)
        first = search(job.topology, job.model, off, half)
        again = search(job.topology, job.model, off, replace(half, seed=args.seed + 1), x0=first.plan)
        row["off_half_then_half"] = {"first_s": first.predicted_s, "again_s": again.predicted_s}
        rows.append(row)
        print(json.dumps({"topology": row["topology"], "micro_batch_size": row["micro_batch_size"]}), flush=True)

    def cell(result):
        return f"{result['predicted_s']:.3f}" if result.get("fits") else "no plan"

    print(f"\n{'topology':<30} {'mb':>3} {'auto s':>8} {'off s':>8} {'on s':>8} {'auto/best':>9} "
          f"{'off half s':>10} {'then half s':>11}  auto's workers (none / selective / full)")
    for row in rows:
        fitting = [row[k]["predicted_s"] for k in ("false", "true") if row[k].get("fits")]
        ratio = row["auto"]["predicted_s"] / min(fitting) if fitting and row["auto"].get("fits") else None
        halves = row["off_half_then_half"]
        workers = row["auto"].get("recompute_workers", {})
        counts = " / ".join(str(workers.get(m, 0)) for m in ("none", "selective", "full"))
        print(f"{row['topology']:<30} {row['micro_batch_size']:>3} {cell(row['auto']):>8} {cell(row['false']):>8} "
              f"{cell(row['true']):>8} {(f'{ratio:.3f}' if ratio else '-'):>9} {halves['first_s']:>10.3f} "
              f"{halves['again_s']:>11.3f}  {counts}")
    write_rows(args, "python benchmarks/recompute_auto.py", rows)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
