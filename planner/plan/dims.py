"""The plan's named dimensions: its degrees of parallelism, its schedule, its gradient sync and
what it compresses on the wire.

``Schedule`` and ``Sync`` are closed sets (``cost_models.schedule.Schedule``,
``cost_models.network.Sync``); ``Degrees`` names each degree, so adding one changes this type, not
every array shape. The tensor degree may differ per (replica, stage) (``planner.plan.tensor``):
``Degrees.tensor`` is the largest.
"""

from dataclasses import dataclass

from cost_models.compression import MAX_POWERSGD_RANK, GradientCompression, MessageCompression
from cost_models.network import Sync
from cost_models.schedule import Schedule

__all__ = ["Degrees", "Schedule", "Sync", "Compression", "MessageCompression", "GradientCompression"]


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


@dataclass(frozen=True, kw_only=True)
class Compression:
    """What a plan compresses (``cost_models.compression``): the messages across every stage
    boundary or those of ``boundaries``, and every stage's data-parallel gradient sync (PowerSGD of
    ``rank``)."""

    messages: MessageCompression = MessageCompression.OFF
    gradients: GradientCompression = GradientCompression.OFF
    rank: int = 4
    # With int8 messages, the stage boundaries compressed (boundary s: between stages s and s + 1);
    # None: every boundary.
    boundaries: tuple | None = None

    def __post_init__(self):
        object.__setattr__(self, "messages", MessageCompression(self.messages))
        object.__setattr__(self, "gradients", GradientCompression(self.gradients))
        if not 1 <= self.rank <= MAX_POWERSGD_RANK:
            raise ValueError(f"PowerSGD rank must be from 1 to {MAX_POWERSGD_RANK}, got {self.rank}")
        if self.boundaries is not None:
            object.__setattr__(self, "boundaries", tuple(sorted(set(int(b) for b in self.boundaries))))

    def compresses(self, boundary: int) -> bool:
        """Whether the messages across stage boundary ``boundary`` (stages ``boundary``, ``+ 1``) are int8."""
        return self.messages != MessageCompression.OFF and (self.boundaries is None or boundary in self.boundaries)

    def message_mask(self, stages: int):
        """(S - 1,) booleans: the boundaries whose messages are compressed."""
        return [self.compresses(b) for b in range(stages - 1)]

    @property
    def active(self) -> bool:
        return self.messages != MessageCompression.OFF or self.gradients != GradientCompression.OFF

    @classmethod
    def of_training(cls, training) -> "Compression":
        """The compression ``training`` asks for (its ``auto`` choices resolved before)."""
        return cls(messages=training.compress_messages, gradients=training.compress_gradients,
                   rank=training.powersgd_rank)
