"""The most FLOP/s a plan's cells reach together when spare devices form tensor groups
(``planner.search.bounds``).

A plan of S stages x D replicas has ``C = S D`` cells, each one device or a tensor group of ``t``
devices of one type on one host (``planner.plan.tensor``); no device is in two cells. A group of
``t`` runs a block at most ``sigma_t`` times one member's speed (``bounds._tensor_speedup``: its
all-reduces; ``sigma_t < t``), so it adds at most ``(sigma_t - 1) v`` to its lead's speed ``v``,
``v`` at most the fastest device's. The leads are ``C`` distinct devices: together at most the ``C``
fastest. The groups' other members are distinct devices outside the leads, ``E`` of them at most
(the devices the other cells leave), and a group of ``t`` takes ``t - 1`` of them, so the groups add
at most ``E rho v_max`` with ``rho = max_t (sigma_t - 1) / (t - 1)`` over the degrees a cell may
take (``planner.plan.tensor.TENSOR_DEGREES``). Spare devices thus count at ``rho < 1`` of a device
each, where the work bound counted them whole.
"""

import numpy as np

from planner.plan.tensor import TENSOR_DEGREES

__all__ = ["gain_per_spare_device", "most_cells_flops"]


def gain_per_spare_device(speedups: np.ndarray) -> float:
    """``rho``: the most a group adds, in its lead's speeds, per device it takes beyond its lead
    (``speedups[t - 1]``: the most a cell of at most ``t`` devices runs faster; 0 with no group)."""
    return max([(float(speedups[t - 1]) - 1.0) / (t - 1) for t in TENSOR_DEGREES if 1 < t <= len(speedups)],
               default=0.0)


def most_cells_flops(fastest: np.ndarray, cells: np.ndarray, spare: np.ndarray, fastest_flops: float,
                     rho: float) -> np.ndarray:
    """The most FLOP/s ``cells`` cells reach together (module description) with at most ``spare``
    devices beyond one a cell: the ``cells`` fastest devices (``fastest``: cumulative speeds, fastest
    first) plus ``spare rho`` times the fastest device's ``fastest_flops``."""
    cells = np.asarray(cells)
    return fastest[cells - 1] + np.maximum(np.asarray(spare, dtype=float), 0.0) * rho * fastest_flops
