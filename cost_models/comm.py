"""Communication times: one primitive (latency + size / bandwidth), parameterised by collective."""

import numpy as np

__all__ = ["p2p_time_s", "ring_allreduce_time_s", "sharded_exchange_time_s", "sharded_exchange_pair_s",
           "tensor_allreduces", "tensor_block_issue_s"]


def p2p_time_s(message_bytes: float, latency_s: float, bandwidth_bytes_per_s: float) -> float:
    """One message over one link: ``latency + n / bandwidth`` (the alpha-beta model, formulas.md)."""
    return latency_s + message_bytes / bandwidth_bytes_per_s


def ring_allreduce_time_s(message_bytes: float, hop_latency_s, hop_bandwidth_bytes_per_s) -> float:
    """Ring all-reduce of ``n`` bytes over ``k`` members, given the ``k`` hops of the ring in order.

    ``2(k-1)/k * n / min_bw + 2(k-1) * max_latency`` (Patarasuk & Yuan 2009, sec. 3; NCCL's
    bus-bandwidth convention): 2(k-1) steps of ``n/k`` bytes, each as slow as the slowest hop.
    One member needs no communication. Rings of the same size stacked along leading axes give one
    time each (the hops along the last axis).
    """
    hop_latency_s = np.asarray(hop_latency_s, dtype=float)
    hop_bandwidth_bytes_per_s = np.asarray(hop_bandwidth_bytes_per_s, dtype=float)
    k = hop_latency_s.shape[-1] if hop_latency_s.ndim else 1
    if k <= 1:
        return 0.0
    steps = 2 * (k - 1)
    return (steps / k * message_bytes / hop_bandwidth_bytes_per_s.min(axis=-1)
            + steps * hop_latency_s.max(axis=-1))


def sharded_exchange_time_s(message_bytes: float, latency_s, bandwidth_bytes_per_s) -> float:
    """DTFM's sharded all-to-all (reduce-scatter + all-gather, each member exchanging ``n/k`` with all).

    Per member d: ``sum_{e != d} 2 * (alpha[d][e] + n / (k * beta[d][e]))``; the group takes the
    slowest member (Yuan et al. 2022, sec. 3.2). ``latency_s`` and ``bandwidth_bytes_per_s`` are the
    ``k x k`` matrices among the members; the diagonal is ignored.
    """
    k = np.asarray(latency_s).shape[0]
    if k <= 1:
        return 0.0
    return float(sharded_exchange_pair_s(message_bytes, latency_s, bandwidth_bytes_per_s, k).sum(axis=1).max())


def sharded_exchange_pair_s(message_bytes: float, latency_s, bandwidth_bytes_per_s, members: int) -> np.ndarray:
    """One member's exchange with one other in DTFM's sharded all-to-all among ``members``:
    ``2 * (alpha[d][e] + n / (k * beta[d][e]))`` per ordered pair (zero on the diagonal)."""
    latency_s = np.asarray(latency_s, dtype=float)
    bandwidth_bytes_per_s = np.asarray(bandwidth_bytes_per_s, dtype=float)
    off = ~np.eye(latency_s.shape[0], dtype=bool)
    return np.where(off, 2.0 * (latency_s + message_bytes / (members * np.where(off, bandwidth_bytes_per_s, 1.0))),
                    0.0)


def tensor_allreduces(recompute: bool) -> tuple:
    """(forward, backward) all-reduces of the ``(b, s, h)`` activation one block of a tensor group
    runs per micro-batch: two in forward (after the row-parallel attention projection and fc2) and
    two in backward (the input gradients of the column-parallel QKV and fc1), Shoeybi et al. 2019,
    sec. 3, Fig. 4 (the ``g`` and ``f`` operators); full recomputation re-runs the forward's two in
    backward; selective recomputation re-runs the attention core only, between them."""
    return 2, (4 if recompute and recompute != "selective" else 2)


def measured_tensor_block_s(table, micro_batch_size: int) -> float:
    """Seconds one block of a tensor group takes per micro-batch of ``micro_batch_size``, forward
    and backward, from a member's block timed at a few micro-batches (``table``: ((micro-batch,
    seconds), ...) ascending; ``plan calibrate``'s ``tensor_block_s`` for the group's degree):
    linear between the timed sizes; below the smallest, the smallest's time (a floor: the launches
    and waits do not shrink with the work); above the largest, the largest's time per sequence (its
    products already fill the device). 0 without a table."""
    if not table:
        return 0.0
    sizes = np.array([b for b, _ in table], dtype=float)
    seconds = np.array([t for _, t in table], dtype=float)
    if micro_batch_size > sizes[-1]:
        return float(seconds[-1] * micro_batch_size / sizes[-1])
    return float(np.interp(micro_batch_size, sizes, seconds))


def tensor_block_issue_s(floor_s, passes: float):
    """The least seconds one block of a tensor group takes per micro-batch, forward and backward
    together, on devices whose floor is ``floor_s`` (a device type's ``tensor_block_issue``: a
    member issues its block's kernels and the 4 all-reduces of ``tensor_allreduces`` and waits in
    each for the slowest member's launches, so its share cannot run faster however small it is; the
    catalog's value and its origin are in ``topologies/devices/``, ``plan calibrate`` measures it).
    ``passes``: the block's FLOPs over a plain block's (4/3 with full recomputation, which issues
    the forward, a third of the passes' work, once more; ``stage_model.recompute_multiple``); the
    floor is taken to grow with them. Vectorised."""
    return np.asarray(floor_s, dtype=float) * passes
