"""The lower bound's term for a pipeline's round trips (``planner.search.bounds``).

A micro-batch's round trip is its forward through every stage and its backward back: with
``S >= 2`` stages it crosses ``S - 1`` boundaries each way, each message paying its bytes over a
link no faster than the fastest and at least the least latency between two devices
(``cost_models.simulator``: a message holds its link for ``bytes / bandwidth`` and arrives
``latency`` later; a receive blocks until then), and it runs every stage's forward and backward of
the micro-batch, each on one cell no faster than the fastest cell.

How many round trips follow one another on the first stage depends on the schedule
(``cost_models.schedule.stage_ops``): 1F1B (PipeDream-Flush, Narayanan et al. 2021, sec. 2.2) runs
the first stage's forward of micro-batch ``i + S`` after its backward of micro-batch ``i`` (``S - 1``
warm-up forwards, then one forward and one backward), and ZB-H1 keeps 1F1B on the first stage (Qi et
al. 2024, sec. 3.1); so micro-batches ``0, S, 2S, ...`` make a chain of ``ceil(M / S)`` round trips.
Accumulation rounds of ``K`` micro-batches run one after the other, each with its own fill and
drain, so each round holds a round trip of its own: ``ceil(M / K)`` of them whatever the schedule.
GPipe in one round and interleaved 1F1B (whose ``v S`` pieces cross ``2 (v S - 1) >= 2 (S - 1)``
boundaries a trip) hold one round trip at least. 1F1B of warm-up depth ``k``
(``cost_models.schedule.one_f_one_b_warmup``) runs ``k (S - 1)`` warm-up forwards on the first
stage: its chain skips ``k (S - 1) + 1`` micro-batches (``k`` the deepest the search tries where it
picks ``k``). The
*window* ``w`` is the most micro-batches a chain may skip (``S``, ``k (S - 1) + 1`` or ``K``, ``inf``
for one trip); ``ceil(M / w)`` trips at least.

GPipe runs a round's forwards before its backwards on every stage, so the second stage sends its
first gradient back only after the first stage's last activation of the round reached it: every
activation of the round crossed the first boundary's link before any of its gradients crosses
back over the reverse link (``gpipe_phases_s``).

Where clusters joined by slow links (``planner.search.link_clusters``) hold fewer devices than the
plan has stages, a replica's stages cross between clusters, and every trip pays those crossings'
slower links and longer latencies both ways (``crossing_extra_s``).

Every stage syncs after its last backward, which follows the chain's last trip's forward to the
last stage and backward to it, so the chain's other trips and ``S - 1`` messages come before the
deepest stage's sync too (``last_sync_s``).
"""

import math
from dataclasses import replace

import numpy as np

from cost_models.links import LevelMatrix
from cost_models.schedule import AUTO_WARMUP_DEPTHS, Schedule
from planner.prediction.stage_model import layer_costs, stage_memory_bytes
from planner.search.link_clusters import least_latency_between

__all__ = ["schedule_windows", "one_f_one_b_window", "bound_depth", "gpipe_fits", "least_latency_s", "round_trip_s", "crossing_extra_s", "gpipe_phases_s",
           "last_sync_s"]


def schedule_windows(training, stages: int) -> dict:
    """``{schedule: window}`` for each schedule a plan of ``stages`` stages may run under
    ``training`` (module description; ``math.inf``: one round trip)."""
    schedules = training.schedules
    interleaves = training.virtual_stages == "auto" or training.fixed_virtual_stages > 1
    rounds = training.micro_batches_per_round if training.micro_batches_per_round > 0 else math.inf
    windows = {}
    for schedule in schedules:
        # ZB-H1 runs one chunk always, with k (S - 1) + 1 in flight on every stage
        if schedule == Schedule.ZERO_BUBBLE or (schedule == Schedule.ONE_F_ONE_B and not interleaves):
            windows[schedule] = min(one_f_one_b_window(training, stages), rounds)
        else:
            windows[schedule] = rounds
    return windows


def one_f_one_b_window(training, stages: int) -> float:
    """How many micro-batches 1F1B's first stage of ``stages`` (any stage of ZB-H1) keeps in flight
    under ``training``'s warm-up depth k: ``k (S - 1) + 1`` (``cost_models.schedule.one_f_one_b_warmup``),
    at the deepest the search tries where it picks k (``AUTO_WARMUP_DEPTHS``)."""
    return bound_depth(training) * (stages - 1) + 1


def bound_depth(training) -> int:
    """The deepest 1F1B or ZB-H1 warm-up a plan of ``training`` may run: its fixed depth, or under ``auto``
    the deepest the search tries (``AUTO_WARMUP_DEPTHS``)."""
    depth = getattr(training, "warmup_depth", 1)
    return AUTO_WARMUP_DEPTHS[-1] if depth == "auto" else depth


