"""``plan calibrate``: measure what the cost model needs on the devices at hand.

- Compute: a transformer block's forward and backward (``PROBE_BLOCKS`` blocks chained as a stage
  runs them, per block) and the head's (norm, logits, loss) at the model's shapes, timed on rank 0's
  device; efficiency = the block's model FLOPs
  (``cost_models.flops``) / its measured time / the device type's peak at the training precision,
  and head efficiency the same for the head; the recompute efficiency the same for the runtime's block
  with full recomputation (its forward re-run in backward, compiled as ``plan launch`` compiles it)
  timed forward and backward and counted at 4 forwards' FLOPs (``flops.training_flops_multiplier``);
  the split-backward efficiency the same for the block as a ZB-H1 plan runs it (its linear layers'
  weight gradients deferred, ``planner.runtime.split_backward``, the block compiled as ``plan
  launch`` compiles it): forward, input gradients, then the weight
  gradients, counted at 3 forwards' FLOPs; its time is the plain block's times the ratio of the
  two on the device alone (``device_timed``: kernels queued behind a device-side wait), or the
  host's time to issue it where that is longer (``split_block_s``).
- Host: the seconds the host takes to issue each of those blocks' calls (the call returns before
  a GPU has run its kernels), recorded under ``measured`` (``*_issue_s``) beside the blocks' times;
  where the two are close, a stage can wait for its host.
- Optimizer: the runtime's own optimizer stepping ``OPTIMIZER_PROBE_PARAMETERS`` parameters; the
  effective memory bandwidth = bytes the roofline counts (``planner.prediction.stage_model``) / time.
- Links: a ping-pong between every ordered pair of the launched processes over torch.distributed at
  several message sizes; a least-squares fit of ``t(n) = a + n / B`` per pair gives the one-way
  latency ``a / 2`` (per-message overhead included) and the bandwidth ``B`` (Hockney's model).
- Tensor groups, where the topology has two or more devices of the type on one host and two or more
  processes run: the runtime's own tensor-parallel block (``planner.runtime.tensor_parallel``, the
  first ``t`` processes as one group, for every degree ``t`` that fits and divides the heads and the
  MLP width) timed forward and backward, ``PROBE_BLOCKS`` chained as a stage runs them, per block,
  at each micro-batch of ``TENSOR_PROBE_MICRO_BATCHES`` whose chain fits in half the device's
  memory: ``device_types.<type>.tensor_block_s`` (degree -> micro-batch -> seconds), which the cost
  model interpolates (``cost_models.comm.measured_tensor_block_s``) in place of its share of the
  compute plus the 4 all-reduces. A member's share is a sliver of each matrix product, so its time
  is set by kernel launches and waits at small micro-batches and by its products at large ones; no
  single efficiency fits both (on 4x H200 the modelled block was -19% to +7% of the measured one
  across micro-batches 1-8, ``benchmarks/results/tensor_block_h200.json``). For degrees the host
  cannot time the model keeps ``max(M, floor)``: ``M`` the members' share of the compute at the
  efficiency measured above plus the all-reduces over the measured links (``stage_model.tensor_layer_s``
  without a floor), the floor ``device_types.<type>.tensor_block_issue_s``: the largest timed
  group's block at micro-batch 1 where it exceeds ``M`` (it is then issue-bound), else 0. Where
  ``--compile`` replays a first stage's group as CUDA graphs (``auto``), each degree is timed again
  without graphs, as a launch runs a group that receives its input (a later stage's, or any with
  virtual stages: ``planner.runtime.graphs.stage_graphed``), into ``tensor_block_received_s`` and
  its floor ``tensor_block_received_issue_s``; the cost model prices such groups by them
  (``planner.plan.tensor.TensorGroups.placed``). On 4x H200 a group of 4 at micro-batch 2 took
  1.37 ms a block graphed and 3.29 ms compiled (``benchmarks/results/cuda_graphs_h200x4.json``).

Writes a calibration file (``planner.calibration``) saying when, where and how it was measured.
"""

import datetime
import os
import platform
import socket
import statistics
import time
from dataclasses import dataclass

import numpy as np

from planner.inputs.calibration import CALIBRATION_FORMAT, write_calibration
from planner.inputs.catalog import peak_for
from planner.errors import InputError
from planner.plan.recompute import mode_of
from planner.runtime.graphs import graphed_stages, release_graphs, stage_graphed
from planner.runtime.spawn import RankFailure, gather_from_ranks

__all__ = ["CalibrateOptions", "CalibrationFailure", "calibrate", "fit_latency_bandwidth", "OPTIMIZER_PROBE_PARAMETERS",
           "tensor_probe_degrees", "tensor_block_floor", "TENSOR_PROBE_MICRO_BATCH",
           "TENSOR_PROBE_MICRO_BATCHES",
           "tensor_probe", "timed", "least_issued", "split_backward_step", "split_block_s", "PROBE_BLOCKS", "join_ranks"]

