"""ZeRO stage 1: each replica of a stage keeps the optimizer state of one shard of the stage's
parameters (Rajbhandari et al. 2020, sec. 5.1, P_os).

The stage's weights and gradients live in two flat buffers (the parameters and their ``.grad`` are
views into them). The gradient sync is a reduce-scatter of the flat gradient, so each replica
receives the sum of its own shard only; the step updates the fp32 master copy of that shard and an
all-gather puts every replica's updated shard back into the flat weights. A reduce-scatter plus an
all-gather move the bytes of one ring all-reduce (Rajbhandari et al. 2020, sec. 7.2.1), so the
cost model keeps the all-reduce's time and divides the optimizer state and step by the replicas.

Written here rather than taken from ``torch.distributed.optim.ZeroRedundancyOptimizer``: that one
steps the parameters in their own dtype (no fp32 master weights for bf16/fp16 plans) and expects
all-reduced gradients, then broadcasts each partition (1.5x an all-reduce's bytes); FSDP2's
``fully_shard`` shards the weights too (ZeRO stage 3), which this plan dimension does not ask for.
"""

import math

import torch
import torch.distributed as dist

from planner.runtime.gradient_sync import all_gather_over_route, reduce_scatter_over_route
from planner.runtime.precision import CHUNK_BYTES, plain_optimizer

__all__ = ["ShardedOptimizer"]


def _collective(name: str, older: str):
    """torch.distributed's flat-tensor collective by its current name (2.13 deprecates the older one,
    which torch 2.11 still has alone); same signature."""
    return getattr(dist, name, None) or getattr(dist, older)


class ShardedOptimizer:
    """The optimizer of ``parameters`` (one stage, the same on every rank of ``group``) with the
    state of shard ``rank(group)`` of ``world_size(group)`` equal shards only.

    Memory per parameter: the 16-bit (or fp32) weights and gradients whole, the fp32 master and
    optimizer state of the own shard; the collectives work in place on NCCL (the own shard is a
    view of the flat buffers) and the step runs ``CHUNK_BYTES`` of fp32 gradient at a time, as
    ``MasterWeightOptimizer`` does, so nothing else of the stage's size is allocated."""

    def __init__(self, parameters, name: str, learning_rate: float, *, group, fused: bool):
        self.parameters, self.group = list(parameters), group
        first = self.parameters[0]
        self.dtype, self.device = first.dtype, first.device
        self.shards, self.index = dist.get_world_size(group), dist.get_rank(group)
        total = sum(p.numel() for p in self.parameters)
        self.shard_numel = math.ceil(total / self.shards)
        padded = self.shard_numel * self.shards
        self.flat = torch.zeros(padded, dtype=self.dtype, device=self.device)
        self.flat_grad = torch.zeros(padded, dtype=self.dtype, device=self.device)
        offset = 0
        with torch.no_grad():
            for p in self.parameters:
                n = p.numel()
                self.flat[offset:offset + n].copy_(p.detach().flatten())
                p.data = self.flat[offset:offset + n].view_as(p)
                p.grad = self.flat_grad[offset:offset + n].view_as(p)  # backward accumulates in place
                offset += n
        low = self.index * self.shard_numel
        self.own = slice(low, low + self.shard_numel)
        self.in_place = self.device.type == "cuda"  # NCCL takes the own shard as a view; gloo wants copies
        step = max(1, CHUNK_BYTES // 4)
        self.chunks = [slice(a, min(a + step, self.shard_numel)) for a in range(0, self.shard_numel, step)]
        own = self.flat[self.own]
        # fp32 weights are their own master; 16-bit ones get an fp32 master of this shard only.
        self.masters = [own[c] if self.dtype == torch.float32 else own[c].float() for c in self.chunks]
        self.optimizers = [plain_optimizer([m], name, learning_rate, fused) for m in self.masters]
        self.route = None  # the plan's sync route (``planner.runtime.gradient_sync``), set by the worker

    def reduce_scatter(self) -> int:
        """The gradient sync: this rank's shard of the flat gradient becomes its sum over the group;
        by the plan's ring or sharded exchange when the worker set ``route``
        (``planner.runtime.gradient_sync``: the bytes this rank sent, and will send in the
        all-gather, are returned), else by torch's collective (the bytes handed to it)."""
        if self.route is not None:
            sent = reduce_scatter_over_route(self.flat_grad, self.route)
            return 2 * sent  # the all-gather after the step sends as much
        own = self.flat_grad[self.own]
        output = own if self.in_place else torch.empty_like(own)
        _collective("reduce_scatter_single", "reduce_scatter_tensor")(output, self.flat_grad, group=self.group)
        if not self.in_place:
            own.copy_(output)
        k = dist.get_world_size(self.group)  # a ring member's bytes: reduce-scatter and all-gather
        return 2 * (k - 1) * sum(p.numel() * p.element_size() for p in self.parameters) // k

    def grads(self) -> list:
        return [self.flat_grad[self.own]]

    @torch.no_grad()
    def step(self, unscale: float = 1.0) -> None:
        own_grad, own = self.flat_grad[self.own], self.flat[self.own]
        for chunk, master, optimizer in zip(self.chunks, self.masters, self.optimizers):
            master.grad = own_grad[chunk].float().mul_(unscale)
            optimizer.step()
            master.grad = None
            if self.dtype != torch.float32:
                own[chunk].copy_(master)
        if self.route is not None:
            all_gather_over_route(self.flat, self.route)
            return
        _collective("all_gather_single", "all_gather_into_tensor")(self.flat, own if self.in_place else own.clone(),
                                                                   group=self.group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zeroes the flat gradient in place (the ``.grad`` views stay, whatever ``set_to_none``)."""
        self.flat_grad.zero_()
