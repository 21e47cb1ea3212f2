"""PowerSGD gradient sync (Vogels et al. 2019, arXiv 1905.13727) for the runtime's own all-reduce.

Why not torch's: ``torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook`` is a DDP
communication hook. It is called by DDP's C++ reducer with a ``GradBucket`` and returns a future
chained into DDP's bucket flow, and its ``PowerSGDState`` keys the error memory and the warm-started
``Q`` by DDP's bucket index. This runtime does not use DDP (``engine._sync`` sums each stage's
gradients over its own replica group, bucketed), so the hook cannot run without faking DDP's bucket
type, and its private orthogonalisation is not an API. The algorithm is short, so it is written
here, per matrix, with the hook's choices: vectors (biases, norms) and matrices that would not
shrink (``r (n + m) >= n m``) are all-reduced whole; all ``P`` are all-reduced in one flat
tensor, then all ``Q`` in another; fp32 arithmetic; ``Q`` warm-started from the last step.

One step per matrix ``G`` (``n x m``) of replica ``w`` (Algorithm 1 with the error feedback of
Algorithm 2): ``M = G + E``; ``P = sum_w M Q``; ``P <- orthonormal(P)`` (reduced QR);
``Q_w = M^T P``; ``E <- M - P Q_w^T``; ``Q = sum_w Q_w``; ``G <- P Q^T``. The runtime sums (not
averages) gradients over replicas, so sums replace the paper's averages. The error memory is kept
unscaled (fp16 loss scaling divides the gradient by the scale first), and a step whose ``P`` is
not finite (an fp16 overflow) sends the gradients whole, so the loss scaler sees the overflow and
the state is not touched.

With tensor groups (``planner.runtime.tensor_parallel``) each member holds one instance over its
own parameters, synced over its counterparts in the other replicas (``StageGroups.stage``): its
shards of the split matrices (its rows of QKV and fc1, its columns of the projection and fc2) are
matrices like any other, each with its error memory and warm-started ``Q``; the lead's also covers
the whole parameters, which the other members do not train (``follow_lead``). This is PowerSGD of
each shard, not the shards of PowerSGD of the whole matrix (a rank-r approximation of a row block
is not the row block of a rank-r approximation); every member's ``P`` and ``Q`` cross the wire
(``cost_models.compression.block_matrix_shapes`` with ``tensor``, which the cost model charges).
"""

import torch
import torch.distributed as dist

from cost_models.compression import POWERSGD_VALUE_BYTES, powersgd_compresses

__all__ = ["PowerSGD"]


class PowerSGD:
    """The PowerSGD state of one worker's ``parameters`` synced over ``group``: ``matrices`` are
    compressed by ``reduce``; ``whole`` are left to the caller's plain all-reduce."""

    def __init__(self, parameters, *, rank: int, group, device, seed: int = 0):
        self.rank, self.group, self.seed = rank, group, seed
        parameters = list(parameters)
        self.matrices = [p for p in parameters if p.dim() == 2 and powersgd_compresses(p.shape[0], p.shape[1], rank)]
        chosen = {id(p) for p in self.matrices}
        self.whole = [p for p in parameters if id(p) not in chosen]
        # Persistent buffers, written in place each step: M = G + E, the flat P and Q messages (the
        # warm-started Q are views of the flat Q, which each step's sum overwrites), one n x m scratch.
        self._ms = [torch.empty(p.shape, dtype=torch.float32, device=device) for p in self.matrices]
        self._flat_p = torch.empty(sum(p.shape[0] * rank for p in self.matrices), device=device)
        self._flat_q = torch.empty(sum(p.shape[1] * rank for p in self.matrices), device=device)
        self._ps = _views(self._flat_p, [(p.shape[0], rank) for p in self.matrices])
        self.qs = _views(self._flat_q, [(p.shape[1], rank) for p in self.matrices])
        self._scratch = torch.empty(max((p.numel() for p in self.matrices), default=0), device=device)
        self.errors = [torch.zeros(p.shape, dtype=torch.float32, device=device) for p in self.matrices]
        self.reset()
        self.fallbacks = 0  # steps sent whole because P was not finite

    def reset(self) -> None:
        """The state of step 0: no error memory, ``Q`` drawn from ``seed`` (the same on every replica)."""
        generator = torch.Generator().manual_seed(self.seed)
        for q, p in zip(self.qs, self.matrices):
            q.copy_(torch.randn(p.shape[1], self.rank, generator=generator))
        for e in self.errors:
            e.zero_()

    def reduce(self, loss_scale: float = 1.0) -> int:
        """Sum the matrices' gradients over the group, compressed; returns the bytes handed to the
        all-reduces (the whole gradients' bytes on a fallback step)."""
        if not self.matrices:
            return 0
        for p in self.matrices:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        for p, e, m, q, out in zip(self.matrices, self.errors, self._ms, self.qs, self._ps):
            torch.add(p.grad.float() / loss_scale if loss_scale != 1.0 else p.grad, e, out=m)  # x / 1 == x
            torch.matmul(m, q, out=out)
        flat = self._flat_p
        dist.all_reduce(flat, group=self.group)
        sent = flat.numel() * POWERSGD_VALUE_BYTES
        if not bool(torch.isfinite(flat).all()):  # the same decision on every replica: flat is their sum
            self.fallbacks += 1
            for p in self.matrices:
                dist.all_reduce(p.grad, group=self.group)
            return sent + sum(p.grad.numel() * p.grad.element_size() for p in self.matrices)
        ps = [torch.linalg.qr(p, mode="reduced").Q for p in self._ps]
        for m, p, q, e in zip(self._ms, ps, self.qs, self.errors):
            torch.matmul(m.t(), p, out=q)  # this replica's Q, overwriting the last step's sum (used above)
            approximation = self._scratch[:m.numel()].view_as(m)
            torch.matmul(p, q.t(), out=approximation)
            torch.sub(m, approximation, out=e)  # what this replica's share lost
        flat = self._flat_q
        dist.all_reduce(flat, group=self.group)
        sent += flat.numel() * POWERSGD_VALUE_BYTES
        for param, p, q in zip(self.matrices, ps, self.qs):
            approximation = self._scratch[:param.numel()].view(param.shape)
            torch.matmul(p, q.t(), out=approximation)
            param.grad.copy_(approximation.mul_(loss_scale) if loss_scale != 1.0 else approximation)
        return sent


def _views(flat: torch.Tensor, shapes: list) -> list:
    """Consecutive views of ``flat`` with ``shapes``."""
    views, offset = [], 0
    for n, m in shapes:
        views.append(flat[offset:offset + n * m].view(n, m))
        offset += n * m
    return views