OPTIMIZER_PROBE_PARAMETERS = 32 * 2**20
_SIZES_CPU = (4 * 2**10, 64 * 2**10, 2**20, 8 * 2**20)
_LINK_REPEATS = 20  # round trips per size and pair (median)
_SIZES_GPU = (4 * 2**10, 2**20, 16 * 2**20, 128 * 2**20)
# Blocks timed in a chain, per block, as a stage runs them: on an H200 (GPT-3 XL, micro-batch 2,
# compiled) one block timed alone took 2.49-2.89 ms forward and backward on two hosts, 2.61 ms a
# block in a chain of 6 (``benchmarks/runtime_parts.py``); ZB-H1's split block 2.77-4.27 ms alone,
# 2.70 ms chained. The host's launch overhead of one block's call is shared by the chain's; four blocks
# share it while keeping the probe's memory to a few blocks (one chain alive at a time).
PROBE_BLOCKS = 4
TENSOR_PROBE_MICRO_BATCH = 1  # a tensor group's block floor shows first at the smallest micro-batch
TENSOR_PROBE_MICRO_BATCHES = (1, 2, 4, 8)  # a tensor group's block is timed at each (those whose chain fits)
_TENSOR_PROBE_MEMORY_SHARE = 0.5  # of a GPU's memory, the most a probe's chain may keep
_IMPLAUSIBLE_EFFICIENCY = 0.01  # below this share of peak, the measured device is probably not the named type


@dataclass(frozen=True, kw_only=True)
class CalibrateOptions:
    out: str = "calibration.yaml"
    device_type: str | None = None
    processes: int | None = None
    names: tuple = ()
    backend: str = "auto"
    repeats: int = 5
    model: str | None = None
    micro_batch_size: int | None = None
    timeout_s: float = 120.0
    # time compiled blocks and loss as plan launch runs them ("auto": on GPUs, tensor groups' blocks as CUDA
    # graphs; "graphs": every block as CUDA graphs on GPUs; planner.runtime.graphs)
    compile: str = "auto"


class CalibrationFailure(RuntimeError):
    """A measuring process failed; the message names it and its error."""


def fit_latency_bandwidth(sizes_bytes, round_trip_s) -> tuple:
    """(one-way latency s, bandwidth B/s) from round trips ``t(n) = a + n / B`` (Hockney 1994)."""
    n = np.asarray(sizes_bytes, dtype=float)
    t = np.asarray(round_trip_s, dtype=float)
    slope, intercept = np.polyfit(n, t, 1)
    if slope <= 0:  # noise swamped the size dependence: use the largest message alone
        slope = t[-1] / n[-1]
    return max(float(intercept), 0.0) / 2.0, 1.0 / float(slope)


def tensor_probe_degrees(topology, model, kind: str, processes: int) -> tuple:
    """The tensor groups ``plan calibrate`` times for ``kind``: the degrees of
    ``planner.plan.tensor.TENSOR_DEGREES`` from 2 within the processes and the type's devices on one
    host that divide the heads and the MLP width, ascending (the largest's floor is the one
    recorded); () where none does."""
    from planner.plan.tensor import TENSOR_DEGREES

    per_host: dict = {}
    for d in topology.devices:
        if d.type_name == kind:
            per_host[d.host] = per_host.get(d.host, 0) + 1
    most = min(max(per_host.values(), default=0), processes)
    return tuple(t for t in TENSOR_DEGREES if 2 <= t <= most and not model.heads % t and not model.ffn_hidden % t)


def tensor_block_floor(model, training, micro_batch_size: int, degree: int, peak_flops: float, efficiency: float,
                       hop_latency_s, hop_bandwidth_bytes_per_s, measured_s: float) -> tuple:
    """(floor, modelled) seconds of a tensor group's block per micro-batch, forward and backward:
    ``modelled`` is the cost model's time without a floor (the members' share of the block's FLOPs at
    ``efficiency`` of ``peak_flops``, plus ``stage_model.tensor_layer_s``'s all-reduces over a ring
    of the ``degree`` hops given); the floor is ``measured_s`` where it exceeds that (the excess
    ``measured - modelled`` clamped at 0 is positive: the block is bound by its issue time, and the
    model's ``max(modelled, floor)`` then gives the measurement), else 0."""
    from dataclasses import replace

    from cost_models.comm import ring_allreduce_time_s
    from planner.prediction.stage_model import layer_costs, tensor_layer_s

    costs = layer_costs(model, replace(training, recompute=False), micro_batch_size, 1)
    per_byte = ring_allreduce_time_s(1.0, np.zeros(degree), hop_bandwidth_bytes_per_s)
    latency = ring_allreduce_time_s(0.0, hop_latency_s, hop_bandwidth_bytes_per_s)
    share = costs.layer_flops / (degree * peak_flops * efficiency)
    modelled = share + float(tensor_layer_s(costs, per_byte, latency, share, degree))
    return (measured_s if measured_s - modelled > 0 else 0.0), modelled


