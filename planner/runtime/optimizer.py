"""A worker's optimizer: its parts (the stage's parameters, their state sharded over the stage's
replicas or not; a tied embedding's copy, never sharded) stepped together, after one overflow
check over all of them when the plan trains in fp16 (``planner.runtime.precision``)."""

import torch

from planner.runtime.precision import DynamicLossScaler, MasterWeightOptimizer, PlainOptimizer
from planner.runtime.sharded import ShardedOptimizer

__all__ = ["TrainingOptimizer", "make_optimizer"]


class TrainingOptimizer:
    """A worker's optimizer: its parts (the stage's parameters, sharded or not, and a tied
    embedding's copy, never sharded), stepped together after one overflow check in fp16."""

    def __init__(self, parts: list, scaler: DynamicLossScaler | None = None):
        self.parts, self.scaler = [p for p in parts if p is not None], scaler

    @property
    def loss_scale(self) -> float:
        """What the loss is multiplied by before backward (1 without a scaler)."""
        return self.scaler.scale if self.scaler else 1.0

    @property
    def sharded(self):
        """The part whose optimizer state is sharded over the stage's replicas, or None."""
        return next((p for p in self.parts if isinstance(p, ShardedOptimizer)), None)

    @torch.no_grad()
    def step(self) -> None:
        unscale = 1.0 / self.loss_scale
        if self.scaler and self.scaler.overflowed([g for part in self.parts for g in part.grads()]):
            return  # every rank skips this step; the scale is halved
        for part in self.parts:
            part.step(unscale)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for part in self.parts:
            part.zero_grad(set_to_none)


def make_optimizer(parameters, name: str, learning_rate: float, dtype: torch.dtype, device: torch.device, *,
                   sharded=(), shard_group=None) -> TrainingOptimizer:
    """The optimizer of a worker: plain fp32, or fp32 master weights when the weights are 16-bit
    (with loss scaling in fp16); ``sharded`` parameters keep only this rank's shard of the state
    over ``shard_group`` (ZeRO stage 1, ``planner.runtime.sharded``)."""
    fused = device.type == "cuda"
    parameters = list(parameters.parameters()) if isinstance(parameters, torch.nn.Module) else list(parameters)
    sharded_ids = {id(p) for p in sharded}
    rest = [p for p in parameters if id(p) not in sharded_ids]
    kind = PlainOptimizer if dtype == torch.float32 else MasterWeightOptimizer
    parts = [ShardedOptimizer(list(sharded), name, learning_rate, group=shard_group, fused=fused) if sharded else None,
             kind(rest, name, learning_rate, fused=fused) if rest else None]
    return TrainingOptimizer(parts, DynamicLossScaler(device) if dtype == torch.float16 else None)
