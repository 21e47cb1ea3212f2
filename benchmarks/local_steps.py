"""Local steps (DiLoCo, Douillard et al. 2023, arXiv 2311.08105) on slow-link topologies: predicted
time per iteration and bytes per token for H = 1, 4, 16, 64 iterations between syncs.

    python benchmarks/local_steps.py [--time-limit 10] [--seed 0]

For each topology, two rows per H: the plan searched with ``training.sync_every = H`` (the
placement may change with H), and the plan searched at H = 1 predicted again with H (the same
placement, only the sync amortised; its memory grows by the 8 B/param of outer state, so it may not
fit). Bytes per token are what the workers send each other per token trained (``planner.prediction
.predict.communication_bytes``: pipeline messages plus the data-parallel sync, the latter averaged
over its H iterations). For H > 1, the searched plan (its placement) is also predicted with each sync
grouping (``planner.plan.sync_groups``): ``groups:replica`` every replica alone, ``groups:cluster``
replicas whose devices sit stage by stage in the same regions all-reducing gradients every
iteration, ``groups:one`` all replicas in one group; the searched row says which the search chose
(``training.sync_groups: auto``). H > 1 changes the optimisation: these are speeds, not model quality.
Prints a table and writes ``benchmarks/results/local_steps.json``.
"""

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.errors import InputError  # noqa: E402
from planner.inputs.job import load_job  # noqa: E402
from planner.prediction.predict import communication_bytes, predict  # noqa: E402
from planner.search.front import SearchOptions, search  # noqa: E402
from planner.search.group_choice import plan_with_groups  # noqa: E402

TOPOLOGIES = ("topologies/hetero/home-consumer-gpus.yaml", "topologies/dtfm/case5-worldwide.yaml",
              "topologies/hetero/h100-3090-homes.yaml")
SYNC_EVERY = (1, 4, 16, 64)
GROUPINGS = ("replica", "cluster", "one")


def _row(plan, prediction, model, training) -> dict:
    sent = communication_bytes(plan, model, training)
    return {"iteration_s": prediction.iteration_s, "gradient_sync_s": prediction.breakdown_s["gradient_sync_s"],
            "tokens_per_s": prediction.tokens_per_s, "fits": prediction.fits,
            "bytes_per_token": sent["bytes_per_token"],
            "data_parallel_bytes_per_token": sent["data_parallel_bytes_per_token"],
            "within_groups_bytes_per_token": sent.get("within_groups_bytes_per_token", 0.0),
            "across_groups_bytes_per_token": sent.get("across_groups_bytes_per_token",
                                                      sent["data_parallel_bytes_per_token"]),
            "sync_groups": [list(g) for g in plan.sync_groups],
            "stages": plan.stages, "replicas": plan.replicas, "devices_used": len(plan.used_devices)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                        help="each search's work budget (the same plans whatever the machine's load, while "
                             "--time-limit leaves it time); default: the time limit's share")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "local_steps.json"))
    args = parser.parse_args(argv)
    options = SearchOptions(seed=args.seed, time_limit_s=args.time_limit, budget_s=args.budget)
    rows = []
    print(f"{'topology':<22} {'H':>3} {'plan':<15} {'S x R':>6} {'iteration s':>12} {'sync s':>9} "
          f"{'KiB/token':>10} {'DP KiB/token':>13} {'within/across':>14} groups")
    for name in TOPOLOGIES:
        job = load_job(ROOT / name)
        base = None
        for H in SYNC_EVERY:
            training = dataclasses.replace(job.training, sync_every=H)
            started = time.perf_counter()
            try:
                result = search(job.topology, job.model, training, options)
            except InputError as error:
                rows.append({"topology": Path(name).stem, "sync_every": H, "plan": "searched", "error": str(error)})
                continue
            entries = [("searched", result.plan, result.plan.prediction, result.training)]
            if H == 1:
                base = result
            elif base is not None:  # the H = 1 placement, only the sync amortised
                same = dataclasses.replace(base.plan, sync_every=H, prediction=None)
                t = dataclasses.replace(base.training, sync_every=H, shard_optimizer="auto")  # ZeRO off with H > 1
                entries.append(("same", same, predict(same, job.topology, job.model, t)[0], t))
            if H > 1 and result.plan.replicas > 1:  # the searched placement with each sync grouping
                for kind in GROUPINGS:
                    grouped = plan_with_groups(dataclasses.replace(result.plan, prediction=None), job.topology, kind)
                    entries.append((f"groups:{kind}", grouped,
                                    predict(grouped, job.topology, job.model, result.training)[0], result.training))
            for label, plan, prediction, t in entries:
                row = {"topology": Path(name).stem, "sync_every": H, "plan": label,
                       **_row(plan, prediction, job.model, t), "search_wall_s": round(time.perf_counter() - started, 2)}
                rows.append(row)
                kib, dp_kib = row["bytes_per_token"] / 1024, row["data_parallel_bytes_per_token"] / 1024
                within, across = row["within_groups_bytes_per_token"], row["across_groups_bytes_per_token"]
                split = f"{within / 1024:.1f}/{across / 1024:.1f}"
                print(f"{row['topology'][:22]:<22} {H:>3} {label:<15} {plan.stages:>2} x {plan.replicas:<2} "
                      f"{row['iteration_s']:>12.3f} {row['gradient_sync_s']:>9.3f} {kib:>10.2f} {dp_kib:>13.2f} "
                      f"{split:>14} {len(plan.sync_groups) or plan.replicas}"
                      + ("" if row["fits"] else "  (does not fit)"), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"time_limit_s": args.time_limit, "budget_s": args.budget, "seed": args.seed,
                               "sync_every": list(SYNC_EVERY), "groupings": list(GROUPINGS),
                               "note": "H > 1 changes the optimisation: speeds, not model quality", "rows": rows},
                              indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
