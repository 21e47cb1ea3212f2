"""Topology parsing time at scale: the scale benchmark's generated topologies (8-GPU hosts, about 16
hosts per region, every region pair listed) through ``parse_topology``.

    python benchmarks/parse_scale.py [--sizes 1024 4096 10000]

Prints a table and writes ``benchmarks/results/parse_scale.json``.
"""

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from planner.inputs.topology import parse_topology  # noqa: E402
from scale import generated_topology  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 10000])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "parse_scale.json"))
    args = parser.parse_args()
    rows = []
    print(f"{'devices':>7} {'region pairs':>12} {'parse s':>8}")
    for n in args.sizes:
        document = generated_topology(n)
        started = time.perf_counter()
        parse_topology(document, name=f"generated-{n}")
        row = {"devices": n, "region_pairs": len(document["network"].get("region_pairs", [])),
               "parse_s": time.perf_counter() - started}
        rows.append(row)
        print(f"{n:7d} {row['region_pairs']:12d} {row['parse_s']:8.2f}", flush=True)
    Path(args.out).write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
