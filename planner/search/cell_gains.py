"""What tensor groups add to the replicas' chained round trips, counted per grouped cell
(``planner.search.replica_crossings``, ``planner.search.bounds``).

Under a chained schedule (1F1B: window ``w = S``) a replica of ``b`` sequences takes at least
``y + b ((x + h) / w + l)`` (``round_trip.round_trip_s``: its first stage chains ``b / w`` round
trips), where ``x`` is one sequence's forward and backward through the replica's S cells, ``h`` its
boundaries' transfers and ``l`` its latencies per sequence. Cell ``k`` runs ``d_k`` seconds of it on
one device (its lead) and ``d_k / sigma_k`` on a tensor group of speedup at most ``sigma_k``
(``bounds._tensor_speedup``), so ``x = sum_k d_k / sigma_k`` with ``sum_k d_k >= x_0``, the sequence on
the fastest device. The cell also runs each of the replica's ``b`` sequences itself, so within the
iteration ``b d_k / sigma_k <= T``, and the group saves at most

    d_k (1 - 1 / sigma_k) = (d_k / sigma_k) (sigma_k - 1) <= (T / b) (sigma_k - 1)

per sequence: ``b x >= b x_0 - T g`` with ``g = sum_k (sigma_k - 1)`` over the replica's groups. Its
sequences are then at most ``(T - y) / a + T g / (w a)``, with ``a = (x_0 + h) / w + l`` the chain's
per-sequence time without groups. A group of ``t`` devices takes ``t - 1`` of the ``E = N - S D``
devices beyond one a cell and has ``sigma_t - 1 <= rho (t - 1)`` (``tensor_cells.gain_per_spare_device``),
so over every replica the groups add at most ``T rho E / (w a_min)`` sequences, ``a_min`` the least
per-sequence time of any replica (the fewest crossings). A group that saves a whole replica's
compute would need that replica's every cell grouped: per grouped cell the gain is a cell's, not a
replica's. Without compute in the chain (ZB-H1's chain counts none) the groups add nothing.
"""

import numpy as np

__all__ = ["grouped_sequences_per_s", "least_chained_time_s"]


def grouped_sequences_per_s(rho: float, spare: np.ndarray, window: float, least_sequence_s: np.ndarray) -> np.ndarray:
    """(D,) sequences per second of the iteration that tensor groups add to all replicas' chains at
    most (module description): ``rho E / (w a_min)``; ``spare``: (D,) ``E``, devices beyond one a
    cell; ``window``: ``w``; ``least_sequence_s``: (D,) ``a_min``, seconds per sequence of the
    fastest replica's chain without groups (0 gains nothing where it is infinite)."""
    spare = np.maximum(np.asarray(spare, dtype=float), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        gain = np.where(np.asarray(least_sequence_s) > 0, rho * spare / (window * np.asarray(least_sequence_s)), np.inf)
    return np.where(spare > 0, gain, 0.0)


def least_chained_time_s(batch: float, plain_per_s: np.ndarray, first_s: np.ndarray, grouped_per_s: np.ndarray) -> np.ndarray:
    """(D,) the least T at which the replicas serve ``batch`` sequences: ``(T - y) R + T G >= B``,
    so ``T >= (B + y R) / (R + G)``; ``plain_per_s``: (D,) ``R``, the replicas' sequences per second
    of their chains without groups (``sum 1 / a``); ``first_s``: (D,) ``y``; ``grouped_per_s``: (D,)
    ``G`` (``grouped_sequences_per_s``)."""
    plain_per_s, grouped_per_s = np.asarray(plain_per_s, dtype=float), np.asarray(grouped_per_s, dtype=float)
    total = plain_per_s + grouped_per_s
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(total > 0, (batch + np.asarray(first_s) * plain_per_s) / total, np.inf)
