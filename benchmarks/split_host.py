"""The host's time to run a block compiled as 1F1B runs it (``gpt.compile_stage``) and as ZB-H1 runs
it (``gpt.compile_split_stage``, its linear layers' weight gradients deferred and then applied), on
this machine's CPU with blocks so small that the calls, not the arithmetic, take the time: what a
ZB-H1 stage adds to its host's issue work, the quantity that sets a host-bound stage's pace on GPUs.

    python benchmarks/split_host.py [--repeats 500] [--label NAME] [--out benchmarks/results]

Prints a table (microseconds per block: forward alone, and forward + backward + the weight pass) and
writes ``split_host.json`` (one entry per ``--label``; other labels' entries kept). Each kind is
measured ``ROUNDS`` times, alternating, and the least taken (a shared machine's load only adds;
on the 2-core machine of ``benchmarks/results/split_host.json`` one kind's rounds still spread by
up to 40%, so compare the two kinds of one run, not runs).
"""

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from planner.inputs.model import model_preset  # noqa: E402
from planner.runtime.gpt import build_stage, compile_split_stage, compile_stage  # noqa: E402
from planner.runtime.split_backward import defer_weight_gradients  # noqa: E402

# Small enough that a block's arithmetic takes the CPU a few microseconds.
SPEC = replace(model_preset("tiny"), hidden=32, heads=2, sequence=8, ffn_hidden=64)
WARMUP = 5
ROUNDS = 4  # each kind measured this many times, alternating; the least taken


def per_block_us(split: bool, repeats: int) -> tuple:
    """(forward, forward + backward + weight pass) microseconds per block of a compiled stage."""
    torch._dynamo.reset()
    module = build_stage(SPEC, 1, SPEC.layers, seed=3)
    store = defer_weight_gradients(module) if split else None
    (compile_split_stage if split else compile_stage)(module)
    x = torch.randn(1, SPEC.sequence, SPEC.hidden, requires_grad=True)

    def step():
        y = module(x)
        if store is not None:
            store.deferring = True
        y.sum().backward()
        if store is not None:
            store.deferring = False
            store.apply(store.take())

    for _ in range(WARMUP):
        step()
    start = time.perf_counter()
    for _ in range(repeats):
        module(x)
    forward = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(repeats):
        step()
    both = time.perf_counter() - start
    blocks = SPEC.layers - 1
    return 1e6 * forward / repeats / blocks, 1e6 * both / repeats / blocks


def main() -> int:
    parser = argparse.ArgumentParser(description="Host time per block, 1F1B's compiled block against ZB-H1's.")
    parser.add_argument("--repeats", type=int, default=500)
    parser.add_argument("--label", default="current")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    runs = {"1f1b": [], "zb-h1": []}
    for _ in range(ROUNDS):
        for kind in runs:
            runs[kind].append(per_block_us(kind == "zb-h1", args.repeats))
    rows = {kind: {"forward_us": min(r[0] for r in got), "step_us": min(r[1] for r in got)}
            for kind, got in runs.items()}
    print(f"{'blocks compiled for':22} {'forward us/block':>16} {'step us/block':>14}")
    for kind, row in rows.items():
        print(f"{kind:22} {row['forward_us']:16.1f} {row['step_us']:14.1f}")
    path = Path(args.out) / "split_host.json"
    document = json.loads(path.read_text()) if path.exists() else {}
    document[args.label] = {"torch": torch.__version__, "repeats": args.repeats, "rows": rows}
    path.write_text(json.dumps(document, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
