"""A crossing replica's messages over the slower way between clusters, then a stage's sync
(``planner.search.bounds``: the clusters' terms).

A replica whose cells sit in two clusters or more has a stage boundary ``k | k + 1`` between two
of them, ``X`` and ``Y``: every sequence it runs sends its activation from ``X`` to ``Y`` (forward)
and its gradient back from ``Y`` to ``X`` (backward), each message at least ``m`` bytes a sequence
(``bounds._least_boundary_bytes``; a micro-batch's message is at least its sequences' share). One
of the two directions' links runs at most ``tau_s`` bytes/s: between exactly two clusters the
slower direction's fastest link (``link_clusters.slower_way_between``), and ``tau`` (every link
between clusters) otherwise. In the simulator each message holds its directed link for its bytes at
the link's rate, one message after another (``Network.transfer_holds``, the simulator's
``_Resources``), and arrives ``latency`` after its hold ends (``cost_models.simulator``). So the
replica's ``b`` messages on that link end their holds ``b m / tau_s`` after the first began at the
earliest, and the last arrives a latency (at least the least between clusters) later.

The receiving stage then cannot finish its own sync before its own sync has run: where the slow way
is the backward, the receiver is stage ``k``, whose last backward of that replica follows the
message; where it is the forward, the receiver is stage ``k + 1``, whose backward of that
micro-batch follows its forward, which follows the message. A stage's gradient sync starts after
every replica's last backward on it (formulas.md, Pipeline schedules; the simulator's op lists put
it after them) and lasts at least a block's sync at the fastest ring any stage group reaches
(``tail_sync_s``: every stage holds a block at least, and its first or last stage's extras only
add). Hence ``T >= b m / tau_s + latency + tail_sync_s``, with ``b`` the crossing replica's
sequences: the busiest replica's least where every replica crosses.
"""

import numpy as np

__all__ = ["crossing_link_s"]


def crossing_link_s(sequences, sequence_bytes: float, slower_way_bytes_per_s: float, latency_s: float,
                    tail_sync_s) -> np.ndarray:
    """Seconds at least of a plan with a replica of ``sequences`` sequences (array) crossing between
    clusters (module description): its ``sequences * sequence_bytes`` over a link of at most
    ``slower_way_bytes_per_s``, a latency of ``latency_s``, then the receiving stage's sync of at
    least ``tail_sync_s`` (broadcast with ``sequences``); 0 where the replica runs no sequence."""
    sequences = np.asarray(sequences, dtype=float)
    seconds = sequences * sequence_bytes / slower_way_bytes_per_s + latency_s + np.asarray(tail_sync_s, dtype=float)
    return np.where(sequences > 0, seconds, 0.0)
