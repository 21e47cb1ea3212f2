"""How the work budget is split between the search without tensor groups and the grouped search.

    python benchmarks/budget_split.py --before REV [--budgets 2 4 8] [--seed 0] [--time-limit 120]

For each topology file under ``topologies/`` (device and model presets left out) and each work
budget (``--budget``, seconds of work at ``planner/search/deadline.py``'s rates), two searches under
the time objective, same seed, budget and time limit (a limit far above the budget, so the work
budget, not the clock, ends every phase):

- before: the planner at git revision ``REV`` (extracted with ``git archive``);
- after: this tree, or the revision ``--after``.

Each search runs in its own process with that tree first on ``PYTHONPATH``. The predicted iteration
is the simulator's, of the plan each search returns; ``tensor_tried`` is each grouping's best.
Prints a table (per topology and budget: before -> after) and writes
``benchmarks/results/budget_split.json``.
"""

import argparse
import json
import multiprocessing
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from structural_moves import ROOT, _extract, shipped_topologies  # noqa: E402

_ONE_SEARCH = """
import json, sys, time
from planner.inputs.job import load_job
from planner.search.front import SearchOptions, search
path, seed, limit, budget = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
job = load_job(path)
started = time.perf_counter()
result = search(job.topology, job.model, job.training, SearchOptions(seed=seed, time_limit_s=limit, budget_s=budget))
plan = result.plan
print(json.dumps({"predicted_s": result.predicted_s, "stages": plan.stages, "replicas": plan.replicas,
                  "tensor_groups": len(plan.tensor_groups or ()), "tensor_tried": plan.search.get("tensor_tried", {}),
                  "wall_s": round(time.perf_counter() - started, 2), "clock_cut": plan.search.get("clock_cut", [])}))
"""


def _run(task: tuple) -> dict:
    import os
    import subprocess

    label, tree, path, seed, time_limit, budget = task
    done = subprocess.run([sys.executable, "-c", _ONE_SEARCH, str(path), str(seed), str(time_limit), str(budget)],
                          env={**os.environ, "PYTHONPATH": str(tree)}, cwd=str(tree), capture_output=True, text=True)
    row = {"topology": str(Path(path).relative_to(ROOT)), "seed": seed, "budget_s": budget, "search": label}
    if done.returncode != 0:  # no plan for this file at this budget: the error's last line
        return {**row, "error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    return {**row, **json.loads(done.stdout.strip().splitlines()[-1])}


def _cell(row: dict) -> str:
    if "error" in row:
        return f"{'no plan':>9s} {'':7s}"
    return f"{row['predicted_s']:9.3f} {row['stages']:>3d}x{row['replicas']:<3d}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="git revision of the planner to compare with")
    parser.add_argument("--after", help="git revision to compare (default: this tree)")
    parser.add_argument("--budgets", type=float, nargs="+", default=[2.0, 4.0, 8.0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-limit", type=float, default=120.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--only", nargs="*", default=[], help="topology paths (default: every shipped one)")
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "budget_split.json"))
    args = parser.parse_args()
    paths = [ROOT / p for p in args.only] if args.only else shipped_topologies()
    with tempfile.TemporaryDirectory() as before_tree, tempfile.TemporaryDirectory() as after_tree:
        before_commit = _extract(args.before, before_tree)
        after_commit = _extract(args.after, after_tree) if args.after else None
        after = after_tree if args.after else ROOT
        tasks = [(label, tree, p, args.seed, args.time_limit, budget) for p in paths for budget in args.budgets
                 for label, tree in (("before", before_tree), ("after", after))]
        with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
            rows = pool.map(_run, tasks, chunksize=1)
    print(f"{'topology':44s} {'budget':>6s} {'before s':>9s} {'shape':>7s} {'after s':>9s} {'shape':>7s} {'change':>7s}")
    worse = []
    for path in paths:
        name = str(path.relative_to(ROOT))
        for budget in args.budgets:
            before, after = (next(r for r in rows if r["topology"] == name and r["budget_s"] == budget
                                  and r["search"] == k) for k in ("before", "after"))
            change = (after["predicted_s"] / before["predicted_s"] - 1.0
                      if "error" not in before and "error" not in after else float("nan"))
            if change > 1e-9:
                worse.append((name, budget, change))
            print(f"{name:44s} {budget:6.1f} {_cell(before)} {_cell(after)} {change:+7.1%}")
    print(f"worse after: {len(worse)} of {len(paths) * len(args.budgets)}"
          + "".join(f"\n  {n} at {b:g}: {c:+.2%}" for n, b, c in worse))
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    with open(args.output, "w") as handle:
        json.dump({"command": " ".join(["python", "benchmarks/budget_split.py"] + sys.argv[1:]),
                   "before_commit": before_commit, "after_commit": after_commit, "seed": args.seed, "budgets_s": args.budgets,
                   "time_limit_s": args.time_limit, "rows": rows}, handle, indent=1)


if __name__ == "__main__":
    main()
