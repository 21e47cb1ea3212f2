"""Checks made before any rank starts: the plan fits its devices, the devices are here, the results
folder can take the results, and an estimate of the first iteration for runs that will be slow."""

import errno
import os
import shutil
import time
import uuid
from pathlib import Path

from planner.errors import InputError

__all__ = ["is_cpu_type", "check_memory", "check_devices_present", "cpu_flops", "first_iteration_estimate",
           "results_bytes", "prepare_out_folder", "format_duration"]

_RESULTS_BASE_BYTES = 2 * 2**20  # results.json and trace.json beyond the per-op records
_BYTES_PER_OP_RECORD = 400  # one op in results.json's trace plus one Chrome-trace event, JSON-encoded
_PROBE_LIMIT_BYTES = 256 * 2**20  # the space reserved by the probe write is at most this


def is_cpu_type(type_name: str) -> bool:
    """Whether a catalog device type is a CPU (``CPU-core``): the runtime runs those with gloo on this
    host's cores; every other type is a GPU that needs CUDA (or emulation)."""
    return type_name.upper().startswith("CPU")


def check_memory(inputs, *, refuse: bool = True, compiled: bool = True) -> str | None:
    """Re-check memory with the plan's own model and training (an edited ``model.hidden`` shows here)
    and the way the run computes its loss (``compiled``: an eager loss keeps more,
    ``cost_models.memory.loss_bytes``). A plan that does not fit is refused on real devices; for
    emulation (``refuse=False``, where what-if plans are measured too) the problem is returned instead."""
    from planner.plan.plan import validate_plan
    from planner.prediction.predict import predict

    prediction = predict(inputs.plan, inputs.topology, inputs.model, inputs.training, compiled=compiled)[0]
    try:
        validate_plan(inputs.plan.with_prediction(prediction), inputs.topology, inputs.model, inputs.training)
    except InputError as error:
        eager = not compiled and error.field == "memory" and check_memory(inputs, refuse=False) is None
        if not refuse and error.field == "memory":
            return f"{error.detail}: the plan does not fit in memory" + (" with an eager loss" if eager else "")
        if eager:  # fits as planned, with the compiled loss
            raise InputError(f"{error.detail} with the eager loss of --compile off (fp32 log-probabilities): "
                             "launch with --compile auto (the plan counts the compiled loss's)",
                             source=inputs.plan_path, field="--compile") from None
        raise InputError(f"{error.detail} with this model and training: plan again (was model or training edited?)",
                         source=inputs.plan_path, field=error.field) from None
    return None


def check_devices_present(inputs, backend_choice: str, gpus: int) -> None:
    """Refuse to train a plan for GPUs on a host without CUDA unless the user asked for the CPU
    (``--backend gloo``): otherwise a full-size model would start training on the CPU unannounced."""
    used = sorted({inputs.topology.devices[inputs.topology.index(d)].type_name
                   for row in inputs.plan.assignment for d in row})
    gpu_types = [t for t in used if not is_cpu_type(t)]
    if gpus or not gpu_types or backend_choice == "gloo":
        return
    world = len(inputs.plan.used_devices)
    raise InputError(f"the plan runs {world} {'/'.join(gpu_types)} GPU(s) but this host has no CUDA GPU: "
                     "--emulate emulates them here, --hostfile runs on the hosts that have them, "
                     "--backend gloo trains the full model on this CPU anyway", source=inputs.plan_path,
                     field="replicas")


def cpu_flops(seconds: float = 0.3) -> float:
    """FLOP/s of fp32 matrix products on this host's CPU with torch's default threads: the best of
    repeated 1024 x 1024 products over about ``seconds`` (the best, so that a moment of load elsewhere
    does not make the estimate pessimistic)."""
    import torch

    n = 1024
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best, spent = float("inf"), 0.0
    while spent < seconds:
        start = time.perf_counter()
        torch.mm(a, b)
        took = time.perf_counter() - start
        best, spent = min(best, took), spent + took
    return 2.0 * n**3 / best


