"""The lower bound every plan reports, before and after a change to ``planner/search/bounds.py``.

    python benchmarks/bounds.py --before REV [--budget 5] [--seed 0] [--time-limit 600] [--generated 1024]

For each shipped topology (``topologies/hetero``, ``topologies/dtfm``, ``topologies/emulated``) and
each generated one of ``--generated`` devices (``benchmarks/scale.py``'s, GPT-3 6.7B, two sequences
per device), one search under the time objective at a fixed work budget (``--budget``, seconds of
work at ``planner/search/deadline.py``'s rates; the limit far above it, so the budget, not the
clock, ends every phase and the plan does not depend on the machine's load), in two trees:

- before: the planner at git revision ``REV`` (extracted with ``git archive``);
- after: this tree.

Each search runs in its own process with its tree first on ``PYTHONPATH``. The plan's seconds are
the simulator's; the bound and the gap are what the search reports (``SearchResult.lower_bound_s``,
``gap``); ``bound_ms`` is one call of ``lower_bound_s`` on the asked job; ``least_pairs`` the three
(stages, replicas) pairs whose bounds (``bounds._pair_bounds_s``, every term) are lowest, the first of them
setting the bound: the pairs a tighter bound must lift. Prints topology | plan (s) | old bound |
new bound | old gap | new gap | plan's S x D | least pair and writes ``benchmarks/results/bounds.json``.
"""

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from structural_moves import ROOT, _extract  # noqa: E402

FOLDERS = ("hetero", "dtfm", "emulated")

_ONE_SEARCH = """
import json, sys, time
import yaml
from planner.inputs.job import load_job
from planner.inputs.model import model_preset, parse_training
from planner.inputs.topology import parse_topology
from planner.search import bounds
from planner.search.bounds import lower_bound_s
from planner.search.front import SearchOptions, search
source, seed, limit, budget = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
if source.startswith("generated-"):
    sys.path.insert(0, "benchmarks")
    from scale import generated_topology
    n = int(source.split("-")[1])
    topology = parse_topology(generated_topology(n), name=source)
    model = model_preset("gpt3-6.7b")
    training = parse_training({"global_batch": 2 * n, "micro_batch_size": 1, "precision": "auto",
                               "recompute": True, "flash_attention": True})
else:
    job = load_job(source)
    topology, model, training = job.topology, job.model, job.training
started = time.perf_counter()
result = search(topology, model, training, SearchOptions(seed=seed, time_limit_s=limit, budget_s=budget))
wall = time.perf_counter() - started
started = time.perf_counter()
lower_bound_s(topology, model, training)  # as the search calls it: at the asked precision, every device
bound_ms = 1e3 * (time.perf_counter() - started)
pairs = bounds._pair_bounds_s(topology, model, training)
least = sorted((float(b), s, d + 1) for s, bounds in pairs.items() for d, b in enumerate(bounds))[:3]
plan = result.plan
print(json.dumps({"predicted_s": result.objective_s, "lower_bound_s": result.lower_bound_s, "gap": result.gap,
                  "stages": plan.stages, "replicas": plan.replicas, "used": plan.stages * plan.replicas,
                  "devices": topology.size, "wall_s": round(wall, 2), "bound_ms": round(bound_ms, 2),
                  "clock_cut": plan.search.get("clock_cut", []),
                  "least_pairs": [{"stages": s, "replicas": d, "bound_s": b} for b, s, d in least]}))
"""


def _run(task: tuple) -> dict:
    label, tree, source, seed, time_limit, budget = task
    done = subprocess.run([sys.executable, "-c", _ONE_SEARCH, str(source), str(seed), str(time_limit), str(budget)],
                          env={**os.environ, "PYTHONPATH": str(tree)}, cwd=str(tree), capture_output=True, text=True)
    name = source if source.startswith("generated-") else str(Path(source).relative_to(ROOT))
    row = {"topology": name, "seed": seed, "budget_s": budget, "search": label}
    if done.returncode != 0:
        return {**row, "error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    return {**row, **json.loads(done.stdout.strip().splitlines()[-1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="git revision of the planner to compare with")
    parser.add_argument("--budget", type=float, default=5.0, help="the search's work budget, seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-limit", type=float, default=600.0)
    parser.add_argument("--generated", type=int, nargs="*", default=[], help="sizes of generated topologies")
    parser.add_argument("--only", nargs="*", default=[], help="topology paths (default: every shipped one)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "bounds.json"))
    args = parser.parse_args()
    paths = ([str(ROOT / p) for p in args.only] if args.only else
             [str(p) for folder in FOLDERS for p in sorted((ROOT / "topologies" / folder).glob("*.yaml"))])
    sources = paths + [f"generated-{n}" for n in args.generated]
    with tempfile.TemporaryDirectory() as before_tree:
        before_commit = _extract(args.before, before_tree)
        tasks = [(label, tree, s, args.seed, args.time_limit, args.budget) for s in sources
                 for label, tree in (("before", before_tree), ("after", ROOT))]
        with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
            rows = pool.map(_run, tasks, chunksize=1)
    header = (f"{'topology':<44} {'plan (s)':>9} {'old bound':>9} {'new bound':>9} {'old gap':>7} {'new gap':>7} "
              f"{'S x D':>9} {'least':>9} {'bound ms':>8}")
    print(header)
    print("-" * len(header))
    table = []
    for row in (r for r in rows if r["search"] == "after"):
        before = next(r for r in rows if r["search"] == "before" and r["topology"] == row["topology"])
        if "error" in row or "error" in before:
            print(f"{row['topology']:<44} {row.get('error') or before.get('error')}")
            continue
        same = abs(before["predicted_s"] - row["predicted_s"]) <= 1e-9 * row["predicted_s"]
        old_gap = 1.0 - before["lower_bound_s"] / row["predicted_s"]  # the old bound against this plan
        table.append({"topology": row["topology"], "plan_s": row["predicted_s"], "old_bound_s": before["lower_bound_s"],
                      "new_bound_s": row["lower_bound_s"], "old_gap": old_gap, "new_gap": row["gap"],
                      "same_plan": same, "stages": row["stages"], "replicas": row["replicas"],
                      "devices": row["devices"], "bound_ms": row["bound_ms"],
                      "least_pairs": row.get("least_pairs", [])})
        least = row.get("least_pairs") or [{"stages": "-", "replicas": "-"}]
        print(f"{row['topology']:<44} {row['predicted_s']:9.3f} {before['lower_bound_s']:9.3f} "
              f"{row['lower_bound_s']:9.3f} {old_gap:7.1%} {row['gap']:7.1%} "
              f"{row['stages']:>4}x{row['replicas']:<4} {least[0]['stages']:>4}x{least[0]['replicas']:<4} "
              f"{row['bound_ms']:8.1f}" + ("" if same else "  (plan differs)"))
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    with open(args.output, "w") as handle:
        json.dump({"command": " ".join(["python", "benchmarks/bounds.py"] + sys.argv[1:]),
                   "before_commit": before_commit, "seed": args.seed, "budget_s": args.budget,
                   "time_limit_s": args.time_limit, "table": table, "rows": rows}, handle, indent=1)


if __name__ == "__main__":
    main()