def _file_micro_batch_size(topology_path) -> int:
    """The topology file's ``training.micro_batch_size`` when it names one, else 0."""
    from planner.io import read_yaml

    document = read_yaml(topology_path)
    section = document.get("training") if isinstance(document, dict) else None
    value = section.get("micro_batch_size") if isinstance(section, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _job(topology_path, options: CalibrateOptions):
    from planner.inputs.job import load_job

    # Only the micro-batch is measured: the global batch is set to it, so no batch the user never
    # wrote can clash with the file's or the option's micro-batch size.
    micro = options.micro_batch_size or _file_micro_batch_size(topology_path) or 1
    overrides = {"micro_batch_size": micro, "global_batch": micro}
    job = load_job(topology_path, model=options.model, training_overrides=overrides)
    types = sorted({d.type_name for d in job.topology.devices})
    kind = options.device_type
    if kind is None:
        if len(types) != 1:
            raise InputError(f"the topology has device types {', '.join(types)}: pass --device-type for the one "
                             "on this host", field="--device-type")
        kind = types[0]
    elif kind not in types:
        raise InputError(f"{kind!r} is not in the topology (it has {', '.join(types)})", field="--device-type")
    return job, kind


def _check_device_here(kind: str, backend: str, gpus: int) -> None:
    """Measure only a device type that is here: a GPU type needs CUDA, a CPU type the CPU (gloo)."""
    from planner.runtime.preflight import is_cpu_type

    if backend == "gloo" and not is_cpu_type(kind):
        here = "this host has no CUDA GPU" if not gpus else "--backend gloo measures the CPU"
        raise InputError(f"{kind} is a GPU type but {here}, so its efficiency would be the CPU's: run 'plan "
                         f"calibrate' on a host with a {kind}, or name this host's type (CPU-core)",
                         field="--device-type")
    if backend == "nccl" and is_cpu_type(kind):
        raise InputError(f"{kind} is a CPU type but --backend nccl measures this host's GPU: use --backend gloo",
                         field="--device-type")


def calibrate(topology_path, options: CalibrateOptions, *, log=print) -> dict:
    """Measure, write ``options.out`` and return the calibration document."""
    import torch

    job, kind = _job(topology_path, options)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backend = options.backend if options.backend != "auto" else ("nccl" if gpus else "gloo")
    processes = options.processes or (gpus if backend == "nccl" else 2)
    if processes < 1 or (backend == "nccl" and processes > gpus):
        raise InputError(f"{processes} process(es) with {backend} on a host with {gpus} GPU(s)", field="--processes")
    names = list(options.names) or [d.name for d in job.topology.devices if d.type_name == kind][:processes]
    if len(names) != processes:
        raise InputError(f"needs {processes} device names, got {len(names)}: pass --names", field="--names")
    _check_device_here(kind, backend, gpus)
    degrees = tensor_probe_degrees(job.topology, job.model, kind, processes)
    log(f"calibrating {kind} with {processes} process(es) over {backend}: {', '.join(names)}"
        + (f"; tensor groups of {', '.join(map(str, degrees))}" if degrees else ""))
    try:
        reports = gather_from_ranks(_worker, processes, args=(backend, job, options, degrees),
                                    timeout_s=options.timeout_s, names=names)
    except RankFailure as failure:
        raise CalibrationFailure(str(failure)) from None
    document = _document(job, kind, backend, names, reports, options)
    entry = document["device_types"][kind]
    if "tensor_block_issue_s" in entry:
        m = entry["measured"]
        log(f"tensor group of {m['tensor_degree']}: a block took {1e3 * m['tensor_block_s']:.3f} ms, the model gives "
            f"{1e3 * m['tensor_block_model_s']:.3f} ms: floor {1e3 * entry['tensor_block_issue_s']:.3f} ms"
            + f" (micro-batch {m['tensor_micro_batch_size']}"
            + ("; none shows: 0 times every micro-batch the same)" if not entry["tensor_block_issue_s"] else ")"))
        for t, row in entry["tensor_block_s"].items():
            log(f"tensor group of {t}: a block took " + ", ".join(f"{1e3 * seconds:.3f} ms at micro-batch {b}"
                                                                  for b, seconds in row.items()))
        for t, row in entry.get("tensor_block_received_s", {}).items():
            log(f"tensor group of {t} receiving its input (a later stage's, without CUDA graphs): a block took "
                + ", ".join(f"{1e3 * seconds:.3f} ms at micro-batch {b}" for b, seconds in row.items()))
    m = entry["measured"]
    plain = m["block_forward_s"] + m["block_backward_s"]
    log(f"a block took {1e3 * plain:.3f} ms forward and backward, {1e3 * m['recomputed_block_forward_backward_s']:.3f} "
        f"ms with recomputation: {m['recomputed_block_forward_backward_s'] / plain:.3f} times (the FLOPs say 1.333), "
        f"{1e3 * m['split_block_forward_backward_s']:.3f} ms with ZB-H1's split backward: "
        f"{m['split_block_forward_backward_s'] / plain:.3f} times")
    log(f"the host took {1e3 * m['block_forward_backward_issue_s']:.3f} ms to issue a block's forward and backward "
        f"({1e3 * m['recomputed_block_forward_backward_issue_s']:.3f} recomputed, "
        f"{1e3 * m['split_block_forward_backward_issue_s']:.3f} split): close to the block's time, a stage waits for "
        "its host")
    efficiency = entry["efficiency"]
    if efficiency < _IMPLAUSIBLE_EFFICIENCY:
        log(f"warning: measured efficiency {efficiency:.4f} of {kind}'s peak is implausibly low: is this host's "
            f"device really a {kind}, and is it otherwise idle?")
    write_calibration(document, options.out)
    return document


def _document(job, kind, backend, names, reports, options) -> dict:
    from cost_models.flops import head_forward_flops, layer_forward_flops, training_flops_multiplier
    from planner.prediction.stage_model import head_outputs

    compute = reports[0]["compute"]
    model, training = job.model, job.training
    b = compute["micro_batch_size"]
    block = layer_forward_flops(b, model.sequence, model.hidden, model.ffn_hidden, gated_mlp=model.gated_mlp)
    outputs, positions = head_outputs(model)
    head = head_forward_flops(b, positions, model.hidden, outputs)
    achieved = 3.0 * block / (compute["block_forward_s"] + compute["block_backward_s"])
    head_achieved = 3.0 * head / compute["head_s"]
    recompute_achieved = training_flops_multiplier(True) * block / compute["recomputed_block_s"]
    split_achieved = training_flops_multiplier(False) * block / compute["split_block_s"]
    device = next(d for d in job.topology.devices if d.type_name == kind)
    peak = peak_for(device.peak_flops, training.precision)
    graphs_tensor = stage_graphed(graphed_stages(options.compile, backend), 2)  # the tensor probes graphed
    document = {
        "format": CALIBRATION_FORMAT,
        "measured_at_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "how": (f"plan calibrate on {compute['device_name']}: {options.repeats} timed repeats after 2 warm-ups; "
                f"model {model.name} at micro-batch {b}, {compute['dtype']}"
                f"{', compiled' if compute['compiled'] else ', eager'}"
                f"{'; tensor groups as CUDA graphs' if graphs_tensor else ''}; links by ping-pong over {backend}"),
        "torch": compute["torch"],
        "backend": backend,
        "device_types": {kind: {
            "efficiency": min(achieved / peak, 1.0),
            "head_efficiency": min(head_achieved / peak, 1.0),
            # no faster than the plain block (noise aside), which read_calibration holds it to
            "recompute_efficiency": min(recompute_achieved / peak, training_flops_multiplier(True)
                                        / training_flops_multiplier(False) * min(achieved / peak, 1.0), 1.0),
            # no faster than the plain block (noise aside), which read_calibration holds it to
            "split_backward_efficiency": min(split_achieved / peak, achieved / peak, 1.0),
            "memory_bandwidth_bytes_per_s": compute["optimizer_bytes_per_s"],
            "measured": {"device_name": compute["device_name"], "precision": training.precision,
                         "dtype": compute["dtype"], "compiled": compute["compiled"],
                         "graphs": graphed_stages(options.compile, backend).value,
                         "micro_batch_size": b, "sequence": model.sequence,
                         "hidden": model.hidden, "layers": model.layers, "vocabulary": model.vocabulary,
                         "block_forward_s": compute["block_forward_s"], "block_backward_s": compute["block_backward_s"],
                         "head_forward_backward_s": compute["head_s"], "achieved_flops": achieved,
                         "head_achieved_flops": head_achieved,
                         "recomputed_block_forward_backward_s": compute["recomputed_block_s"],
                         "recompute_achieved_flops": recompute_achieved,
                         "split_block_forward_backward_s": compute["split_block_s"],
                         "split_achieved_flops": split_achieved,
                         "block_forward_backward_issue_s": compute["block_issue_s"],
                         "recomputed_block_forward_backward_issue_s": compute["recomputed_block_issue_s"],
                         "split_block_forward_backward_issue_s": compute["split_block_issue_s"],
                         "block_forward_backward_device_s": compute["block_device_s"],
                         "split_block_forward_backward_device_s": compute["split_block_device_s"],
                         "split_block_forward_backward_queued_s": compute["split_block_queued_s"],
                         "peak_flops": peak, "optimizer_step_s": compute["optimizer_s"],
                         "optimizer_parameters": OPTIMIZER_PROBE_PARAMETERS, "threads": compute["threads"]},
        }},
    }
    n = len(names)
    if reports[0].get("tensor_blocks"):
        entry = document["device_types"][kind]
        # degree -> micro-batch -> seconds per block; then the same without graphs where they differ
        for prefix, table in (("tensor_block", reports[0]["tensor_blocks"]),
                              ("tensor_block_received", reports[0].get("tensor_blocks_received"))):
            if not table:
                continue
            t = max(table)
            ring = [(i, (i + 1) % t) for i in range(t)]
            hops = [fit_latency_bandwidth(*reports[0]["links"][pair]) for pair in ring]
            one = table[t][min(table[t])]
            floor, modelled = tensor_block_floor(model, training, min(table[t]), t, peak, min(achieved / peak, 1.0),
                                                 [h[0] for h in hops], [h[1] for h in hops], one)
            entry[f"{prefix}_issue_s"] = floor
            entry[f"{prefix}_s"] = {degree: dict(sorted(row.items())) for degree, row in sorted(table.items())}
            if prefix == "tensor_block":
                entry["measured"].update(tensor_degree=t, tensor_micro_batch_size=min(table[t]), tensor_block_s=one,
                                         tensor_block_model_s=modelled, tensor_block_excess_s=max(one - modelled, 0.0))
    if n > 1:
        latency, bandwidth = np.zeros((n, n)), np.zeros((n, n))
        overheads = []
        for (i, j), (sizes, times) in reports[0]["links"].items():
            latency[i, j], bandwidth[i, j] = fit_latency_bandwidth(sizes, times)
            overheads.append(latency[i, j])
        np.fill_diagonal(bandwidth, 0.0)
        document["network"] = {"devices": names, "latency_s": latency.tolist(),
                               "bandwidth_bytes_per_s": bandwidth.tolist(),
                               "message_overhead_s": float(min(overheads)),
                               "probe": {"sizes_bytes": list(reports[0]["sizes"]),
                                         "repeats": max(options.repeats, _LINK_REPEATS),
                                         "statistic": "median round trip, n bytes out and 1 element back"}}
    return document


