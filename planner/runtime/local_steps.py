"""Local steps (DiLoCo, Douillard et al. 2023, arXiv 2311.08105, Algorithm 1) for one worker.

Each replica takes ``sync_every`` optimizer steps on its own data with no data-parallel sync (the
pipeline's messages flow as usual; ``planner.runtime.engine`` skips the stage's all-reduce). Then
the outer step: the parameter delta since the last sync (snapshot - current, the outer gradient) is
averaged over the stage's replicas, an outer Nesterov step from the snapshot sets the weights
(``m = mu m + delta``, ``theta = snapshot - lr (delta + mu m)``, as ``torch.optim.SGD`` with
``nesterov=True``), and the result becomes the new snapshot. The snapshot and the momentum are fp32
(the 8 B per parameter the cost model charges); the deltas travel at the weights' precision, the
same bytes as one gradient all-reduce.

With sync groups (``planner.plan.sync_groups``) a group's replicas all-reduce their gradients every
iteration (the engine, over the group's ranks) and so hold the same weights and delta: the outer
sync runs between the groups' leads, and each lead broadcasts the mean to its group. With one group
there is nothing to exchange. Every delta (a replica's, or a group's) is weighted by its share of
the batch's tokens (``planner.plan.sync_groups.outer_weights``).
"""

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from planner.runtime.gradient_sync import ring_member_bytes

__all__ = ["LocalSteps", "outer_nesterov_step", "master_copies"]

_BUCKET_BYTES = 64 * 2**20  # as the gradient all-reduce (planner.runtime.engine.BUCKET_BYTES)


def outer_nesterov_step(snapshot: list, delta: list, momentum: list, *, learning_rate: float,
                        momentum_factor: float) -> list:
    """The outer step of DiLoCo on fp32 tensors: updates ``momentum`` in place and returns the new
    parameters ``snapshot - lr * (delta + mu * m)`` with ``m = mu * m + delta`` (Nesterov momentum,
    Sutskever et al. 2013, in ``torch.optim.SGD``'s form; ``delta`` is the averaged outer gradient)."""
    new = []
    for s, d, m in zip(snapshot, delta, momentum):
        m.mul_(momentum_factor).add_(d)
        new.append(s - learning_rate * (d + momentum_factor * m))
    return new


def master_copies(optimizer) -> dict:
    """id(16-bit weight) -> its fp32 master copy in ``optimizer``'s parts (none for fp32 weights)."""
    found = {}
    for part in getattr(optimizer, "parts", ()):
        for chunk, masters in zip(getattr(part, "chunks", ()), getattr(part, "masters", ())):
            found.update({id(p): m for p, m in zip(chunk, masters)})
    return found


class LocalSteps:
    """A worker's outer loop: the snapshot, the outer momentum, the outer step every ``sync_every``
    iterations over ``group`` (the stage's ``replicas``), and the bytes it hands the all-reduce."""

    def __init__(self, parameters, *, sync_every: int, learning_rate: float, momentum: float, group, replicas: int,
                 masters: dict | None = None, weight: float, within=None, source: int = 0):
        """``group``: the ranks the deltas are summed over (the stage's replicas; with sync groups the
        groups' leads, None on other ranks and with one group); ``weight``: this rank's delta's weight
        in that sum, its replica's or sync group's share of the tokens (``outer_weights``; the
        weights of ``group`` add up to 1); ``within``: the sync group's ranks, to which ``source``
        (the lead's global rank) broadcasts the mean (None: a group of one, or one group)."""
        assert sync_every > 1 and replicas > 1, "local steps need a sync to space out"
        self.parameters = list(parameters)
        self.masters = masters or {}  # id(weight) -> its fp32 master copy, for 16-bit weights
        self.sync_every, self.learning_rate, self.momentum_factor = sync_every, learning_rate, momentum
        self.group, self.replicas = group, replicas
        self.weight, self.within, self.source = weight, within, source
        self.snapshot = [self._fp32(p).detach().clone() for p in self.parameters]
        self.momentum = [torch.zeros_like(s) for s in self.snapshot]
        self.bytes_sent = 0  # message bytes handed to the delta all-reduce, all outer steps together
        self.outer_steps = 0

    def due(self, iteration: int) -> bool:
        """Whether the outer step follows iteration ``iteration`` (0-based)."""
        return (iteration + 1) % self.sync_every == 0

    def _fp32(self, p: torch.Tensor) -> torch.Tensor:
        return self.masters.get(id(p), p)

    @torch.no_grad()
    def outer_step(self) -> None:
        """Average the deltas over the stage's replicas (by tokens), step, set the weights, take the new snapshot."""
        current = [self._fp32(p).float() for p in self.parameters]
        wire = [(s - c).to(p.dtype) for s, c, p in zip(self.snapshot, current, self.parameters)]
        if self.group is not None:  # the mean over the tokens: each delta weighted by its share of them
            for w in wire:
                w.mul_(self.weight)
            self._in_buckets(wire, self._reduce)
        if self.within is not None:  # the lead's mean to the rest of its group
            self._in_buckets(wire, self._broadcast)
        delta = [w.float() for w in wire]
        new = outer_nesterov_step(self.snapshot, delta, self.momentum, learning_rate=self.learning_rate,
                                  momentum_factor=self.momentum_factor)
        for p, value in zip(self.parameters, new):
            master = self.masters.get(id(p))
            if master is not None:
                master.copy_(value)
            p.copy_(value)
        self.snapshot = [v.clone() for v in new]
        self.outer_steps += 1

    @staticmethod
    def _in_buckets(tensors: list, run) -> None:
        bucket, size = [], 0
        for t in tensors:
            bucket.append(t)
            size += t.numel() * t.element_size()
            if size >= _BUCKET_BYTES:
                run(bucket)
                bucket, size = [], 0
        if bucket:
            run(bucket)

    def _reduce(self, bucket: list) -> None:
        flat = _flatten_dense_tensors(bucket)
        self.bytes_sent += ring_member_bytes(flat, self.group)
        dist.all_reduce(flat, group=self.group)
        for t, reduced in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
            t.copy_(reduced)

    def _broadcast(self, bucket: list) -> None:
        flat = _flatten_dense_tensors(bucket)
        self.bytes_sent += ring_member_bytes(flat, self.within)  # a long-message broadcast: scatter, then all-gather
        dist.broadcast(flat, self.source, group=self.within)
        for t, value in zip(bucket, _unflatten_dense_tensors(flat, bucket)):
            t.copy_(value)
