"""Emulation of the plan's devices and network inside the runtime, on one host.

Each op really runs (on a reduced model), then the process sleeps until the op would have ended on
the plan's device: compute takes ``flops / effective FLOP/s``; a message is stamped by its sender
with a deliver-at time from the link's latency and bandwidth, queueing behind earlier messages on
the same link and NICs (a free-at table shared by all local processes), and the receiver sleeps
until then; after the real all-reduce every member sleeps until the modelled end of the sync. The
durations are those of ``cost_models.simulator`` (the same ``PipelineJob``), times ``time_scale``,
so a geo-distributed plan runs at a fraction of its real duration.
"""

import time

import numpy as np

from cost_models.simulator import PipelineJob, sync_resources

__all__ = ["SharedResources", "Emulator", "resource_slots", "sleep_until", "now_s"]


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

    def reserve(self, keys, ready_s: float, busy_s: float) -> float:
        """Start of a use of ``keys`` ready at ``ready_s`` and lasting ``busy_s`` (same rule as the simulator)."""
        slots = [self._slot(k) for k in keys]
        with self.array.get_lock():
            start = max([ready_s] + [self.array[i] for i in slots])
            for i in slots:
                self.array[i] = start + busy_s
        return start


class Emulator:
    """What one worker (replica, stage) sleeps for. Times are in seconds of this host's monotonic clock."""

    def __init__(self, job: PipelineJob, resources: SharedResources, *, time_scale: float, replica: int, stage: int):
        self.job, self.resources, self.scale = job, resources, time_scale
        self.replica, self.stage = replica, stage
        self.device = int(job.device[replica, stage])

    def compute_end_s(self, kind: str, start_s: float) -> float:
        table = {"fwd": self.job.forward_s, "bwd": self.job.backward_s}.get(kind)
        if table is None:  # "step"
            table = self.job.optimizer_s if self.job.optimizer_s is not None else np.zeros_like(self.job.forward_s)
        return start_s + float(table[self.replica, self.stage]) * self.scale

    def deliver_at_s(self, peer_stage: int, ready_s: float) -> float:
        """Reserve the link to ``peer_stage`` for one boundary message; when it arrives there."""
        peer = int(self.job.device[self.replica, peer_stage])
        boundary = min(self.stage, peer_stage)
        network = self.job.network
        busy = float(network.busy_s(self.device, peer, self.job.boundary_bytes[boundary])) * self.scale
        start = self.resources.reserve(network.transfer_resources(self.device, peer), ready_s, busy)
        return start + busy + float(network.latency_s[self.device, peer]) * self.scale

    def sync_end_s(self, ready_s: float) -> float:
        """Reserve this stage's ring for its all-reduce once every member is ready; when it ends."""
        busy = float(self.job.sync_s[self.stage]) * self.scale
        start = self.resources.reserve(sync_resources(self.job, self.stage), ready_s, busy)
        return start + busy
