"""Emulation of the plan's devices and network inside the runtime, on one host.

Each op really runs (on a reduced model), then the process sleeps until the op would have ended on
the plan's device: compute takes ``flops / effective FLOP/s``; a message is stamped by its sender
with a deliver-at time from the link's latency and bandwidth, queueing behind earlier messages on
the same link and NICs (a free-at table shared by all local processes), and the receiver sleeps
until then; after the real all-reduce every member sleeps until the modelled end of the sync. The
durations are those of ``cost_models.simulator`` (the same ``PipelineJob``), times ``time_scale``,
so a geo-distributed plan runs at a fraction of its real duration. A ``Slowdown`` makes one device
a straggler from a given iteration on (``plan launch --emulate --slow DEVICE:FACTOR[@ITERATION]``).
"""

import time
from dataclasses import dataclass, replace

import numpy as np

from cost_models.schedule import COMPUTE_KINDS
from cost_models.simulator import PipelineJob, op_compute_s, sync_resources

__all__ = ["SharedResources", "Emulator", "resource_slots", "sleep_until", "now_s", "compute_overrun",
           "OVERRUN_WARNING_SHARE", "Slowdown", "slowed_job"]

OVERRUN_WARNING_SHARE = 0.02  # compute overrun of the worst rank, as a share of the iteration, that is warned of
_COMPUTE_KINDS = COMPUTE_KINDS + ("step",)


def now_s() -> float:
    """CLOCK_MONOTONIC: one clock for every process of the host."""
    return time.monotonic()


def sleep_until(deadline_s: float) -> None:
    remaining = deadline_s - now_s()
    if remaining > 0:
        time.sleep(remaining)


def resource_slots(devices: int, hosts: int) -> int:
    """Size of the free-at table: one slot per directed link, per host egress and per host ingress."""
    return devices * devices + 2 * hosts


class SharedResources:
    """Free-at times of links and NICs in a ``multiprocessing.Array('d')`` shared by local ranks."""

    def __init__(self, array, devices: int, hosts: int):
        self.array, self.devices, self.hosts = array, devices, hosts

    def _slot(self, key) -> int:
        if key[0] == "link":
            return key[1] * self.devices + key[2]
        offset = self.devices * self.devices + (0 if key[0] == "egress" else self.hosts)
        return offset + key[1]

    def reserve(self, holds, ready_s: float) -> float:
        """Start of a use of every ``(resource, seconds)`` in ``holds`` ready at ``ready_s`` (the
        simulator's rule: when all are free; each then busy for its own seconds)."""
        slots = [(self._slot(k), busy) for k, busy in holds]
        with self.array.get_lock():
            start = max([ready_s] + [self.array[i] for i, _ in slots])
            for i, busy in slots:
                self.array[i] = start + busy
        return start


@dataclass(frozen=True)
class Slowdown:
    """An emulated straggler: ``device``'s compute takes ``factor`` times the plan's from iteration
    ``first`` on (1-based, warm-up included, as the launch's progress lines count)."""

    device: str
    factor: float
    first: int = 1


def slowed_job(job: PipelineJob, device_index: int, factor: float) -> PipelineJob:
    """``job`` with every worker on ``device_index`` computing ``factor`` times slower (forward,
    backward and optimizer step), for the emulation and for predicting the straggler's cost."""
    on = (job.device == device_index)
    scale = np.where(on, factor, 1.0)
    optimizer = job.optimizer_s * scale if job.optimizer_s is not None else None
    return replace(job, forward_s=job.forward_s * scale, backward_s=job.backward_s * scale, optimizer_s=optimizer)