def gpipe_fits(model, training, stages: int, busiest: np.ndarray, tensor: int, devices: int,
               capacity_bytes: float) -> np.ndarray:
    """(D,) False where no GPipe plan of ``stages`` stages whose busiest replica runs ``busiest``
    sequences fits on a device of ``capacity_bytes``: GPipe keeps the activations of every
    micro-batch of a round (``cost_models.memory.in_flight_micro_batches``), at least
    ``min(K, busiest)`` sequences' (``M m >= busiest``, ``K m >= K``), and both the last stage (one
    block at least and the head's kept logits, per sequence) and the deepest (``ceil(L / S)``
    blocks, at its cheapest position) must fit on one member of a tensor group of at most
    ``tensor`` devices, with the least state of one replica and of ``devices`` (the optimizer's
    sharded over every device; one replica keeps no local steps' or PowerSGD state) and one
    sequence's transient working set (``stage_memory_bytes`` at micro-batch size 1: every part is
    linear in the micro-batch size)."""
    rounds = training.micro_batches_per_round if training.micro_batches_per_round > 0 else math.inf
    kept = np.minimum(np.asarray(busiest, dtype=float), rounds)
    deepest = math.ceil(model.layers / stages)
    # Under ``recompute: auto`` each worker runs its own mode (``planner.plan.recompute``): the last
    # stage's and the deepest stage's workers each at the mode that needs the least (full
    # recomputation keeps the least at many micro-batches, not always at one).
    modes = (False, "selective", True) if training.recompute == "auto" else (training.recompute,)

    def need(replicas: int) -> np.ndarray:
        lasts, deeps = [], []
        for mode in modes:
            costs = layer_costs(model, replace(training, recompute=mode), 1, stages, replicas)
            lasts.append(stage_memory_bytes(costs, 1, stages - 1, kept, tensor))
            deeps.append(stage_memory_bytes(costs, deepest, np.arange(stages)[:, None], kept[None, :],
                                            tensor).min(axis=0))
        return np.maximum(np.minimum.reduce(lasts), np.minimum.reduce(deeps))

    # one replica holds no outer (local steps) or PowerSGD state; every device shards the optimizer's most
    return np.minimum(need(1), need(devices)) <= capacity_bytes


def least_latency_s(network) -> float:
    """The least latency of a message between two different devices, the per-message overhead
    included: between any two devices (``link_clusters.least_latency_between`` of one label a
    device), and inside a host where a host holds two devices; by levels, never N x N."""
    latency = network.latency_s
    n = np.shape(network.host)[0]
    between = least_latency_between(network, np.arange(n)) if n > 1 else 0.0
    if isinstance(latency, LevelMatrix) and np.bincount(latency.host).max(initial=0) >= 2:
        between = min(between, float(latency.host_value))
    return between


def round_trip_s(*, stages: int, busiest: np.ndarray, window: float, max_micro_batch: np.ndarray,
                 sequence_s: float, boundary_s: float, latency_s: float, first_sync_s: np.ndarray,
                 crossings: tuple = (), micro_batch: float = math.inf) -> np.ndarray:
    """(D,) seconds at least of any plan of ``stages`` (S >= 2) stages whose busiest replica runs
    ``busiest`` sequences in micro-batches of at most ``max_micro_batch``, the first stage chaining
    round trips ``window`` micro-batches apart (module description):

        max(1, busiest / w) (c + 2 (S - 1) b) + max(1, ceil(ceil(busiest / m) / w)) 2 (S - 1) lambda + y

    with ``c`` (``sequence_s``) one sequence's forward and backward through every stage at the
    fastest cell's speed, ``b`` (``boundary_s``) one sequence's message over the fastest link,
    ``lambda`` (``latency_s``) the least latency, ``y`` (``first_sync_s``) the first stage's
    gradient sync, which starts after its last backward, the chain's end. A trip of a micro-batch
    of ``m`` sequences takes ``m (c + 2 (S - 1) b) + 2 (S - 1) lambda`` at least; ``ceil(M / w)``
    trips of ``m`` sequences with ``M m >= busiest`` carry ``max(m, busiest / w)`` sequences, and
    ``M >= ceil(busiest / m)``.

    ``crossings``: ``(k, per sequence, per trip)``: ``k`` boundaries cross between clusters, each
    adding those seconds to a trip at least (``crossing_extra_s``, one per clustering); the largest
    counts.
    ``micro_batch``: where the job fixes it (``m``, finite), every micro-batch holds exactly ``m``
    sequences, so the trips carry ``m`` each: ``ceil(ceil(busiest / m) / w) m`` at least."""
    busiest = np.asarray(busiest, dtype=float)
    hops = 2.0 * (stages - 1)
    carried = np.maximum(1.0, busiest / window)
    trips = np.maximum(1.0, np.ceil(np.ceil(busiest / max_micro_batch) / window))
    if math.isfinite(micro_batch):
        carried = np.maximum(carried, np.ceil(np.ceil(busiest / micro_batch) / window) * micro_batch)
    extra = np.maximum.reduce([k * (carried * per_sequence + trips * per_trip)
                               for k, per_sequence, per_trip in crossings], initial=0.0) if crossings else 0.0
    return carried * (sequence_s + hops * boundary_s) + trips * hops * latency_s + first_sync_s + extra