def join_ranks(rank: int, world: int, port: int, backend: str, timeout_s: float) -> tuple:
    """(device, threads) of a spawned probe process (``planner.runtime.spawn.gather_from_ranks``):
    its GPU (NCCL) or its share of the host's cores (gloo), in the process group of ``world``
    ranks at the parent's TCP store on ``port``."""
    import torch
    import torch.distributed as dist

    cuda = backend == "nccl"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    threads = max(1, (os.cpu_count() or 1) // world)
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(threads)
    store = dist.TCPStore("127.0.0.1", port, world, False, timeout=datetime.timedelta(seconds=timeout_s))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s), **({"device_id": device} if cuda else {}))
    return device, threads


def _worker(rank, world, port, queue, backend, job, options, degrees) -> None:
    try:
        device, threads = join_ranks(rank, world, port, backend, options.timeout_s)
        _measure(rank, world, job, options, queue, device, threads, degrees)
    except Exception as error:  # reported to the parent, which names the process
        text = str(error).strip().splitlines()
        queue.put((rank, f"{type(error).__name__}: {text[0] if text else ''}"))


def _measure(rank, world, job, options, queue, device, threads, degrees) -> None:
    import torch.distributed as dist

    cuda = device.type == "cuda"
    try:
        report = {}
        if rank == 0:
            report["compute"] = _compute_probe(job, options, device, threads)
        dist.barrier()
        sizes = _SIZES_GPU if cuda else _SIZES_CPU
        report["sizes"] = sizes
        report["links"] = _link_probe(rank, world, sizes, max(options.repeats, _LINK_REPEATS), device)
        table, received = {}, {}
        for degree in degrees:
            group = dist.new_group(list(range(degree)))  # every process takes part in making it
            if rank < degree:
                batches = tensor_probe_micro_batches(job, device, degree)
                table[degree] = {b: tensor_probe(job, options, device, group, rank, degree, b) for b in batches}
                if _graphs(options, device, degree):  # a group that receives its input runs without graphs
                    received[degree] = {b: tensor_probe(job, options, device, group, rank, degree, b, graphs=False)
                                        for b in batches}
            dist.barrier()
        if rank == 0:
            report["tensor_blocks"] = table
            report["tensor_blocks_received"] = received
        queue.put((rank, report))
    finally:
        try:  # a failing release neither hides the probe's error nor skips the destroy
            if cuda:  # the tensor probes' graphs captured the group's all-reduces
                release_graphs(device)
        finally:
            dist.destroy_process_group()


