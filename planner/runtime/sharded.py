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

from planner.runtime.precision import plain_optimizer

__all__ = ["ShardedOptimizer"]


class ShardedOptimizer:
    """The optimizer of ``parameters`` (one stage, the same on every rank of ``group``) with the
    state of shard ``rank(group)`` of ``world_size(group)`` equal shards only."""

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
        self.grad_shard = torch.zeros(self.shard_numel, dtype=self.dtype, device=self.device)
        # fp32 weights are their own master; 16-bit ones get an fp32 master of this shard only.
        fp32 = self.dtype == torch.float32
        self.master = self.flat[self.own] if fp32 else self.flat[self.own].float()
        self.optimizer = plain_optimizer([self.master], name, learning_rate, fused)

    def reduce_scatter(self) -> None:
        """The gradient sync: this rank receives the sum over the group of its own shard."""
        dist.reduce_scatter_tensor(self.grad_shard, self.flat_grad, group=self.group)

    def grads(self) -> list:
        return [self.grad_shard]

    @torch.no_grad()
    def step(self, unscale: float = 1.0) -> None:
        self.master.grad = self.grad_shard.float().mul_(unscale)
        self.optimizer.step()
        self.master.grad = None
        shard = self.master.clone() if self.dtype == torch.float32 else self.master.to(self.dtype)
        dist.all_gather_into_tensor(self.flat, shard, group=self.group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zeroes the flat gradient in place (the ``.grad`` views stay, whatever ``set_to_none``)."""
        self.flat_grad.zero_()