def crossing_extra_s(*, stages: int, largest: int, tau_bytes_per_s: float, both_ways_bytes_per_s: float,
                     between_latency_s: float, sequence_bytes: float, boundary_s: float, latency_s: float,
                     fewest: int = 0) -> tuple:
    """``(k, per sequence, per trip)``: ``k`` crossings, and the seconds each adds at least to a round
    trip of a plan of ``stages`` stages over ``round_trip_s``'s fastest links and least latencies
    (per sequence it carries, per trip), at a clustering whose clusters hold at
    most ``largest`` devices, links between them at most ``tau_bytes_per_s`` each way, a pair's two
    directions at most ``both_ways_bytes_per_s`` for the slower (``link_clusters``), latencies at
    least ``between_latency_s``.

    A replica's ``S`` cells (each inside one cluster) visit at least ``ceil(S / largest)`` clusters,
    so at least ``k = ceil(S / largest) - 1`` of its boundaries cross; each trip sends a sequence's
    ``sequence_bytes`` across each of them forward (``a -> b``) and back (``b -> a``), at least
    ``bytes / min + bytes / max`` of the pair's two directions, and pays two latencies of at least
    ``between_latency_s``, where ``round_trip_s`` counted ``2 boundary_s`` and ``2 latency_s``.
    ``fewest``: crossings known otherwise (a replica that crosses: 1)."""
    crossings = max(fewest, math.ceil(stages / largest) - 1)
    if crossings == 0 or sequence_bytes <= 0:
        return 0, 0.0, 0.0
    both = sequence_bytes / both_ways_bytes_per_s + sequence_bytes / tau_bytes_per_s
    return crossings, max(0.0, both - 2.0 * boundary_s), 2.0 * max(0.0, between_latency_s - latency_s)


def gpipe_phases_s(*, busiest: np.ndarray, rounds: float, boundary_s: float, latency_s: float,
                   first_sync_s: np.ndarray, crossings: tuple = ()) -> np.ndarray:
    """(D,) seconds at least of any GPipe plan of two stages or more whose busiest replica runs
    ``busiest`` sequences: ``2 busiest b + 2 R lambda + y`` with ``R`` (``rounds``) the fewest
    accumulation rounds, ``b``, ``lambda`` and ``y`` as in ``round_trip_s``.

    In each round, the second stage's op list receives every forward of the round before it runs
    any backward (Huang et al. 2019; ``cost_models.schedule.stage_ops``), so its first gradient of
    the round leaves after the round's last activation arrived; the round's activations hold the
    first boundary's link one after the other (``cost_models.simulator``: a send waits for its link
    to be free), and so do its gradients the reverse link, each message arriving ``lambda`` after
    its link time. The rounds run one after the other on both stages, and the first stage's sync
    follows its last backward, which waits for the last gradient.

    Any boundary's stage downstream does the same, so where a boundary crosses between clusters
    (``crossings``' ``k >= 1``, ``crossing_extra_s``), its phases pay that crossing both ways: the
    busiest replica's sequences times its per-sequence seconds, and its latencies each round (the
    largest over the clusterings)."""
    busiest = np.asarray(busiest, dtype=float)
    extra = np.maximum.reduce([busiest * per_sequence + rounds * per_trip
                               for k, per_sequence, per_trip in crossings if k > 0], initial=0.0)
    return 2.0 * busiest * boundary_s + 2.0 * rounds * latency_s + first_sync_s + extra


def last_sync_s(*, stages: int, busiest: np.ndarray, window: float, micro_batch: float, sequence_s: float,
                boundary_s: float, latency_s: float, deepest_sync_s: np.ndarray) -> np.ndarray:
    """(D,) seconds at least of any plan of ``stages`` (S >= 2) stages whose busiest replica runs
    ``busiest`` sequences in micro-batches of exactly ``micro_batch`` (m) sequences, the first stage
    chaining round trips ``window`` micro-batches apart, whose deepest stage's sync takes at least
    ``deepest_sync_s`` (``y``):

        (ceil(ceil(busiest / m) / w) - 1) (m (c + 2 (S - 1) b) + 2 (S - 1) lambda) + (S - 1)(m b + lambda) + y

    (``c``, ``b``, ``lambda`` as in ``round_trip_s``). The chain's last trip starts after the
    others (``ceil(M / w) - 1`` trips of ``m`` sequences each, ``M = ceil(busiest / m)``); its
    micro-batch's forward crosses ``S - 1`` boundaries before its backward reaches any stage, so
    every stage's last backward, and then its sync (``cost_models.simulator``: after every
    replica's last backward of the stage), come after that. Where ``m`` is searched (``inf``),
    only the ``S - 1`` messages of one sequence count."""
    busiest = np.asarray(busiest, dtype=float)
    hops = stages - 1
    if not math.isfinite(micro_batch):
        return hops * (boundary_s + latency_s) + deepest_sync_s
    before = np.maximum(0.0, np.ceil(np.ceil(busiest / micro_batch) / window) - 1.0)
    trip = micro_batch * (sequence_s + 2.0 * hops * boundary_s) + 2.0 * hops * latency_s
    return before * trip + hops * (micro_batch * boundary_s + latency_s) + deepest_sync_s