def first_iteration_estimate(inputs, host_flops: float) -> float:
    """A lower bound on the seconds of one iteration of the plan's full model on this CPU: its model
    FLOPs (with the recomputation of the lightest mode any of its workers runs, so that mixed modes
    keep it a bound) over the host's matrix-product FLOP/s, all ranks sharing the cores (norms,
    softmax and messages only add to it)."""
    from planner.plan.recompute import RELAXED_ORDER, mode_of, plan_modes, training_value
    from planner.prediction.stage_model import iteration_flops

    lightest = min((mode_of(mode) for row in plan_modes(inputs.plan, inputs.training) for mode in row),
                   key=RELAXED_ORDER.index)
    flops = iteration_flops(inputs.model, inputs.plan.global_batch, recompute=training_value(lightest))
    return flops / host_flops


def format_duration(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.2g} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.0f} days"


def results_bytes(inputs, iterations: int, warmup: int, save_state: bool) -> int:
    """Bytes a run writes in its folder: per-op records of every measured iteration, and weights."""
    plan = inputs.plan
    ops_per_iteration = sum(4 * plan.micro_batches[r] + 2 for r in range(plan.replicas)) * plan.stages
    total = _RESULTS_BASE_BYTES + _BYTES_PER_OP_RECORD * ops_per_iteration * (iterations + 2)
    if save_state:
        from planner.prediction.stage_model import layer_costs, stage_parameters
        import numpy as np

        costs = layer_costs(inputs.model, inputs.training, plan.micro_batch_size, plan.stages)
        counts = np.diff(plan.stage_bounds)
        total += int(sum(4 * float(stage_parameters(costs, counts[s], s)) for s in range(plan.stages)))
    return int(total)


def prepare_out_folder(out_dir, need_bytes: int, *, field: str = "--out") -> bool:
    """Make sure ``out_dir`` is a folder this process can write ``need_bytes`` into, before anything
    starts: create it (returns True when it did, so a failed launch can remove it), write and remove
    a probe that reserves the space. Every problem is one ``InputError`` and leaves nothing behind."""
    path = Path(out_dir)
    if path.exists() and not path.is_dir():
        raise InputError("is an existing file, not a folder: name a folder (it is created if missing)",
                         source=str(path), field=field)
    missing = []
    parent = path
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        _remove(missing)
        raise InputError(f"cannot create it ({_reason(error)}): choose a writable folder", source=str(path),
                         field=field) from None
    probe = path / f".write-probe-{uuid.uuid4().hex}.tmp"
    try:
        free = shutil.disk_usage(path).free
        if free < need_bytes:
            raise OSError(errno.ENOSPC, "not enough space")
        _reserve(probe, min(need_bytes, _PROBE_LIMIT_BYTES))
    except OSError as error:
        probe.unlink(missing_ok=True)
        _remove(missing)
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            raise InputError(f"has {shutil.disk_usage(parent).free / 1e6:.1f} MB free but the run writes about "
                             f"{need_bytes / 1e6:.1f} MB: free space or choose another folder", source=str(path),
                             field=field) from None
        raise InputError(f"cannot write there ({_reason(error)}): choose a writable folder", source=str(path),
                         field=field) from None
    probe.unlink(missing_ok=True)
    return bool(missing)


def _reserve(path: Path, size: int) -> None:
    """Create ``path`` holding ``size`` bytes of disk (a full disk or quota fails here, not after the run)."""
    handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        if hasattr(os, "posix_fallocate"):
            os.posix_fallocate(handle, 0, size)
        else:
            os.write(handle, b"\0" * size)
    finally:
        os.close(handle)


def _remove(created: list) -> None:
    for folder in created:  # deepest first
        try:
            folder.rmdir()
        except OSError:
            pass


def _reason(error: OSError) -> str:
    return os.strerror(error.errno) if error.errno else type(error).__name__