class Emulator:
    """What one worker (replica, stage) sleeps for. Times are in seconds of this host's monotonic clock."""

    def __init__(self, job: PipelineJob, resources: SharedResources, *, time_scale: float, replica: int, stage: int,
                 slow: tuple = (None, 1)):
        self.job, self.resources, self.scale = job, resources, time_scale
        self.replica, self.stage = replica, stage
        self.device = int(job.device[replica, stage])
        self.slow_job, self.slow_from = slow  # (the slowed job or None, first iteration it applies to, 1-based)
        self.iteration = 1  # set by the executor at the start of each iteration

    def compute_end_s(self, kind: str, start_s: float, chunk: int = 0) -> float:
        slowed = self.slow_job is not None and self.iteration >= self.slow_from
        job = self.slow_job if slowed else self.job
        return start_s + op_compute_s(job, kind, self.replica, self.stage, chunk) * self.scale

    def deliver_at_s(self, peer_stage: int, ready_s: float) -> float:
        """Reserve the link to ``peer_stage`` for one boundary message; when it arrives there."""
        peer = int(self.job.device[self.replica, peer_stage])
        boundary = min(self.stage, peer_stage) if self.job.virtual_stages == 1 else 0  # one size when interleaved
        network = self.job.network
        holds = [(k, busy * self.scale)
                 for k, busy in network.transfer_holds(self.device, peer, self.job.boundary_bytes[boundary])]
        start = self.resources.reserve(holds, ready_s)
        return start + holds[0][1] + float(network.latency_s[self.device, peer]) * self.scale

    def sync_end_s(self, ready_s: float) -> float:
        """Reserve this stage's ring for its all-reduce once every member is ready; when it ends."""
        holds = [(k, busy * self.scale) for k, busy in sync_resources(self.job, self.stage)]
        start = self.resources.reserve(holds, ready_s)
        return start + float(self.job.sync_s[self.stage]) * self.scale


def compute_overrun(trace: list, job: PipelineJob, time_scale: float, iteration_s: float, *, names: dict) -> dict:
    """How far the measured compute ops of an emulated iteration ran past the plan's durations.

    An emulated op sleeps until ``start + plan duration x time_scale``, so it lasts longer only when
    this host's real work (the reduced model, Python, a loaded CPU) took longer than the plan allows;
    then every later op shifts and the run measures the host, not the plan. ``trace``: the measured
    ops (dicts with rank, replica, stage, kind, start_s, end_s, seconds of this host); ``iteration_s``:
    the predicted iteration in seconds of this host. Returns totals per rank, the worst rank's share
    of the iteration, a suggested time scale and a warning (``""`` when the share is small).
    """
    per_rank, ops, over = {}, 0, 0
    for op in trace:
        if op["kind"] not in _COMPUTE_KINDS:
            continue
        planned = op_compute_s(job, op["kind"], op["replica"], op["stage"], op.get("chunk", 0)) * time_scale
        excess = max(op["end_s"] - op["start_s"] - planned, 0.0)
        ops += 1
        over += excess > 0.05 * planned
        entry = per_rank.setdefault(op["rank"], {"planned_s": 0.0, "overrun_s": 0.0})
        entry["planned_s"] += planned
        entry["overrun_s"] += excess
    worst = max(per_rank, key=lambda r: per_rank[r]["overrun_s"]) if per_rank else None
    share = per_rank[worst]["overrun_s"] / iteration_s if worst is not None and iteration_s > 0 else 0.0
    # A scale at which each rank's planned compute covers what this host took, with a 1.5x margin.
    stretch = max([(v["planned_s"] + v["overrun_s"]) / v["planned_s"] for v in per_rank.values() if v["planned_s"] > 0]
                  + [1.0])
    suggested = time_scale * stretch * 1.5
    warning = ""
    if share > OVERRUN_WARNING_SHARE:
        w = per_rank[worst]
        warning = (f"this host overran the plan's compute times: {names.get(worst, f'rank {worst}')} took "
                   f"{w['overrun_s']:.3f} s more than its planned {w['planned_s']:.3f} s of compute in the median "
                   f"iteration ({100 * share:.1f}% of the predicted {iteration_s:.3f} s), so the measured time is "
                   f"the host's, not the plan's; {over} of {ops} compute ops ran over: rerun with --time-scale "
                   f"{suggested:.3g} or less load on this host")
    return {"ops": ops, "ops_over": int(over), "worst_rank": worst, "worst_share_of_iteration": share,
            "per_rank": {str(r): v for r, v in sorted(per_rank.items())}, "time_scale": time_scale,
            "suggested_time_scale": suggested, "warning": warning}