_QUEUED_CALLS = 8  # GPU calls queued per timed sample, as a stage queues its blocks
_AHEAD_S = 0.002  # device_timed's wait beyond twice the host's issue time


def timed(fn, repeats: int, device) -> float:
    """Median seconds of one call of ``fn`` after two warm-ups. On a GPU each sample queues
    ``_QUEUED_CALLS`` calls before one synchronisation, as a stage's blocks run back to back: timing
    a single synchronised call adds the host's launch latency to a ~1 ms kernel sequence (on an
    H100 a GPT-3 XL block timed alone took 3.13 ms, 2.58 ms inside the runtime)."""
    calls = _QUEUED_CALLS if device.type == "cuda" else 1
    for _ in range(2):
        fn()
    _drain(device)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        _drain(device)
        samples.append((time.perf_counter() - start) / calls)
    return statistics.median(samples)


def issued(fn, repeats: int, device) -> float:
    """Median host seconds one call of ``fn`` takes to return after two warm-ups, the device idle
    before each call and drained after it: on a GPU the call queues its kernels and returns, so this
    is the host's cost of issuing them (``timed``'s samples are the larger of it and the device's)."""
    samples = []
    for k in range(repeats + 2):
        _drain(device)
        start = time.perf_counter()
        fn()
        if k >= 2:
            samples.append(time.perf_counter() - start)
    _drain(device)
    return statistics.median(samples)


