"""Gradient sync algorithms on the shipped topologies: predicted iteration per algorithm, and what
``training.sync: auto`` gains over the ring.

    python benchmarks/sync_algorithms.py [--budget 3] [--time-limit 120] [--seed 0]

For each topology: the plan searched with the ring, predicted again with each algorithm (the same
placement; ``shard_optimizer`` off where the algorithm sums whole gradients, so the step and memory
change with it: "no fit" where it no longer fits), and the plan searched with ``sync: auto`` (the
placement may follow the algorithm), with the one it chose. Gain: ring-searched iteration over
auto-searched iteration. Each search runs on the work budget ``--budget`` under a time limit long
enough that the budget, not the clock, ends it: the same plans whatever the machine's load. Prints
a table and writes ``benchmarks/results/sync_algorithms.json``.
"""

import dataclasses
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from budgeted import budget_parser, search_options, write_rows  # noqa: E402
from cost_models.network import Sync  # noqa: E402
from planner.errors import InputError  # noqa: E402
from planner.inputs.job import load_job  # noqa: E402
from planner.prediction.predict import predict  # noqa: E402
from planner.search.front import search  # noqa: E402
from planner.search.sync_choice import choose_sync  # noqa: E402

TOPOLOGIES = tuple(sorted(str(p.relative_to(ROOT)) for p in (ROOT / "topologies" / "dtfm").glob("*.yaml"))) + \
    tuple(sorted(str(p.relative_to(ROOT)) for p in (ROOT / "topologies" / "hetero").glob("*.yaml")))


def _per_algorithm(plan, topology, model, training) -> dict:
    """Each algorithm's predicted iteration of ``plan`` (None where it does not fit)."""
    out = {}
    for sync in Sync:
        asked = dataclasses.replace(training, sync=str(sync), shard_optimizer="auto")
        try:
            fixed, resolved, _ = choose_sync(plan, topology, model, asked)
        except InputError:
            out[str(sync)] = None
            continue
        prediction = predict(fixed, topology, model, resolved)[0] if fixed.prediction is None else fixed.prediction
        out[str(sync)] = prediction.iteration_s if prediction.fits else None
    return out


def main() -> None:
    args = budget_parser(__doc__.splitlines()[0], budget_s=3.0, time_limit_s=120.0,
                         out_name="sync_algorithms.json").parse_args()
    options = search_options(args)
    rows = []
    for path in TOPOLOGIES:
        job = load_job(ROOT / path)
        started = time.perf_counter()
        ring = search(job.topology, job.model, dataclasses.replace(job.training, sync="ring"), options)
        auto = search(job.topology, job.model, dataclasses.replace(job.training, sync="auto"), options)
        row = {"topology": path, "degrees": [ring.plan.stages, ring.plan.replicas],
               "same_placement_s": _per_algorithm(ring.plan, job.topology, job.model, ring.training),
               "ring_searched_s": ring.predicted_s, "auto_searched_s": auto.predicted_s,
               "auto_chose": str(auto.plan.sync), "auto_tried_s": auto.plan.search.get("sync_tried", {}),
               "gain": ring.predicted_s / auto.predicted_s, "wall_s": time.perf_counter() - started}
        rows.append(row)
        print(_line(row), flush=True)
    write_rows(args, " ".join(["python", "benchmarks/sync_algorithms.py"] + sys.argv[1:]), rows)


def _line(row) -> str:
    cells = " ".join(f"{row['same_placement_s'][str(s)]:9.3f}" if row["same_placement_s"][str(s)] is not None
                     else f"{'no fit':>9}" for s in Sync)
    return (f"{Path(row['topology']).stem[:30]:30} {row['degrees'][0]:>2}x{row['degrees'][1]:<2} {cells} | "
            f"ring {row['ring_searched_s']:9.3f} auto {row['auto_searched_s']:9.3f} ({row['auto_chose']}) "
            f"gain {row['gain']:.3f}")


if __name__ == "__main__":
    print(f"{'topology':30} {'SxR':5} " + " ".join(f"{str(s)[:9]:>9}" for s in Sync)
          + " | searched: ring vs auto (seconds per iteration)")
    main()
