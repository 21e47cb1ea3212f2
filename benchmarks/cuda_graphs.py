"""Blocks compiled with and without CUDA graphs, whole and as tensor-group members: the time a
block's forward and backward takes the GPU, the host's time to issue it, the gradients and the peak
memory, in the two patterns a stage runs its micro-batches (GPipe: every forward, then every
backward; 1F1B: one backward after each forward past the first).

For each degree ``t`` (1: a whole GPU's block; else the runtime's ``shard_stage`` share over the first
``t`` GPUs) and micro-batch ``b``, ``BLOCKS`` GPT-3 XL blocks (the topology's model) are compiled as
``plan launch`` compiles them (``default``) and as CUDA graphs (``reduce-overhead``, as
``--compile graphs`` and tensor-group stages under ``auto`` run them), ``MICRO_BATCHES`` micro-batches
flow through them per step, gradients accumulated in place. Where the host's issue time nears the
GPU's, the graphs pay; the gradient norms of the two modes must agree (the script fails if they
are more than ``GRADIENT_TOLERANCE`` apart).

    python benchmarks/cuda_graphs.py --topology topologies/local/h100-x4.yaml --degrees 1 2 4 --micro-batches 2 4

Prints a table and writes ``cuda_graphs.json`` to ``--out`` (``benchmarks/results/cuda_graphs_h200x4.json``:
4x H200). Needs CUDA GPUs (NCCL).
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BLOCKS = 8
MICRO_BATCHES = 4
MODES = ("default", "reduce-overhead")
GRADIENT_TOLERANCE = 1e-3  # bf16 sums in another order: 2e-5 apart on 4x H200


def _steps(blocks, xs, grads):
    """(GPipe step, 1F1B step) over ``xs``, each a new CUDA-graph step."""
    import torch

    def forward(x):
        for block in blocks:
            x = block(x)
        return x

    def gpipe():
        torch.compiler.cudagraph_mark_step_begin()
        ys = [forward(x) for x in xs]
        for y, g in zip(ys, grads):
            y.backward(g)

    def one_f_one_b():
        torch.compiler.cudagraph_mark_step_begin()
        ys = []
        for k, x in enumerate(xs):
            ys.append(forward(x))
            if k >= 1:
                ys[k - 1].backward(grads[k - 1])
        ys[-1].backward(grads[-1])

    return {"gpipe": gpipe, "1f1b": one_f_one_b}


def _measure(holder, xs, steps, repeats: int) -> dict:
    import torch

    row = {}
    for name, step in steps.items():
        for p in holder.parameters():  # accumulated in place, outside the graphs' pool (as ZeRO-1's buffers)
            p.grad = torch.zeros_like(p)
        for x in xs:
            x.grad = torch.zeros_like(x)
        for _ in range(3):  # warm-up, recording, first replay
            step()
        torch.cuda.synchronize()
        samples = []
        for _ in range(repeats):
            start = time.perf_counter()
            step()
            torch.cuda.synchronize()
            samples.append(time.perf_counter() - start)
        start = time.perf_counter()
        step()
        issue_s = time.perf_counter() - start  # returned before the GPU finished: the host's share
        torch.cuda.synchronize()
        per_block = BLOCKS * len(xs)
        row[f"{name}_ms_per_block"] = 1e3 * statistics.median(samples) / per_block
        row[f"{name}_issue_ms_per_block"] = 1e3 * issue_s / per_block
    row["grad_norm"] = sum(float(p.grad.float().norm()) ** 2 for p in holder.parameters()) ** 0.5
    row["x_grad_norm"] = float(xs[0].grad.float().norm())
    return row


def _worker(rank, world, port, queue, model, degrees, micro_batches, repeats):
    import torch
    import torch.distributed as dist
    from torch import nn

    from planner.runtime.calibrate import join_ranks
    from planner.runtime.gpt import Block
    from planner.runtime.tensor_parallel import shard_stage

    try:
        device, _ = join_ranks(rank, world, port, "nccl", 600)
        rows = []
        for t in degrees:
            group = dist.new_group(list(range(t))) if t > 1 else None  # every process takes part in making it
            for b in micro_batches:
                for mode in MODES:
                    if rank < t:
                        torch._dynamo.reset()  # each size and mode compiled afresh
                        torch.manual_seed(0)
                        holder = nn.Module()
                        holder.blocks = nn.ModuleDict({str(i): Block(model) for i in range(BLOCKS)})
                        if t > 1:
                            holder = shard_stage(holder, group, rank, t)
                        blocks = list(holder.to(device=device, dtype=torch.bfloat16).blocks.values())
                        for block in blocks:
                            block.compile(mode=None if mode == "default" else mode)
                        generator = torch.Generator(device=device).manual_seed(1)
                        xs = [torch.randn(b, model.sequence, model.hidden, device=device, dtype=torch.bfloat16,
                                          generator=generator, requires_grad=True) for _ in range(MICRO_BATCHES)]
                        grads = [torch.randn_like(x) for x in xs]
                        torch.cuda.reset_peak_memory_stats(device)
                        row = {"degree": t, "mb": b, "mode": mode,
                               **_measure(holder, xs, _steps(blocks, xs, grads), repeats),
                               "peak_gib": torch.cuda.max_memory_allocated(device) / 2 ** 30}
                        rows.append(row)
                        del holder, blocks, xs, grads
                        torch.cuda.empty_cache()
                    dist.barrier()
        queue.put((rank, rows))
        dist.destroy_process_group()
    except Exception as error:  # reported to the parent, which names the process
        queue.put((rank, f"{type(error).__name__}: {str(error).strip()[:300]}"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", default="topologies/local/h100-x4.yaml")
    parser.add_argument("--degrees", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)

    import torch

    from planner.inputs.job import load_job
    from planner.runtime.spawn import gather_from_ranks

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if max(args.degrees) > gpus:
        print(f"--degrees {max(args.degrees)} needs {max(args.degrees)} CUDA GPUs; this host has {gpus}",
              file=sys.stderr)
        return 2
    job = load_job(ROOT / args.topology)
    rows = gather_from_ranks(_worker, max(args.degrees), args=(job.model, tuple(args.degrees),
                                                               tuple(args.micro_batches), args.repeats),
                             timeout_s=1800)[0]
    print(f"{'degree':>6} {'mb':>3} {'mode':>16} {'gpipe ms':>9} {'issue ms':>9} {'1f1b ms':>8} {'issue ms':>9} "
          f"{'peak GiB':>9}")
    for r in rows:
        print(f"{r['degree']:>6} {r['mb']:>3} {r['mode']:>16} {r['gpipe_ms_per_block']:>9.3f} "
              f"{r['gpipe_issue_ms_per_block']:>9.3f} {r['1f1b_ms_per_block']:>8.3f} "
              f"{r['1f1b_issue_ms_per_block']:>9.3f} {r['peak_gib']:>9.2f}")
    worst = _gradient_disagreement(rows)
    print(f"gradient norms, CUDA graphs against compiled: at most {worst:.1e} apart (relative)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cuda_graphs.json").write_text(json.dumps(
        {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "topology": args.topology,
         "blocks": BLOCKS, "micro_batches": MICRO_BATCHES, "rows": rows}, indent=1) + "\n")
    return 0 if worst <= GRADIENT_TOLERANCE else 1


def _gradient_disagreement(rows: list) -> float:
    """The largest relative difference of a row's gradient norms from its compiled twin's."""
    base = {(r["degree"], r["mb"]): r for r in rows if r["mode"] == "default"}
    return max((abs(r[k] / base[(r["degree"], r["mb"])][k] - 1) for r in rows if r["mode"] != "default"
                for k in ("grad_norm", "x_grad_norm")), default=0.0)


if __name__ == "__main__":
    sys.exit(main())