def least_issued(fn, repeats: int, device, takes: int = 2) -> float:
    """The lowest of ``takes`` medians of ``issued``, taken one after another: the host's issue time
    is only ever lengthened (other threads, page faults), never shortened. On 2x H200 two medians of
    the same split block read 3.494 and 3.048 ms; the ZB-H1 run predicted from the first was 19.8%
    slow, from the second 4.8% (``benchmarks/results/accuracy_gpu_h200x2``)."""
    return min(issued(fn, repeats, device) for _ in range(takes))


def device_timed(fn, repeats: int, device, ahead_s: float) -> float:
    """Median device seconds of one call of ``fn`` after two warm-ups, its kernels queued behind a
    device-side wait of at least ``ahead_s`` so that the host has issued all of them before the
    device starts: the device's time alone, however slow the host (``issued`` is the host's). A
    sample whose wait ended before the host had issued the call is taken again behind a wait twice
    as long. On a CPU, ``timed``."""
    if device.type != "cuda":
        return timed(fn, repeats, device)
    import torch

    cycles = max(int(ahead_s * _sleep_cycles_per_s(device)), 1)
    for _ in range(2):
        fn()
    samples = []
    while len(samples) < repeats:
        _drain(device)
        torch.cuda._sleep(cycles)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        if start.query():  # the device reached the call before the host had issued all of it
            cycles *= 2
            continue
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3)
    return statistics.median(samples)


def _sleep_cycles_per_s(device) -> float:
    """Clock cycles per second of ``torch.cuda._sleep`` on ``device``, measured."""
    import torch

    cycles = 10_000_000
    _drain(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / (start.elapsed_time(end) / 1e3)


def _drain(device) -> None:
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)


