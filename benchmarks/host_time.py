"""The host's and the device's seconds per stage and op kind in the traced iteration of ``plan
launch`` results (``measured.trace``: each op's ``host_s``, the host's time issuing it, and its
``start_s``/``end_s`` on the device clock), summed over the iteration's micro-batches: where a stage's
host time nears its iteration, the host sets the pace.

    python benchmarks/host_time.py RESULTS.json [RESULTS.json ...]

Prints a table per file; writes nothing.
"""

import json
import sys
from pathlib import Path


def per_op(results: dict) -> dict:
    """{(stage, kind): (host seconds, device seconds, ops)} of the traced iteration."""
    table = {}
    for op in results["measured"]["trace"]:
        host, device, count = table.get((op["stage"], op["kind"]), (0.0, 0.0, 0))
        table[(op["stage"], op["kind"])] = (host + (op.get("host_s") or 0.0), device + op["end_s"] - op["start_s"],
                                            count + 1)
    return table


def main(paths: list) -> int:
    for path in paths:
        results = json.loads(Path(path).read_text())
        print(f"{path}: median {results['measured']['median_s']:.4f} s an iteration")
        print(f"  {'stage':>5} {'op':12} {'ops':>4} {'host s':>8} {'device s':>9}")
        for (stage, kind), (host, device, count) in sorted(per_op(results).items()):
            print(f"  {stage:>5} {kind:12} {count:>4} {host:8.4f} {device:9.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
