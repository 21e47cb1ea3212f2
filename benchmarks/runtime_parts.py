"""Where a stage's time goes on one GPU: a block's forward and backward (eager and under
``torch.compile``), the LM head with its loss (vocabulary as given and padded to a multiple of 128),
the embedding, the optimizer step over a stage's parameters, and a boundary message between two GPUs.

Run on a host with a CUDA GPU (two for the message row), from the repository root:

    python benchmarks/runtime_parts.py --model gpt3-xl --micro-batch-size 2 --out benchmarks/results

Prints a table (milliseconds and the matrix units' achieved TFLOP/s) and writes ``runtime_parts.json``.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _timed_ms(fn, repeats: int) -> float:
    """Median milliseconds of ``fn`` over ``repeats`` runs after two warm-ups, CUDA-synchronised."""
    import torch

    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def _message_ms(shape, dtype, repeats: int) -> float | None:
    """One-way time of a boundary tensor from GPU 0 to GPU 1 (half a ping-pong), or None."""
    import torch

    if torch.cuda.device_count() < 2:
        return None
    a = torch.randn(shape, device="cuda:0", dtype=dtype)
    b = torch.empty(shape, device="cuda:1", dtype=dtype)

    def ping_pong():
        b.copy_(a)
        a.copy_(b)

    return _timed_ms(ping_pong, repeats) / 2


def measure(model, micro_batch_size: int, layers_per_stage: int, repeats: int) -> list:
    import torch
    import torch.nn.functional as F

    from cost_models.flops import head_forward_flops, layer_forward_flops, padded_vocabulary
    from planner.runtime.calibrate import split_backward_step
    from planner.runtime.gpt import Block, make_norm
    from planner.runtime.precision import MasterWeightOptimizer

    device, dtype = torch.device("cuda"), torch.bfloat16
    b, s, h, v = micro_batch_size, model.sequence, model.hidden, model.vocabulary
    rows = []

    def row(part, ms, flops=None, note=""):
        rows.append({"part": part, "ms": ms, "tflops": flops / ms / 1e9 if flops else None, "note": note})

    block = Block(model).to(device=device, dtype=dtype)
    x = torch.randn(b, s, h, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn_like(x)
    fwd = layer_forward_flops(b, s, h, model.ffn_hidden, gated_mlp=model.gated_mlp)
    compiled = torch.compile(block)
    for name, module in (("block", block), ("block, torch.compile", compiled)):
        with torch.no_grad():
            row(f"{name}: forward", _timed_ms(lambda: module(x), repeats), fwd)
        row(f"{name}: forward + backward", _timed_ms(lambda: module(x).backward(grad), repeats), 3 * fwd)
    # Full recomputation as the runtime runs it (the checkpoint inside the compiled block): FLOPs
    # counted at 4 forwards, so the ratio to the row above is what plan calibrate's
    # recompute_efficiency measures.
    recomputed = Block(model).to(device=device, dtype=dtype)
    recomputed.recompute = True
    recomputed.compile()
    row("block, torch.compile, recomputed: forward + backward",
        _timed_ms(lambda: recomputed(x).backward(grad), repeats), 4 * fwd, "checkpoint inside the compiled block")
    # As a stage runs them: blocks in a chain, per block; and ZB-H1's split backward (linear layers
    # eager, weight gradients deferred, the rest compiled), alone and chained (as plan calibrate times it,
    # calibrate.PROBE_BLOCKS blocks).
    chain = torch.nn.Sequential(*(Block(model) for _ in range(layers_per_stage))).to(device=device, dtype=dtype)
    for member in chain:
        member.compile()
    row(f"block, torch.compile, {layers_per_stage} chained: forward + backward, per block",
        _timed_ms(lambda: chain(x).backward(grad), repeats) / layers_per_stage, 3 * fwd)
    row("block, split backward (ZB-H1): forward + input grads + weight grads",
        _timed_ms(split_backward_step(model, x, grad, compiled=True), repeats), 3 * fwd, "one block alone")
    row(f"block, split backward (ZB-H1), {layers_per_stage} chained, per block",
        _timed_ms(split_backward_step(model, x, grad, compiled=True, blocks=layers_per_stage), repeats)
        / layers_per_stage, 3 * fwd)

    norm = make_norm(model, h).to(device=device, dtype=dtype)
    targets = torch.randint(0, v, (b, s), device=device)
    for rows_, label in ((v, f"V = {v}"), (padded_vocabulary(v), f"padded to {padded_vocabulary(v)}")):
        weight = torch.nn.Parameter(torch.randn(rows_, h, device=device, dtype=dtype) * 0.02)
        head_flops = head_forward_flops(b, s, h, rows_)

        def head_step(weight=weight, float_loss=True):
            logits = F.linear(norm(x), weight)[..., :v]
            logits = logits.float() if float_loss else logits
            F.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()

        row(f"head + loss, {label}", _timed_ms(head_step, repeats), 3 * head_flops, "fp32 loss (as the runtime)")
        row(f"head + loss, {label}, bf16 loss", _timed_ms(lambda: head_step(float_loss=False), repeats),
            3 * head_flops)
        with torch.no_grad():
            row(f"head matmul only, {label}", _timed_ms(lambda: F.linear(x, weight), repeats), head_flops)

    embed = torch.nn.Embedding(padded_vocabulary(v), h).to(device=device, dtype=dtype)
    tokens = torch.randint(0, v, (b, s), device=device)
    row("embedding: forward + backward", _timed_ms(lambda: embed(tokens).backward(grad), repeats))

    stage = torch.nn.ModuleList(Block(model) for _ in range(layers_per_stage)).to(device=device, dtype=dtype)
    parameters = list(stage.parameters())
    for p in parameters:
        p.grad = torch.randn_like(p) * 1e-3
    optimizer = MasterWeightOptimizer(parameters, "adam", 1e-4, fused=True)
    count = sum(p.numel() for p in parameters)
    row(f"optimizer step, {layers_per_stage} blocks (fp32 masters, fused Adam)",
        _timed_ms(optimizer.step, repeats), note=f"{count / 1e6:.0f} M parameters")
    message = _message_ms((b, s, h), dtype, repeats)
    if message is not None:
        row("boundary message GPU 0 -> GPU 1 (copy)", message, note=f"{b * s * h * 2 / 1e6:.1f} MB")
    return rows


def main() -> int:
    import torch

    from planner.inputs.model import model_preset

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="gpt3-xl")
    parser.add_argument("--micro-batch-size", type=int, default=2)
    parser.add_argument("--layers-per-stage", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    model = model_preset(args.model)
    rows = measure(model, args.micro_batch_size, args.layers_per_stage, args.repeats)
    print(f"{'part (' + args.model + ', micro-batch ' + str(args.micro_batch_size) + ', bf16)':64} {'ms':>8} "
          f"{'TFLOP/s':>8}  note")
    for r in rows:
        tflops = f"{r['tflops']:8.1f}" if r["tflops"] else " " * 8
        print(f"{r['part']:64} {r['ms']:8.3f} {tflops}  {r['note']}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "runtime_parts.json").write_text(json.dumps({
        "model": args.model, "micro_batch_size": args.micro_batch_size, "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
