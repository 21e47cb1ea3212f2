"""The search's estimate against the simulator on every finalist it simulated, before and after a
change to the estimate (``planner/search/evaluate.py``), on the shipped topologies.

    python benchmarks/estimate_error.py --before REV [--budget 5] [--seed 0] [--time-limit 120] [--workers 2]

For each shipped topology (``topologies/dtfm``, ``topologies/hetero``, ``topologies/emulated``), one
search with the training as the file asks (``warmup_depth`` 1) and one under ``warmup_depth: auto``,
at a fixed work budget and a time limit far above it (the budget ends every phase, so the plans do not
depend on the machine's load), in two trees: the planner at git revision ``REV`` (``git archive``)
and this tree, each search in its own process with its tree first on ``PYTHONPATH``. The search
ranks candidates by its estimate and simulates the best few; the error of a finalist is
``estimate / simulated - 1``. Prints, per topology and depth, the plan (simulated seconds, S x D,
schedule and depth), the gap, and the largest and mean absolute error over the finalists, before ->
after, and writes ``benchmarks/results/estimate_error.json``.
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

FOLDERS = ("dtfm", "hetero", "emulated")

_ONE_SEARCH = """
import json, sys
from dataclasses import replace
from planner.inputs.job import load_job
from planner.search.front import SearchOptions, search
source, depth, seed, limit, budget = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
job = load_job(source)
training = replace(job.training, warmup_depth="auto") if depth == "auto" else job.training
result = search(job.topology, job.model, training, SearchOptions(seed=seed, time_limit_s=limit, budget_s=budget))
plan = result.plan
errors = [f["estimate_s"] / f["simulated_s"] - 1.0 for f in plan.search.get("finalists", []) if f.get("fits")]
print(json.dumps({"predicted_s": result.predicted_s, "gap": result.gap, "stages": plan.stages,
                  "replicas": plan.replicas, "schedule": str(plan.schedule), "warmup_depth": plan.warmup_depth,
                  "errors": errors, "wall_s": plan.search.get("wall_s")}))
"""


def _run(task: tuple) -> dict:
    label, tree, source, depth, seed, time_limit, budget = task
    done = subprocess.run([sys.executable, "-c", _ONE_SEARCH, source, depth, str(seed), str(time_limit), str(budget)],
                          env={**os.environ, "PYTHONPATH": str(tree)}, cwd=str(tree), capture_output=True, text=True)
    row = {"topology": str(Path(source).relative_to(ROOT)), "depth": depth, "search": label}
    if done.returncode != 0:
        return {**row, "error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    return {**row, **json.loads(done.stdout.strip().splitlines()[-1])}


def _summary(row: dict) -> str:
    if "error" in row:
        return row["error"][:60]
    errors = [abs(e) for e in row["errors"]] or [0.0]
    depth = f" k{row['warmup_depth']}" if row["warmup_depth"] > 1 else ""
    return (f"{row['predicted_s']:8.3f} {row['stages']:>2}x{row['replicas']:<3} {row['schedule']}{depth}, "
            f"gap {100 * row['gap']:4.1f}%, error max {100 * max(errors):4.1f}% mean {100 * sum(errors) / len(errors):4.1f}% "
            f"({len(row['errors'])})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="git revision of the planner to compare with")
    parser.add_argument("--budget", type=float, default=5.0, help="the search's work budget, seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time-limit", type=float, default=120.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "estimate_error.json"))
    args = parser.parse_args()
    paths = [str(p) for folder in FOLDERS for p in sorted((ROOT / "topologies" / folder).glob("*.yaml"))]
    with tempfile.TemporaryDirectory() as before_tree:
        before_commit = _extract(args.before, before_tree)
        tasks = [(label, tree, path, depth, args.seed, args.time_limit, args.budget)
                 for path in paths for depth in ("1", "auto")
                 for label, tree in (("before", before_tree), ("after", ROOT))]
        with multiprocessing.Pool(args.workers) as pool:
            rows = pool.map(_run, tasks)
    for after in (r for r in rows if r["search"] == "after"):
        before = next(r for r in rows if r["search"] == "before" and r["topology"] == after["topology"]
                      and r["depth"] == after["depth"])
        print(f"{after['topology']:<42} depth {after['depth']:<4} {_summary(before)}  ->  {_summary(after)}")
    Path(args.output).write_text(json.dumps({
        "command": "python benchmarks/estimate_error.py " + " ".join(sys.argv[1:]), "before_commit": before_commit,
        "budget_s": args.budget, "seed": args.seed, "time_limit_s": args.time_limit, "rows": rows}, indent=1) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
