"""The plan's named dimensions: its degrees of parallelism, its schedule and its gradient sync.

``Schedule`` and ``Sync`` are closed sets (``cost_models.schedule.Schedule``,
``cost_models.network.Sync``); ``Degrees`` names each degree, so adding one changes this type, not
every array shape. The tensor degree may differ per (replica, stage) (``planner.plan.tensor``):
``Degrees.tensor`` is the largest.
"""

from dataclasses import dataclass

from cost_models.network import Sync
from cost_models.schedule import Schedule

__all__ = ["Degrees", "Schedule", "Sync"]


@dataclass(frozen=True, kw_only=True)
class Degrees:
    """How many ways the work is split: ``pipeline`` stages x ``data`` replicas x up to ``tensor``
    shards (the largest tensor group; groups of one device where a cell has none)."""

    pipeline: int
    data: int
    tensor: int = 1

    def __post_init__(self):
        for name in ("pipeline", "data", "tensor"):
            if getattr(self, name) < 1:
                raise ValueError(f"degree {name} must be at least 1, got {getattr(self, name)}")

    @property
    def devices(self) -> int:
        """Devices a plan of these degrees uses at most (exactly, when every cell has ``tensor`` devices)."""
        return self.pipeline * self.data * self.tensor