def _compute_probe(job, options, device, threads) -> dict:
    import torch

    from planner.prediction.stage_model import OPTIMIZER_BYTES_PER_PARAMETER
    from planner.runtime.data import training_targets
    from planner.runtime.gpt import Block, head_rows, lm_loss, make_norm, vocabulary_logits
    from planner.runtime.graphs import compiles
    from planner.plan.precision import resolve_precision
    from planner.runtime.optimizer import make_optimizer
    from planner.runtime.precision import runtime_dtype

    model, training = job.model, job.training
    b = training.micro_batch_size or 1
    dtype = runtime_dtype(resolve_precision(job.topology, [d.name for d in job.topology.devices], training.precision),
                          device)
    compiled = compiles(options.compile, "nccl" if device.type == "cuda" else "gloo")
    graphs = _graphs(options, device, 1)
    loss = torch.compile(lm_loss) if compiled else lm_loss
    x = torch.randn(b, model.sequence, model.hidden, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn_like(x)

    def chain_s(recompute: bool) -> tuple:
        """Per block of a chain of ``PROBE_BLOCKS``: (forward, forward + backward) seconds as a stage
        queues them (``timed``), the host's seconds issuing forward + backward (``issued``) and,
        without recomputation (the split block's reference), the device's alone (``device_timed``;
        else 0). The chain is freed on return, so one is alive at a time (a device that holds a few
        blocks can be probed)."""
        blocks = [Block(model).to(device=device, dtype=dtype) for _ in range(PROBE_BLOCKS)]
        for block in blocks:
            block.recompute = mode_of(recompute)  # full or none, as planner.runtime.gpt.build_stage sets it
            if compiled:  # as planner.runtime.gpt.compile_stage does to every block
                block.compile(mode="reduce-overhead" if graphs else None)

        def forward():
            y = x
            for block in blocks:
                y = block(y)
            return y

        def both():
            forward().backward(grad)

        if graphs:
            forward, both = _as_graph_steps(blocks, x, forward, both)

        issue = issued(both, options.repeats, device)
        return (timed(forward, options.repeats, device) / PROBE_BLOCKS,
                timed(both, options.repeats, device) / PROBE_BLOCKS, issue / PROBE_BLOCKS,
                0.0 if recompute
                else device_timed(both, options.repeats, device, 2.0 * issue + _AHEAD_S) / PROBE_BLOCKS)

    forward, both, both_issue, both_device = chain_s(False)
    recomputed_both, recomputed_issue = chain_s(True)[1:3]
    split = split_backward_step(model, x, grad, compiled, PROBE_BLOCKS)
    split_queued = timed(split, options.repeats, device) / PROBE_BLOCKS
    split_issue = least_issued(split, options.repeats, device) / PROBE_BLOCKS
    split_device = device_timed(split, options.repeats, device,
                                2.0 * PROBE_BLOCKS * split_issue + _AHEAD_S) / PROBE_BLOCKS
    split_both = split_block_s(both, both_device, split_device, split_issue)
    norm = make_norm(model, model.hidden).to(device=device, dtype=dtype)
    head = torch.nn.Linear(model.hidden, head_rows(model), bias=False).to(device=device, dtype=dtype)
    tokens = torch.randint(0, model.vocabulary, (b, model.sequence + 1), device=device)
    targets = training_targets(tokens, model)
    def head_step():  # as the runtime's last stage runs it (planner.runtime.gpt)
        last = x[:, -1] if model.head == "classification" else x  # a classification head reads the last position
        loss(vocabulary_logits(head(norm(last)), model), targets).backward()

    head_s = timed(head_step, options.repeats, device)
    probe = torch.nn.Linear(OPTIMIZER_PROBE_PARAMETERS // 1024, 1024, bias=False).to(device=device, dtype=dtype)
    optimizer = make_optimizer(probe, training.optimizer, 1e-4, dtype, device)

    def step():
        probe.weight.grad = torch.ones_like(probe.weight)
        optimizer.step()

    optimizer_s = timed(step, options.repeats, device)
    moved = probe.weight.numel() * OPTIMIZER_BYTES_PER_PARAMETER[training.optimizer]
    return {"micro_batch_size": b, "block_forward_s": forward, "block_backward_s": max(both - forward, 0.0),
            "recomputed_block_s": recomputed_both, "split_block_s": split_both,
            "block_device_s": both_device, "split_block_device_s": split_device, "split_block_queued_s": split_queued,
            "block_issue_s": both_issue, "recomputed_block_issue_s": recomputed_issue, "split_block_issue_s": split_issue,
            "head_s": head_s, "optimizer_s": optimizer_s, "optimizer_bytes_per_s": moved / optimizer_s,
            "dtype": str(dtype).replace("torch.", ""), "compiled": compiled, "threads": threads, "torch": torch.__version__,
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda"
            else (platform.processor() or platform.machine())}


def split_block_s(plain_queued_s: float, plain_device_s: float, split_device_s: float, split_issue_s: float) -> float:
    """Seconds per block of ZB-H1's split block in a stage: the plain block's time as a stage queues
    it times the two blocks' ratio on the device alone (the split block's extra device work), and
    no less than the host's time to issue the split block (the device runs what its host queued).
    Not the split block timed back to back: a zero-bubble stage's host issues in the slack its
    schedule leaves, and on hosts whose issue time is near the device's the back-to-back timing read
    10% (one 2x H200 host) to 23% (another) above the plain block; the runtime's ZB-H1 stages ran
    1-2% above 1F1B on the first and the host's issue time above the device's on the second."""
    return max(plain_queued_s * split_device_s / plain_device_s, split_issue_s)


def split_backward_step(model, x, grad, compiled: bool, blocks: int = 1):
    """One forward, input gradients and deferred weight gradients of ``blocks`` chained blocks as a
    ZB-H1 stage runs them (``planner.runtime.engine``: ``bwd_input`` then ``bwd_weight``; each
    block compiled whole with its products split when ``compiled``, ``gpt.compile_split_stage``), as
    a callable."""
    import torch

    from planner.runtime.gpt import Block, compile_split_stage
    from planner.runtime.split_backward import defer_weight_gradients

    holder = torch.nn.Module()  # compile_split_stage walks a stage's ``blocks``
    holder.blocks = torch.nn.ModuleDict({str(i): Block(model) for i in range(blocks)}).to(device=x.device,
                                                                                          dtype=x.dtype)
    store = defer_weight_gradients(holder)
    if compiled:
        compile_split_stage(holder)

    def step():
        store.deferring = True
        y = x
        for block in holder.blocks.values():
            y = block(y)
        y.backward(grad)
        store.deferring = False
        store.apply(store.take())

    return step


def tensor_probe_micro_batches(job, device, degree: int) -> tuple:
    """The micro-batches of ``TENSOR_PROBE_MICRO_BATCHES`` at which a member of a group of ``degree``
    can keep a probe's chain (``PROBE_BLOCKS`` blocks' kept activations and transients, and their
    parameters) within ``_TENSOR_PROBE_MEMORY_SHARE`` of its GPU's memory (every one on a CPU). The
    same on every member of a group (one device type): no member skips a size another times."""
    from dataclasses import replace

    from planner.prediction.stage_model import layer_costs

    if device.type != "cuda":
        return TENSOR_PROBE_MICRO_BATCHES
    import torch

    capacity = torch.cuda.get_device_properties(device).total_memory * _TENSOR_PROBE_MEMORY_SHARE
    shrink = 1.0 - 1.0 / degree
    sizes = []
    for b in TENSOR_PROBE_MICRO_BATCHES:
        c = layer_costs(job.model, replace(job.training, recompute=False), b, 1)
        kept = c.layer_kept_bytes - c.layer_split_kept_bytes * shrink
        params = (c.layer_params - c.layer_split_params * shrink) * c.state_bytes_per_param
        if PROBE_BLOCKS * (kept + params) + c.transient_bytes <= capacity:
            sizes.append(b)
    return tuple(sizes) or TENSOR_PROBE_MICRO_BATCHES[:1]


def tensor_probe(job, options, device, group, member: int, degree: int,
                 micro_batch_size: int = TENSOR_PROBE_MICRO_BATCH, graphs: bool | None = None) -> float:
    """Seconds per block of the runtime's tensor-parallel block (this member's share,
    ``planner.runtime.tensor_parallel.shard_stage``) forward and backward at ``micro_batch_size``,
    ``PROBE_BLOCKS`` chained as a stage runs them (one block timed alone adds its host's launch
    latency to every block: on 4x H200 a group of 4 at micro-batch 2 took 3.27 ms a block alone and
    about 2.7 ms inside the runtime), compiled as ``plan launch`` compiles blocks (as CUDA graphs where
    it graphs a first stage's group, unless ``graphs`` says otherwise); every member of ``group``
    calls it (the all-reduces)."""
    import torch
    from torch import nn

    from planner.plan.precision import resolve_precision
    from planner.runtime.gpt import Block
    from planner.runtime.graphs import compiles
    from planner.runtime.precision import runtime_dtype
    from planner.runtime.tensor_parallel import shard_stage

    model, training = job.model, job.training
    b = micro_batch_size
    dtype = runtime_dtype(resolve_precision(job.topology, [d.name for d in job.topology.devices], training.precision),
                          device)
    torch.manual_seed(0)  # the same whole blocks on every member, as the runtime builds them
    holder = nn.Module()
    holder.blocks = nn.ModuleDict({str(i): Block(model) for i in range(PROBE_BLOCKS)})
    blocks = list(shard_stage(holder, group, member, degree).to(device=device, dtype=dtype).blocks.values())
    graphs = _graphs(options, device, degree) if graphs is None else graphs
    if compiles(options.compile, "nccl" if device.type == "cuda" else "gloo"):
        # A run compiles its blocks for its one micro-batch; compiled after other sizes, the blocks
        # would get a graph for any size (torch.compile's automatic dynamic shapes), whose kernels
        # are not the run's. Each size is compiled afresh.
        torch._dynamo.reset()
        for block in blocks:  # as planner.runtime.gpt.compile_stage does to every block
            block.compile(mode="reduce-overhead" if graphs else None)
    x = torch.randn(b, model.sequence, model.hidden, device=device, dtype=dtype, requires_grad=True)
    grad = torch.randn_like(x)

    def both():
        y = x
        for block in blocks:
            y = block(y)
        y.backward(grad)

    if graphs:
        both = _as_graph_steps(blocks, x, both)[0]
    return timed(both, options.repeats, device) / PROBE_BLOCKS


def _graphs(options, device, degree: int) -> bool:
    """Whether ``plan launch --compile`` (the same choice) replays a stage of tensor degree ``degree``
    on ``device`` as CUDA graphs (``planner.runtime.graphs``): the probe times it so."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    return stage_graphed(graphed_stages(options.compile, backend), degree, cuda=device.type == "cuda")


def _as_graph_steps(blocks, x, *steps) -> tuple:
    """``steps`` as CUDA-graph replays of ``blocks`` run in a training iteration: each call a new
    step (``torch.compiler.cudagraph_mark_step_begin``, as ``planner.runtime.engine`` marks each
    iteration), the gradients accumulated in place into tensors allocated before the first call
    (as ZeRO-1's flat buffers; the runtime's other optimizers keep the first micro-batch's gradient,
    a graph output, and add the others to it, the same additions): a call's gradients kept from a
    graph's output would be overwritten by the next call's replay, which the runtime's optimizers
    avoid by dropping the gradients at each step (``planner.runtime.graphs``)."""
    import torch

    for block in blocks:
        for p in block.parameters():
            p.grad = torch.zeros_like(p)
    x.grad = torch.zeros_like(x)

    def stepped(step):
        def call():
            torch.compiler.cudagraph_mark_step_begin()
            return step()
        return call

    return tuple(stepped(step) for step in steps)


def _link_probe(rank, world, sizes, repeats, device) -> dict:
    """Round trips of every ordered pair, one pair at a time; rank 0 ends up with all of them."""
    import torch
    import torch.distributed as dist

    ack = torch.zeros(1, device=device)
    links = {}
    for i in range(world):
        for j in range(world):
            if i == j:
                continue
            times = []
            for size in sizes:
                payload = torch.zeros(size // 4, device=device)
                samples = []
                for k in range(repeats + 2):
                    dist.barrier()
                    if rank == i:
                        start = time.perf_counter()
                        dist.send(payload, j)
                        dist.recv(ack, j)
                        if device.type == "cuda":
                            torch.cuda.synchronize(device)
                        if k >= 2:
                            samples.append(time.perf_counter() - start)
                    elif rank == j:
                        dist.recv(payload, i)
                        dist.send(ack, i)
                        if device.type == "cuda":
                            torch.cuda.synchronize(device)
                times.append(statistics.median(samples) if samples else 0.0)
            result = [times]
            dist.broadcast_object_list(result, src=i)
            links[(i, j)] = (list(sizes), result[0])
    return links
