"""A tensor group's block against the cost model at several micro-batches: where the time of a
group's block goes (the members' share of the compute, the 4 all-reduces, the issue floor).

For each degree ``t`` and micro-batch ``b`` the first ``t`` processes time, as ``plan calibrate``
does (``planner.runtime.calibrate.tensor_probe``: the runtime's own ``shard_stage`` block, compiled
as ``plan launch`` compiles it), one forward and backward of their block, and one all-reduce over
the group of the activation the block all-reduces (``b x sequence x hidden`` at the training
precision's width). Next to them: the cost model's block without a floor (``tensor_block_floor``:
the share at the calibration's efficiency plus ``stage_model.tensor_layer_s``'s all-reduces over the
calibration's measured links), with the device type's floor (``max``), and the model's one
all-reduce (``cost_models.comm.ring_allreduce_time_s`` over the same links).

Run on a host with the GPUs (or on CPU processes over gloo), from the repository root:

    python benchmarks/tensor_block.py --topology topologies/local/h100-x4.yaml \\
        --calibration DIR/calibration.yaml --degrees 2 4 --micro-batches 1 2 4 8

Prints a table and writes ``tensor_block.json`` to ``--out``.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _worker(rank, world, port, queue, backend, job, options, degrees, micro_batches, dtype_name):
    import torch
    import torch.distributed as dist

    from planner.runtime.calibrate import join_ranks, tensor_probe, timed

    try:
        device, _ = join_ranks(rank, world, port, backend, options.timeout_s)
        rows = []
        for t in degrees:
            group = dist.new_group(list(range(t)))  # every process takes part in making it
            for b in micro_batches:
                if rank < t:
                    block_s = tensor_probe(job, options, device, group, rank, t, b)
                    message = torch.zeros(b, job.model.sequence, job.model.hidden, device=device,
                                          dtype=getattr(torch, dtype_name))
                    allreduce_s = timed(lambda: dist.all_reduce(message, group=group), options.repeats, device)
                    rows.append({"degree": t, "micro_batch_size": b, "block_s": block_s, "allreduce_s": allreduce_s,
                                 "message_bytes": message.numel() * message.element_size()})
                dist.barrier()
        queue.put((rank, rows))
        dist.destroy_process_group()
    except Exception as error:  # reported to the parent, which names the process
        queue.put((rank, f"{type(error).__name__}: {str(error).strip()[:300]}"))


def model_rows(job, calibration, measured: list) -> list:
    """Each measured row beside the cost model's times for it (the calibration's efficiency, links
    and floor of the topology's first device type)."""
    from cost_models.comm import ring_allreduce_time_s
    from planner.inputs.catalog import peak_for
    from planner.inputs.calibration import apply_calibration
    from planner.runtime.calibrate import tensor_block_floor

    topology = apply_calibration(job.topology, calibration)
    device = topology.devices[0]
    peak = peak_for(device.peak_flops, job.training.precision)
    network = calibration.network
    rows = []
    for row in measured:
        t = row["degree"]
        ring = [(i, (i + 1) % t) for i in range(t)]
        latency = [network["latency_s"][i][j] for i, j in ring]
        bandwidth = [network["bandwidth_bytes_per_s"][i][j] for i, j in ring]
        modelled = tensor_block_floor(job.model, job.training, row["micro_batch_size"], t, peak, device.efficiency,
                                      latency, bandwidth, 0.0)[1]
        allreduce = ring_allreduce_time_s(row["message_bytes"], np.asarray(latency), np.asarray(bandwidth))
        with_floor = max(modelled, device.tensor_block_issue_s)
        rows.append({**row, "model_block_s": modelled, "model_block_with_floor_s": with_floor,
                     "floor_s": device.tensor_block_issue_s, "model_allreduce_s": float(allreduce),
                     "block_error": with_floor / row["block_s"] - 1,
                     "allreduce_error": float(allreduce) / row["allreduce_s"] - 1})
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", default="topologies/local/h100-x4.yaml")
    parser.add_argument("--calibration", required=True, help="'plan calibrate' file of this host (links, efficiency)")
    parser.add_argument("--degrees", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--compile", choices=["auto", "on", "off"], default="auto")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)

    import torch

    from planner.inputs.calibration import read_calibration
    from planner.inputs.job import load_job
    from planner.plan.precision import resolve_precision
    from planner.runtime.calibrate import CalibrateOptions
    from planner.runtime.precision import runtime_dtype
    from planner.runtime.spawn import gather_from_ranks

    job = load_job(ROOT / args.topology)
    calibration = read_calibration(args.calibration)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backend = "nccl" if gpus else "gloo"
    world = max(args.degrees)
    if backend == "nccl" and world > gpus:
        print(f"--degrees {world} needs {world} GPUs; this host has {gpus}", file=sys.stderr)
        return 2
    device = torch.device("cuda" if gpus else "cpu")
    precision = resolve_precision(job.topology, [d.name for d in job.topology.devices], job.training.precision)
    dtype = str(runtime_dtype(precision, device)).replace("torch.", "")
    options = CalibrateOptions(out="", repeats=args.repeats, compile=args.compile)
    reports = gather_from_ranks(_worker, world, args=(backend, job, options, tuple(args.degrees),
                                                      tuple(args.micro_batches), dtype), timeout_s=options.timeout_s)
    rows = model_rows(job, calibration, reports[0])
    print(f"{'degree':>6} {'mb':>3} {'block ms':>9} {'model ms':>9} {'+floor':>8} {'error':>7} "
          f"{'all-reduce ms':>14} {'model ms':>9} {'error':>7}")
    for r in rows:
        print(f"{r['degree']:>6} {r['micro_batch_size']:>3} {1e3 * r['block_s']:>9.3f} {1e3 * r['model_block_s']:>9.3f} "
              f"{1e3 * r['model_block_with_floor_s']:>8.3f} {100 * r['block_error']:>+6.1f}% "
              f"{1e3 * r['allreduce_s']:>14.3f} {1e3 * r['model_allreduce_s']:>9.3f} {100 * r['allreduce_error']:>+6.1f}%")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device_name = torch.cuda.get_device_name(0) if gpus else "CPU"
    (out / "tensor_block.json").write_text(json.dumps(
        {"device": device_name, "backend": backend, "torch": torch.__version__, "dtype": dtype,
         "topology": args.topology, "calibration": str(args.calibration), "compile": args.compile,
         "repeats": args.repeats, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
