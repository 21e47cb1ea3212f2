"""Estimate-against-simulator errors measured in two planner trees: the revision ``--before`` and
this one, a script per cell run in its own process with its tree first on ``PYTHONPATH``
(``benchmarks/estimate_random.py``, ``benchmarks/estimate_syncs.py``)."""

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from structural_moves import ROOT, _extract

__all__ = ["tree_arguments", "errors_in_trees", "summary", "write_rows"]


def tree_arguments(description: str, output: str, **switches):
    """The command line of such a benchmark: ``--before``, ``--seeds``, ``--workers``, ``--output``
    (default ``benchmarks/results/<output>``) and a ``--name`` switch for each of ``switches``
    (name: help; ``no_nics`` is ``--no-nics``), parsed."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--before", required=True, help="git revision of the planner to compare with")
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / output))
    for name, text in switches.items():
        parser.add_argument("--" + name.replace("_", "-"), action="store_true", help=text)
    return parser.parse_args()


def write_rows(args, script: str, before_commit: str, rows: list) -> None:
    """Write ``rows`` with the command that made them to ``args.output``."""
    Path(args.output).write_text(json.dumps({
        "command": f"python benchmarks/{script} " + " ".join(sys.argv[1:]), "before_commit": before_commit,
        "seeds": args.seeds, "rows": rows}, indent=1) + "\n")
    print(f"wrote {args.output}")


def _run(task: tuple) -> dict:
    label, tree, script, cell, arguments, stdin = task
    done = subprocess.run([sys.executable, "-c", script, *arguments], input=stdin,
                          env={**os.environ, "PYTHONPATH": str(tree)}, cwd=str(tree), capture_output=True, text=True)
    row = {"search": label, **cell}
    if done.returncode != 0:
        return {**row, "error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    return {**row, "errors": json.loads(done.stdout.strip().splitlines()[-1])}


def errors_in_trees(before: str, script: str, cells: list, workers: int) -> tuple:
    """(the full commit of ``before``, rows): for each ``(cell, arguments, stdin)`` of ``cells``,
    ``script`` run with ``arguments`` (and ``stdin``) in the tree of ``before`` and in this one,
    which prints a JSON list of ``estimate / simulated - 1`` as its last line; each row is the cell
    (a dict) with ``search`` ("before" or "after") and ``errors`` (or ``error``: the script's last
    line of stderr), before and after in turn."""
    with tempfile.TemporaryDirectory() as before_tree:
        commit = _extract(before, before_tree)
        tasks = [(label, tree, script, cell, arguments, stdin) for cell, arguments, stdin in cells
                 for label, tree in (("before", before_tree), ("after", ROOT))]
        with multiprocessing.Pool(workers) as pool:
            return commit, pool.map(_run, tasks)


def summary(row: dict, threshold_pct: float) -> str:
    """Median, largest and least error of ``row`` and how many lie beyond +-``threshold_pct``."""
    if "error" in row:
        return row["error"][:60]
    e = 100 * np.array(row["errors"])
    t = threshold_pct
    return (f"median {np.median(e):+5.1f}% max {e.max():+6.1f}% min {e.min():+6.1f}% "
            f"over {t:g}%: {(e > t).sum():2d} under -{t:g}%: {(e < -t).sum():2d} ({len(e)})")
