"""Discrete-event simulation of one training iteration over the per-stage op lists.

Each worker (replica r, stage s) runs its op list in order. A compute op starts when its device is
free; a receive blocks until the message has arrived; a send is asynchronous and starts when the
sender reaches it and every resource it crosses is free (``cost_models.network``: the directed
link, and the sender's egress and receiver's ingress NIC where the host has a shared NIC). A
message occupies its resources for ``bytes / bandwidth`` and arrives ``latency`` later
(formulas.md, Communication).
The gradient sync of stage s starts when every replica's stage s has finished its last backward
and its ring's links are free; the iteration ends when the last optimizer step ends (formulas.md,
Pipeline schedules).
"""

import heapq
import math
import time
from dataclasses import dataclass, field

import numpy as np

from cost_models.network import Network
from cost_models.schedule import COMPUTE_KINDS, peer_stage, piece_of, stage_ops

__all__ = ["PipelineJob", "Timeline", "SimulationCut", "simulate", "sync_resources", "op_compute_s"]

_CLOCK_EVERY = 4096  # events between two readings of the clock against ``simulate``'s deadline


class SimulationCut(RuntimeError):
    """The clock passed ``simulate``'s deadline before the iteration's last event."""


@dataclass(frozen=True, kw_only=True, eq=False)
class PipelineJob:
    """Everything the simulator needs, as plain arrays in SI units.

    ``device[r, s]`` is the device index of replica r, stage s; ``forward_s``/``backward_s`` are
    per-micro-batch compute times of that worker; ``boundary_bytes[s]`` is the message between
    stage s and s+1 (activation forward, gradient backward); ``sync_s[s]`` the all-reduce time of
    stage s and ``sync_links[s]`` the directed links (a, b) its ring uses; ``network`` prices each
    message and names the links and NICs it occupies (``cost_models.network``).
    """

    schedule: str
    device: np.ndarray
    micro_batches: np.ndarray
    forward_s: np.ndarray
    backward_s: np.ndarray
    boundary_bytes: np.ndarray
    network: Network
    sync_s: np.ndarray
    sync_links: tuple = ()
    optimizer_s: np.ndarray = None
    sync_bytes: np.ndarray = None  # per stage, the bytes its all-reduce reduces (None: NICs held for the whole sync)
    # Per stage, what its sync holds as (resource, seconds) (``Network.sync_holds`` of the plan's
    # algorithm); empty: a ring over ``sync_links``.
    sync_holds: tuple = ()
    micro_batches_per_round: int = 0  # accumulation rounds (``cost_models.schedule.stage_ops``; 0: one round)
    # The weight gradients' share of each worker's backward (R, S), for schedules that split it into
    # ``bwd_input`` and ``bwd_weight`` (``cost_models.flops.weight_gradient_share``).
    weight_gradient_share: np.ndarray = None
    # Interleaved 1F1B: model chunks per device (``cost_models.schedule.stage_ops``), and each chunk's
    # share of its stage's compute (S, v; None: equal shares). Every message crosses a boundary of
    # the same size: ``boundary_bytes[0]`` prices the last stage -> first stage wrap too.
    virtual_stages: int = 1
    chunk_share: np.ndarray = None
    warmup_depth: int = 1  # 1F1B's warm-up forwards per stage downstream (``cost_models.schedule.one_f_one_b_warmup``)

    @property
    def replicas(self) -> int:
        return self.device.shape[0]

    @property
    def stages(self) -> int:
        return self.device.shape[1]


@dataclass(kw_only=True)
class Timeline:
    """Result: the iteration time, per-op records and a breakdown along the critical worker."""

    iteration_s: float
    records: list = field(default_factory=list)  # (replica, stage, kind, microbatch, start_s, end_s)
    stage_finish_s: np.ndarray = None  # last backward of each stage over its replicas
    sync_window_s: np.ndarray = None  # (S, 2) start and end of each stage's all-reduce
    breakdown_s: dict = field(default_factory=dict)
    critical: tuple = (0, 0)


