"""What the runtime's compression costs on a GPU against what the cost model charges.

    python benchmarks/compression_codec.py [--model gpt3-xl] [--micro-batch-size 2] [--rank 4]

On one GPU (bf16): the block-wise int8 encode and decode of one boundary message
(``planner.runtime.compression``), eager and under ``torch.compile``, against the stage model's
memory-bound charge (``cost_models.compression.int8_encode_bytes`` / ``int8_decode_bytes`` over the
device's catalog memory bandwidth: the roofline, and the prediction at the measured share of it);
and one PowerSGD step over one block's matrices in a process
group of one (``planner.runtime.powersgd``: the products, the QR, the error feedback; the
all-reduces of one member move nothing) against the charge of its FLOPs at the catalog's
effective FLOP/s plus its error-feedback passes over the memory bandwidth. Medians of CUDA-event
timings after warm-up. Prints a table and writes ``benchmarks/results/compression_codec.json``.

    python benchmarks/compression_codec.py --cpu [--model tiny] [--threads 1]

On the CPU (no cost-model columns): the same codec on fp32 messages of whole blocks (one micro-batch's
``(b, s, h)``) and of one value more (a padded last block), and the PowerSGD step of one block's
fp32 matrices; medians of ``time.perf_counter`` after warm-up, in ``compression_codec_cpu.json``.
"""

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _median_ms(fn, repeats: int = 20) -> float:
    import torch

    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def _median_cpu_ms(fn, repeats: int = 30) -> float:
    import time

    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[len(times) // 2]


def _cpu(args) -> int:
    """The codec and the PowerSGD step on the CPU (fp32), timed by the wall clock."""
    import socket

    import torch
    import torch.distributed as dist

    from cost_models.compression import block_matrix_shapes
    from planner.inputs.model import model_preset
    from planner.runtime.compression import decode_int8, encode_int8
    from planner.runtime.powersgd import PowerSGD

    torch.set_num_threads(args.threads)
    model = model_preset(args.model)
    values = args.micro_batch_size * model.sequence * model.hidden
    rows = {}
    generator = torch.Generator().manual_seed(0)
    for label, n in (("whole_blocks", values), ("padded", values + 1)):
        x = torch.randn(n, generator=generator)
        codes, scales = encode_int8(x)
        rows[f"encode_{label}_ms"] = _median_cpu_ms(lambda: encode_int8(x))
        rows[f"decode_{label}_ms"] = _median_cpu_ms(lambda: decode_int8(codes, scales, x.shape, torch.float32))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{port}")
    matrices = [torch.nn.Parameter(torch.randn(n, m, generator=generator) * 0.02)
                for n, m in block_matrix_shapes(model.hidden, model.ffn_hidden, gated_mlp=model.gated_mlp)]
    for p in matrices:
        p.grad = torch.randn(p.shape, generator=generator) * 1e-3
    state = PowerSGD(matrices, rank=args.rank, group=dist.group.WORLD, device=torch.device("cpu"))
    rows["powersgd_block_ms"] = _median_cpu_ms(state.reduce)
    dist.destroy_process_group()
    document = {"device": "cpu", "threads": args.threads, "torch": torch.__version__, "model": args.model,
                "micro_batch_size": args.micro_batch_size, "rank": args.rank, "values_per_message": values, **rows}
    for key, value in rows.items():
        print(f"{key:<36} {value:.4f}")
    out = Path(args.out or ROOT / "benchmarks" / "results" / "compression_codec_cpu.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=1))
    print(f"wrote {out}")
    return 0


def main(argv=None) -> int:
    import torch
    import torch.distributed as dist

    from cost_models.compression import (INT8_CODEC_BANDWIDTH_SHARE, POWERSGD_BANDWIDTH_SHARE,
                                         POWERSGD_PASS_BYTES_PER_PARAMETER, block_matrix_shapes, int8_decode_bytes,
                                         int8_encode_bytes, powersgd_sync)
    from planner.inputs.catalog import load_catalog
    from planner.inputs.model import model_preset
    from planner.runtime.compression import decode_int8, encode_int8
    from planner.runtime.powersgd import PowerSGD

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="gpt3-xl")
    parser.add_argument("--micro-batch-size", type=int, default=2)
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--device-type", default="H100-SXM", help="catalog type whose numbers the cost model uses")
    parser.add_argument("--cpu", action="store_true", help="time the codec and PowerSGD on the CPU instead")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the --cpu run")
    parser.add_argument("--out", help="the JSON written (default: benchmarks/results/compression_codec[_cpu].json)")
    args = parser.parse_args(argv)
    if args.cpu:
        return _cpu(args)
    args.out = args.out or str(ROOT / "benchmarks" / "results" / "compression_codec.json")
    model = model_preset(args.model)
    device_spec = load_catalog()[args.device_type]
    bandwidth = device_spec.memory_bandwidth_bytes_per_s
    speed = device_spec.peak_flops["bf16"] * device_spec.efficiency  # as the topology derives it
    device = torch.device("cuda", 0)
    shape = (args.micro_batch_size, model.sequence, model.hidden)
    values = args.micro_batch_size * model.sequence * model.hidden
    x = torch.randn(shape, device=device, dtype=torch.bfloat16)
    codes, scales = encode_int8(x)
    rows = {}
    compiled_encode, compiled_decode = torch.compile(encode_int8), torch.compile(decode_int8)
    rows["encode_eager_ms"] = _median_ms(lambda: encode_int8(x))
    rows["decode_eager_ms"] = _median_ms(lambda: decode_int8(codes, scales, shape, torch.bfloat16))
    rows["encode_compiled_ms"] = _median_ms(lambda: compiled_encode(x))
    rows["decode_compiled_ms"] = _median_ms(lambda: compiled_decode(codes, scales, shape, torch.bfloat16))
    rows["encode_roofline_ms"] = int8_encode_bytes(values, 2) / bandwidth * 1e3  # at the full bandwidth
    rows["decode_roofline_ms"] = int8_decode_bytes(values, 2) / bandwidth * 1e3
    rows["codec_predicted_ms"] = (rows["encode_roofline_ms"] + rows["decode_roofline_ms"]) / INT8_CODEC_BANDWIDTH_SHARE
    rows["round_trip_max_error_over_absmax"] = float(
        ((decode_int8(codes, scales, shape, torch.float32) - x.float()).abs().max() / x.float().abs().max()))

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl", rank=0, world_size=1)
    matrices = [torch.nn.Parameter(torch.randn(n, m, device=device, dtype=torch.bfloat16) * 0.02)
                for n, m in block_matrix_shapes(model.hidden, model.ffn_hidden, gated_mlp=model.gated_mlp)]
    for p in matrices:
        p.grad = torch.randn_like(p) * 1e-3
    state = PowerSGD(matrices, rank=args.rank, group=dist.group.WORLD, device=device)
    rows["powersgd_block_ms"] = _median_ms(state.reduce)
    params = sum(p.numel() for p in matrices)
    _, work, packed = powersgd_sync([tuple(p.shape) for p in matrices], params, args.rank, 2)
    passes = POWERSGD_PASS_BYTES_PER_PARAMETER * packed / bandwidth
    rows["powersgd_block_roofline_ms"] = (work / speed + passes) * 1e3
    rows["powersgd_block_predicted_ms"] = (work / speed + passes / POWERSGD_BANDWIDTH_SHARE) * 1e3
    dist.destroy_process_group()
    document = {"device": torch.cuda.get_device_name(device), "torch": torch.__version__, "model": args.model,
                "micro_batch_size": args.micro_batch_size, "rank": args.rank, "values_per_message": values,
                "catalog_type": args.device_type, "memory_bandwidth_bytes_per_s": bandwidth,
                "effective_flops": speed, **rows}
    for key, value in rows.items():
        print(f"{key:<36} {value:.4f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
