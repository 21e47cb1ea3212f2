"""What a deeper 1F1B warm-up buys on the shipped topologies: the plan the search returns with the
warm-up depth fixed at 1 (PipeDream-Flush) against ``warmup_depth: auto``, same seed and budget.

    python benchmarks/warmup_depth.py [--budget 5] [--time-limit 120]

For each topology in ``topologies/dtfm/`` and ``topologies/hetero/``: the training as the file asks,
at depth 1 and under auto. For the heterogeneous ones also the plan-space settings of
``benchmarks/plan_space.py`` (optimizer state sharded and recomputation chosen by the search,
tensor groups searched) on all devices and on the devices of the fastest type alone, each at depth
1 and under auto: the ratio all / alone is what the other devices buy, and the alone plan's time
over the all-devices search's lower bound the most any plan on all devices could buy (below 1.3x:
no plan reaches 1.3x there, however good the search); and that ratio again with
both compression switches on auto on both sides (int8 pipeline messages, PowerSGD gradients: lossy,
so not the same training), where the network, not memory, keeps devices out. The time limit is long
enough that the budget, not the clock, ends every search: the same plans on any machine.
Prints a table and writes ``benchmarks/results/warmup_depth.json``.
"""

import json
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from budgeted import budget_parser, search_options, write_rows  # noqa: E402
from plan_space import _fastest_type_only, _run  # noqa: E402
from planner.inputs.job import load_job  # noqa: E402


def _pair(topology, model, training, options) -> dict:
    """The search at depth 1 and under auto, and the speed-up auto gives."""
    flat = _run(topology, model, replace(training, warmup_depth=1), options)
    deep = _run(topology, model, replace(training, warmup_depth="auto"), options)
    both = flat.get("fits") and deep.get("fits")
    return {"depth_1": flat, "auto": deep, "speedup": flat["predicted_s"] / deep["predicted_s"] if both else None}


def main() -> int:
    args = budget_parser(__doc__.splitlines()[0], budget_s=5.0, time_limit_s=120.0,
                         out_name="warmup_depth.json").parse_args()
    options = search_options(args)
    rows = []
    paths = [*sorted((ROOT / "topologies" / "dtfm").glob("*.yaml")),
             *sorted((ROOT / "topologies" / "hetero").glob("*.yaml"))]
    for path in paths:
        job = load_job(path)
        row = {"topology": job.topology.name, "devices": job.topology.size,
               "as_asked": _pair(job.topology, job.model, job.training, options)}
        alone = _fastest_type_only(path) if path.parent.name == "hetero" else None
        if alone is not None:
            space = replace(job.training, precision="auto", shard_optimizer="auto", recompute="auto")
            row["fastest_type"] = alone[1]
            row["all_devices"] = _pair(job.topology, job.model, space, options)
            row["fastest_type_alone"] = _pair(alone[0], job.model, space, options)
            squeezed = replace(space, compress_messages="auto", compress_gradients="auto")
            row["all_devices_compressed"] = _pair(job.topology, job.model, squeezed, options)
            row["fastest_type_alone_compressed"] = _pair(alone[0], job.model, squeezed, options)
            for key in ("depth_1", "auto"):
                for suffix in ("", "_compressed"):
                    a, f = row[f"all_devices{suffix}"][key], row[f"fastest_type_alone{suffix}"][key]
                    both = a["fits"] and f["fits"]
                    row[f"all_vs_alone{suffix}_{key}"] = f["predicted_s"] / a["predicted_s"] if both else None
                    # the most any plan on all devices can buy over the alone plan found: no plan
                    # beats the all-devices search's lower bound
                    row[f"all_vs_alone_most{suffix}_{key}"] = f["predicted_s"] / a["lower_bound_s"] if both else None
        rows.append(row)
        print(json.dumps({"topology": row["topology"], "speedup": row["as_asked"]["speedup"]}), flush=True)

    def cell(result):
        return f"{result['predicted_s']:.2f}" if result.get("fits") else "-"

    def times(x):
        return f"{x:.2f}x" if x else "-"

    print(f"\n{'topology':<32} {'depth 1 s':>9} {'auto s':>8} {'k':>2} {'speed-up':>8}   "
          f"{'all/alone depth 1':>17} {'all/alone auto':>14} {'at most (auto)':>14} {'compressed: depth 1':>19} "
          f"{'auto':>6}")
    for row in rows:
        pair = row["as_asked"]
        depth = pair["auto"].get("warmup_depth", "-") if pair["auto"].get("fits") else "-"
        print(f"{row['topology']:<32} {cell(pair['depth_1']):>9} {cell(pair['auto']):>8} {depth:>2} "
              f"{times(pair['speedup']):>8}   {times(row.get('all_vs_alone_depth_1')):>17} "
              f"{times(row.get('all_vs_alone_auto')):>14} {times(row.get('all_vs_alone_most_auto')):>14} "
              f"{times(row.get('all_vs_alone_compressed_depth_1')):>19} "
              f"{times(row.get('all_vs_alone_compressed_auto')):>6}")
    write_rows(args, "python benchmarks/warmup_depth.py", rows)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