class _Resources:
    def __init__(self):
        self.free_at = {}

    def reserve(self, holds, ready_s: float) -> float:
        """Start of a use of every ``(resource, seconds)`` in ``holds`` ready at ``ready_s``: when all
        are free; each is then busy for its own seconds."""
        start = max([ready_s] + [self.free_at.get(k, 0.0) for k, _ in holds])
        for k, busy in holds:
            self.free_at[k] = start + busy
        return start


def sync_resources(job: PipelineJob, stage: int) -> list:
    """What ``stage``'s gradient all-reduce holds, as ``(resource, seconds)``: its ring's links for
    the whole all-reduce, and each shared NIC it crosses for the ring's bytes through it
    (``Network.ring_nic_holds``; the whole all-reduce when the job has no ``sync_bytes``), or what
    the job's ``sync_holds`` says for the plan's algorithm (``Network.sync_holds``)."""
    if job.sync_holds:
        return list(job.sync_holds[stage])
    links = job.sync_links[stage] if job.sync_links else ()
    seconds = float(job.sync_s[stage])
    holds = {("link", int(a), int(b)): seconds for a, b in links}
    if links and job.sync_bytes is not None:
        order = [a for a, _ in links]
        holds.update(dict(job.network.ring_nic_holds(order, float(job.sync_bytes[stage]), seconds)))
    else:
        for a, b in links:
            holds.update({k: seconds for k, _ in job.network.transfer_holds(a, b, 0.0)})
    return list(holds.items())


def op_compute_s(job: PipelineJob, kind: str, r: int, s: int, chunk: int = 0) -> float:
    """Seconds of worker (r, s)'s compute op ``kind`` for one micro-batch on ``chunk`` (``COMPUTE_KINDS``;
    the optimizer step: ``optimizer_s``)."""
    if kind == "step":
        return float(job.optimizer_s[r, s]) if job.optimizer_s is not None else 0.0
    share = 1.0
    if job.virtual_stages > 1:
        share = float(job.chunk_share[s, chunk]) if job.chunk_share is not None else 1.0 / job.virtual_stages
    if kind == "fwd":
        return float(job.forward_s[r, s]) * share
    backward = float(job.backward_s[r, s]) * share
    if kind == "bwd":
        return backward
    share = float(job.weight_gradient_share[r, s]) if job.weight_gradient_share is not None else 0.5
    return backward * (share if kind == "bwd_weight" else 1.0 - share)


def _transfer(job: PipelineJob, resources: _Resources, a: int, b: int, nbytes: float, ready_s: float) -> tuple:
    holds = job.network.transfer_holds(a, b, nbytes)
    start = resources.reserve(holds, ready_s)
    return start, start + holds[0][1] + job.network.latency_s[a, b]


