"""What the search benchmarks run at a work budget share: their arguments (the budget, the clock's
cap far above it, so the same plans on any machine; the seed; the JSON written) and that JSON."""

import argparse
import json
from pathlib import Path

from planner.search.front import SearchOptions

__all__ = ["budget_parser", "search_options", "write_rows"]

ROOT = Path(__file__).resolve().parent.parent


def budget_parser(description: str, *, budget_s: float, time_limit_s: float, out_name: str) -> argparse.ArgumentParser:
    """``--budget``, ``--time-limit``, ``--seed`` and ``--out`` (``benchmarks/results/<out_name>``)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--budget", type=float, default=budget_s, metavar="SECONDS")
    parser.add_argument("--time-limit", type=float, default=time_limit_s)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / out_name))
    return parser


def search_options(args) -> SearchOptions:
    return SearchOptions(seed=args.seed, time_limit_s=args.time_limit, budget_s=args.budget)


def write_rows(args, command: str, rows: list) -> None:
    """The benchmark's JSON: the command, its budget, limit and seed, and its rows."""
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"command": command, "budget_s": args.budget, "time_limit_s": args.time_limit,
                                          "seed": args.seed, "rows": rows}, indent=1) + "\n")
