"""Do the plan space's new dimensions put weak devices to work? Idle devices and predicted time
before and after, on the shipped heterogeneous topologies.

    python benchmarks/plan_space.py [--time-limit 10]

For each topology in ``topologies/hetero/``, four searches with the same seed and limit:

- before: pipeline x data parallelism as the planner had it: the optimizer state whole on every
  replica (``shard_optimizer: false``) and recomputation as the file fixes it (``auto`` read as on);
- after: the optimizer state sharded over each stage's replicas and ``recompute: auto``, no tensor
  parallelism (``--tensor-degrees 1``);
- tensor: the after settings with tensor groups inside hosts (the default: degrees 1, 2, 4, 8);
- fastest type alone: the tensor settings on the devices of the fastest type only (the plan a user
  gets by leaving the other devices out).

Precision is the same in all three (``auto``: bf16 where every used device has it, else fp16).
Prints a table and writes ``benchmarks/results/plan_space.json``.
"""

import argparse
import json
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.errors import InputError  # noqa: E402
from planner.inputs.job import load_job  # noqa: E402
from planner.inputs.topology import parse_topology  # noqa: E402
from planner.io import read_yaml  # noqa: E402
from planner.plan.recompute import plan_modes  # noqa: E402
from planner.search.front import SearchOptions, search  # noqa: E402


def _fastest_type_only(path: Path):
    """The topology with the devices of its fastest type (by peak FLOP/s) only, or None if it has one type."""
    job = load_job(path)
    types = {d.type_name: d for d in job.topology.devices}
    if len(types) < 2:
        return None
    fastest = max(types, key=lambda t: types[t].effective_flops("auto"))
    document = read_yaml(path)
    document["devices"] = [e for e in document["devices"] if e.get("type") == fastest]
    kept = {d.host for d in job.topology.devices if d.type_name == fastest}
    network = document["network"]
    network.pop("pairs", None)
    regions = {d.region for d in job.topology.devices if d.type_name == fastest}
    if "region_pairs" in network:
        network["region_pairs"] = [p for p in network["region_pairs"]
                                   if {p.get("from"), p.get("to")} <= regions] or None
        if network["region_pairs"] is None:
            network.pop("region_pairs")
    if "nics" in network:
        network["nics"] = [n for n in network["nics"] if n["host"] in kept] or None
        if network["nics"] is None:
            network.pop("nics")
    return parse_topology(document, name=f"{job.topology.name}-{fastest}-only"), fastest


def _run(topology, model, training, options) -> dict:
    started = time.perf_counter()
    try:
        result = search(topology, model, training, options)
    except InputError as error:
        return {"fits": False, "error": str(error), "wall_s": time.perf_counter() - started}
    plan = result.plan
    return {"fits": True, "predicted_s": result.predicted_s, "stages": plan.stages, "replicas": plan.replicas,
            "used": len(plan.used_devices), "idle": len(plan.idle), "tensor_groups": [list(g) for g in plan.tensor_groups],
            "recompute": result.training.recompute, "shard_optimizer": result.training.shard_optimizer,
            "precision": result.training.precision, "schedule": str(plan.schedule), "warmup_depth": plan.warmup_depth,
            "recompute_workers": dict(Counter(m for row in plan_modes(plan, result.training) for m in row)),
            "recompute_tried": plan.search.get("recompute_tried"),
            "lower_bound_s": result.lower_bound_s, "gap": result.gap, "wall_s": time.perf_counter() - started}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                        help="each search's work budget (the same plans whatever the machine's load, while "
                             "--time-limit leaves it time); default: the time limit's share")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "plan_space.json"))
    args = parser.parse_args()
    options = SearchOptions(seed=args.seed, time_limit_s=args.time_limit, budget_s=args.budget)
    no_tensor = replace(options, tensor_degrees=(1,))
    rows = []
    for path in sorted((ROOT / "topologies" / "hetero").glob("*.yaml")):
        job = load_job(path)
        asked = replace(job.training, precision="auto")
        before = replace(asked, shard_optimizer=False, recompute=asked.recompute is not False)
        after = replace(asked, shard_optimizer="auto", recompute="auto")
        row = {"topology": job.topology.name, "devices": job.topology.size,
               "before": _run(job.topology, job.model, before, no_tensor),
               "after": _run(job.topology, job.model, after, no_tensor),
               "tensor": _run(job.topology, job.model, after, options)}
        alone = _fastest_type_only(path)
        if alone is not None:
            row["fastest_type"] = alone[1]
            row["fastest_type_alone"] = _run(alone[0], job.model, after, options)
        rows.append(row)
        print(f"{path.name} done", flush=True)

    def cell(r):
        if not r["fits"]:
            return f"{'no plan':>10} {'-':>9}"
        return f"{r['predicted_s']:10.2f} {r['idle']:4d} idle"

    def ratio(slow, fast):
        return slow["predicted_s"] / fast["predicted_s"] if slow and fast and slow["fits"] and fast["fits"] else None

    def times(x):
        return f"{x:.2f}x" if x else "-"

    print(f"\n{'topology':30} {'devices':>7}  {'before s':>10} {'':>9}  {'after s':>10} {'':>9}  "
          f"{'tensor s':>10} {'':>9}  {'speed-up':>8}  {'tensor':>6}  {'fastest type alone s':>20}  "
          f"{'tensor vs alone':>15}  tensor groups (sizes)")
    for row in rows:
        b, a, t, f = row["before"], row["after"], row["tensor"], row.get("fastest_type_alone")
        row["speedup"] = ratio(b, a)  # the sharded state and recompute choice
        row["tensor_speedup"] = ratio(a, t)  # tensor groups on top of them
        row["tensor_vs_fastest_type_alone"] = ratio(f, t)
        alone_cell = f"{f['predicted_s']:.2f} ({row['fastest_type']})" if f and f["fits"] else "-"
        sizes = sorted({len(g) for g in t.get("tensor_groups", [])})
        print(f"{row['topology']:30} {row['devices']:7d}  {cell(b)}  {cell(a)}  {cell(t)}  "
              f"{times(row['speedup']):>8}  {times(row['tensor_speedup']):>6}  {alone_cell:>20}  "
              f"{times(row['tensor_vs_fastest_type_alone']):>15}  "
              f"{len(t.get('tensor_groups', []))} ({', '.join(map(str, sizes)) or '-'})")
    Path(args.out).write_text(json.dumps({"time_limit_s": args.time_limit, "budget_s": args.budget, "seed": args.seed, "rows": rows},
                                         indent=1) + "\n")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