def simulate(job: PipelineJob, *, keep_records: bool = True, deadline: float = math.inf) -> Timeline:
    """Simulate one iteration of ``job`` and return its ``Timeline``; raises ``SimulationCut`` when
    ``time.perf_counter()`` passes ``deadline`` first (read every ``_CLOCK_EVERY`` events)."""
    R, S = job.replicas, job.stages
    optimizer_s = job.optimizer_s if job.optimizer_s is not None else np.zeros((R, S))
    ops = {(r, s): stage_ops(job.schedule, s, S, int(job.micro_batches[r]), job.micro_batches_per_round,
                             job.virtual_stages, job.warmup_depth)
           for r in range(R) for s in range(S)}
    pointer = dict.fromkeys(ops, 0)
    parked_at = {}  # worker -> time it started waiting for a message
    arrivals = {}  # (r, "act"|"grad", boundary, mb) -> (send_start, arrival)
    parked = {}  # message key -> worker waiting for it
    waits = {w: [] for w in ops}  # (wait_start, arrival, send_start)
    compute_s = dict.fromkeys(ops, 0.0)
    sync_ready = {s: [] for s in range(S)}
    sync_window = np.zeros((S, 2))
    stage_finish = np.zeros(S)
    resources = _Resources()
    records = []
    heap = [(0.0, r * S + s, (r, s)) for r in range(R) for s in range(S)]
    heapq.heapify(heap)
    done = {}

    def record(w, kind, mb, start, end):
        if keep_records:
            records.append((w[0], w[1], kind, mb, start, end))

    events = 0
    while heap:
        events += 1
        if events % _CLOCK_EVERY == 0 and time.perf_counter() > deadline:
            raise SimulationCut(f"the clock passed the simulation's deadline after {events} events")
        now, order, w = heapq.heappop(heap)
        r, s = w
        ops_w = ops[w]
        while pointer[w] < len(ops_w):
            kind, mb, chunk = ops_w[pointer[w]]
            piece = piece_of(s, S, chunk)  # the message keys name model pieces (stages when v = 1)
            if kind in COMPUTE_KINDS:
                duration = op_compute_s(job, kind, r, s, chunk)
                record(w, kind, mb, now, now + duration)
                compute_s[w] += duration
                pointer[w] += 1
                now += duration
                if kind != "fwd":
                    stage_finish[s] = max(stage_finish[s], now)
                heapq.heappush(heap, (now, order, w))
                break
            if kind in ("send_fwd", "send_bwd"):
                forward = kind == "send_fwd"
                boundary = piece if forward else piece - 1
                peer = job.device[r, peer_stage(s, S, forward)]
                nbytes = job.boundary_bytes[boundary if job.virtual_stages == 1 else 0]
                start, arrival = _transfer(job, resources, job.device[r, s], peer, nbytes, now)
                key = (r, "act" if forward else "grad", boundary, mb)
                arrivals[key] = (start, arrival)
                record(w, kind, mb, start, arrival)
                pointer[w] += 1
                if key in parked:
                    waiter = parked.pop(key)
                    heapq.heappush(heap, (max(parked_at[waiter], arrival), waiter[0] * S + waiter[1], waiter))
                continue
            if kind in ("recv_fwd", "recv_bwd"):
                key = (r, "act", piece - 1, mb) if kind == "recv_fwd" else (r, "grad", piece, mb)
                if key not in arrivals:
                    parked_at[w] = now
                    parked[key] = w
                    break
                send_start, arrival = arrivals[key]
                wait_start = min(parked_at.pop(w, now), now)
                waits[w].append((wait_start, arrival, send_start))
                record(w, kind, mb, wait_start, max(wait_start, arrival))
                pointer[w] += 1
                now = max(now, arrival)
                continue
            if kind == "sync":
                sync_ready[s].append((now, w))
                if len(sync_ready[s]) < R:
                    break
                ready = max(t for t, _ in sync_ready[s])
                start = resources.reserve(sync_resources(job, s), ready)
                end = start + job.sync_s[s]
                sync_window[s] = (start, end)
                for t_w, member in sync_ready[s]:
                    record(member, "sync", -1, start, end)
                    pointer[member] += 1
                    heapq.heappush(heap, (end, member[0] * S + member[1], member))
                break
            if kind == "step":
                end = now + optimizer_s[r, s]
                record(w, "step", -1, now, end)
                pointer[w] += 1
                done[w] = end
                break

    if len(done) != R * S:
        stuck = sorted(set(ops) - set(done))
        raise RuntimeError(f"simulation deadlocked; workers {stuck[:4]} never finished")
    iteration = max(done.values())
    critical = max(done, key=lambda w: (done[w], compute_s[w]))
    breakdown = _breakdown(job, critical, iteration, compute_s, waits, sync_window, optimizer_s)
    return Timeline(iteration_s=iteration, records=records, stage_finish_s=stage_finish, sync_window_s=sync_window,
                    breakdown_s=breakdown, critical=critical)


def _breakdown(job, critical, iteration, compute_s, waits, sync_window, optimizer_s) -> dict:
    """Split the iteration along the critical worker: compute + transfer wait + bubble + sync + step."""
    r, s = critical
    compute = compute_s[critical]
    sync = float(sync_window[s, 1] - sync_window[s, 0])
    step = float(optimizer_s[r, s])
    transfer = 0.0
    for wait_start, arrival, send_start in waits[critical]:
        if arrival > wait_start:
            transfer += arrival - max(wait_start, send_start)
    idle = max(iteration - compute - sync - step, 0.0)
    transfer = min(transfer, idle)
    return {"compute_s": compute, "pipeline_transfer_s": transfer, "bubble_s": idle - transfer,
            "gradient_sync_s": sync, "optimizer_s": step}
