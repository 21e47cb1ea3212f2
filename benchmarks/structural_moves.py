"""Do cluster layouts and structural moves find better plans? Every shipped topology, before and after.

    python benchmarks/structural_moves.py --before REV [--time-limit 30] [--budget 4000] [--seeds 0 1 2]

For each topology file under ``topologies/`` (device and model presets left out) and each seed, two
searches under the time objective (``plan TOPOLOGY``), same limit and evaluation budget:

- before: the planner at git revision ``REV`` (extracted with ``git archive``), e.g. the last commit
  without cluster layouts: devices picked fastest-first, single swaps in the local search;
- after: this tree: the cluster layouts of the bandwidth graph, the structural moves with bounded
  walks over equal-cost moves, and the estimate's rings chained by region.

Each search runs in its own process with that tree first on ``PYTHONPATH``.

The predicted iteration is the simulator's, of the plan each search returns. Prints a table (per
topology: each seed's before -> after) and writes ``benchmarks/results/structural_moves.json``,
with each search's shape, idle devices and the phases the clock cut (a cut phase makes the result
depend on the machine's load).
"""

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOT_TOPOLOGIES = ("devices", "models")  # preset folders under topologies/

_ONE_SEARCH = """
import json, sys, time
from planner.inputs.job import load_job
from planner.search.front import SearchOptions, search
path, seed, limit, budget = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
job = load_job(path)
started = time.perf_counter()
result = search(job.topology, job.model, job.training,
                SearchOptions(seed=seed, time_limit_s=limit, max_evaluations=budget))
plan = result.plan
print(json.dumps({"predicted_s": result.predicted_s, "stages": plan.stages, "replicas": plan.replicas,
                  "idle": len(plan.idle), "schedule": str(plan.schedule), "evaluations": result.evaluations,
                  "wall_s": round(time.perf_counter() - started, 2), "clock_cut": plan.search.get("clock_cut", [])}))
"""


def shipped_topologies() -> list:
    return sorted(p for p in (ROOT / "topologies").rglob("*.yaml") if p.parent.name not in NOT_TOPOLOGIES)


def _run(task: tuple) -> dict:
    label, tree, path, seed, time_limit, budget = task
    done = subprocess.run([sys.executable, "-c", _ONE_SEARCH, str(path), str(seed), str(time_limit), str(budget)],
                          env={**os.environ, "PYTHONPATH": str(tree)}, cwd=str(tree), capture_output=True, text=True,
                          check=True)
    return {"topology": str(Path(path).relative_to(ROOT)), "seed": seed, "search": label,
            **json.loads(done.stdout.strip().splitlines()[-1])}


def _extract(revision: str, folder: str) -> str:
    """The tree of ``revision`` under ``folder``; its full commit id."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", revision], capture_output=True, text=True,
                          check=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="git revision of the planner to compare with")
    parser.add_argument("--time-limit", type=float, default=30.0)
    parser.add_argument("--budget", type=int, default=4000, help="local-search evaluations (SearchOptions.max_evaluations)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--only", nargs="*", default=[], help="topology paths (default: every shipped one)")
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "structural_moves.json"))
    args = parser.parse_args()
    paths = [ROOT / p for p in args.only] if args.only else shipped_topologies()
    with tempfile.TemporaryDirectory() as before_tree:
        before_commit = _extract(args.before, before_tree)
        tasks = [(label, tree, p, seed, args.time_limit, args.budget)
                 for p in paths for seed in args.seeds for label, tree in (("before", before_tree), ("after", ROOT))]
        with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
            rows = pool.map(_run, tasks, chunksize=1)
    print(f"{'topology':44s} {'seed':>4s} {'before s':>9s} {'shape':>7s} {'after s':>9s} {'shape':>7s} "
          f"{'change':>7s}  clock cut")
    summary = {}
    for path in paths:
        name = str(path.relative_to(ROOT))
        for seed in args.seeds:
            before, after = (next(r for r in rows if r["topology"] == name and r["seed"] == seed and r["search"] == k)
                             for k in ("before", "after"))
            change = after["predicted_s"] / before["predicted_s"] - 1.0
            cut = ",".join(sorted(set(before["clock_cut"]) | set(after["clock_cut"]))) or "-"
            print(f"{name:44s} {seed:4d} {before['predicted_s']:9.3f} {before['stages']:>3d}x{before['replicas']:<3d} "
                  f"{after['predicted_s']:9.3f} {after['stages']:>3d}x{after['replicas']:<3d} {change:+7.1%}  {cut}")
            summary.setdefault(name, []).append(change)
    worse = {k: max(v) for k, v in summary.items() if max(v) > 1e-9}
    print(f"topologies worse after on some seed: {len(worse)} of {len(summary)}"
          + "".join(f"\n  {k}: {v:+.2%}" for k, v in worse.items()))
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    with open(args.output, "w") as handle:
        json.dump({"command": " ".join(["python", "benchmarks/structural_moves.py"] + sys.argv[1:]),
                   "before_commit": before_commit, "time_limit_s": args.time_limit, "budget": args.budget, "seeds": args.seeds,
                   "rows": rows}, handle, indent=1)


if __name__ == "__main__":
    main()
