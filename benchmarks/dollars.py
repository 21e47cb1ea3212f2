"""Time-optimal vs cost-optimal plans on the shipped heterogeneous topologies, in seconds and dollars.

    python benchmarks/dollars.py [--time-limit 10] [--seed 0]

For each topology in ``topologies/hetero/``, two searches with the same seed and limit: the time
objective and the cost objective (US dollars per iteration: the used devices' catalog prices per
device-hour over the iteration, plus egress between regions at the catalog's $0.02/GB unless the
file sets its own; idle devices cost nothing). Both keep their pool of distinct plans; the table
shows each plan's iteration time, $ per iteration, $ per million tokens and devices used, and the
size of the time / $ front of the cost search's pool. Prints a table and writes
``benchmarks/results/dollars.json``.
"""

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.errors import InputError  # noqa: E402
from planner.inputs.job import load_job  # noqa: E402
from planner.report.choices import devices_summary  # noqa: E402
from planner.search.dollars import plan_dollars  # noqa: E402
from planner.search.front import SearchOptions, search  # noqa: E402
from planner.search.objective import make_objective  # noqa: E402
from planner.search.pareto import pareto_front  # noqa: E402


def _summary(result, job) -> dict:
    plan = result.plan
    dollars = plan_dollars(plan, job.topology, job.model, result.training)
    return {"iteration_s": plan.prediction.iteration_s, "usd_per_iteration": dollars.usd_per_iteration,
            "usd_per_million_tokens": dollars.usd_per_million_tokens, "device_usd": dollars.device_usd,
            "egress_usd": dollars.egress_usd, "egress_bytes": dollars.egress_bytes,
            "stages": plan.stages, "replicas": plan.replicas, "devices_used": len(plan.used_devices),
            "devices": devices_summary(plan, job.topology), "wall_s": round(result.wall_s, 2),
            "pool_plans": len(result.pool)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "dollars.json"))
    args = parser.parse_args(argv)
    options = SearchOptions(seed=args.seed, time_limit_s=args.time_limit)
    rows = []
    for path in sorted((ROOT / "topologies" / "hetero").glob("*.yaml")):
        job = load_job(path)
        row = {"topology": path.stem, "devices": job.topology.size}
        started = time.perf_counter()
        try:
            fastest = search(job.topology, job.model, job.training, options, objective=make_objective("time", pooled=True))
            cheapest = search(job.topology, job.model, job.training, options, objective=make_objective("cost"))
        except InputError as error:
            row["error"] = str(error)
            rows.append(row)
            print(f"{path.stem}: {error}")
            continue
        row["time_optimal"], row["cost_optimal"] = _summary(fastest, job), _summary(cheapest, job)
        front = pareto_front(cheapest.pool)
        row["front"] = [{"iteration_s": e.iteration_s, "usd_per_iteration": e.dollars.usd_per_iteration,
                         "stages": e.plan.stages, "replicas": e.plan.replicas,
                         "devices": devices_summary(e.plan, job.topology)} for e in front]
        row["wall_s"] = round(time.perf_counter() - started, 2)
        rows.append(row)
        t, c = row["time_optimal"], row["cost_optimal"]
        print(f"{path.stem:32s} time-optimal {t['iteration_s']:8.3f} s ${t['usd_per_iteration']:.4f} "
              f"{t['stages']}x{t['replicas']} {t['devices']} | cost-optimal {c['iteration_s']:8.3f} s "
              f"${c['usd_per_iteration']:.4f} {c['stages']}x{c['replicas']} {c['devices']} | "
              f"saves {100 * (1 - c['usd_per_iteration'] / t['usd_per_iteration']):.1f}% of the dollars for "
              f"{100 * (c['iteration_s'] / t['iteration_s'] - 1):+.1f}% time; front {len(front)} plans", flush=True)
    document = {"time_limit_s": args.time_limit, "seed": args.seed,
                "prices": "catalog defaults (planner/inputs/catalog.py); egress $0.02/GB between regions unless "
                          "the topology sets network.egress_usd_per_gb; idle devices cost nothing",
                "topologies": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(document, indent=2) + "\n")
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
