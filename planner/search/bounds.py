"""Lower bounds on the iteration time of any plan, so every heuristic answer reports a gap."""

import math
from dataclasses import replace
from collections import Counter
from functools import lru_cache, partial

import numpy as np

from cost_models.compression import BLOCK_VALUES, SCALE_BYTES, MessageCompression
from cost_models.network import Sync
from cost_models.flops import zero_bubble_trip_share
from cost_models.schedule import Schedule
from planner.plan.sync import syncs_for
from planner.plan.sync_groups import REPLICA
from planner.plan.tensor import TENSOR_DEGREES
from planner.prediction.stage_model import iteration_flops, layer_costs, least_gradient_bytes_per_param
from planner.search.cluster_bound import Crossing, cluster_bound, cluster_levels
from planner.search.crossing_pipe import crossing_pipe_s
from planner.search.cluster_patterns import cluster_links, pattern_chains_s
from planner.search.end_groups import end_groups_s
from planner.search.gpipe_idle import gpipe_idle_s
from planner.search.pure_groups import spread_floors_s
from planner.search.nested_crossings import nested_crossing_s
from planner.search.replica_crossings import replica_crossings_s
from planner.search.round_trip import (bound_depth, crossing_extra_s, gpipe_fits, gpipe_phases_s, last_sync_s,
                                      least_latency_s, round_trip_s, schedule_windows)
from planner.search.slow_crossings import every_group_crosses, group_counts, slow_crossing_s
from planner.search.backward_window import WindowTerm, window_of
from planner.search.slow_senders import sender_floor_s, sender_rates_bytes_per_s, slow_cut_bytes_per_s, without_devices
from planner.search.slow_uplinks import nic_rates_bytes_per_s, slowest_used_rate, uplink_chains_s
from planner.search.stage_chains import clustered_stage_chains_s, stage_chains_s
from planner.search.stage_split import stage_split_s
from planner.search.tensor_cells import gain_per_spare_device, most_cells_flops
from planner.search.zero_bubble import measured_schedules

__all__ = ["lower_bound_s", "pair_bounds_s", "work_bound_s", "work_flops"]

_SENDER_CUTS = 2  # how many times the bound splits at a slow sender (``_split_by_senders_s``)
_CLUSTERED_CHAINS_DEVICES = 16  # the stage chains per cluster level only up to this many devices (time)
# the end groups' four placements only up to this many devices: above, the replicas' crossings with
# none (at 1,024 devices the placements took the pair table, which the search computes before its
# phases, from 5 to 16 s)
_END_GROUPS_DEVICES = 256


def work_bound_s(topology, model, training) -> float:
    """Work bound: the iteration's training FLOPs spread perfectly over every device at its
    calibrated speed (``_as_fast_as_groups``), with free communication: ``W / sum_d speed_d``."""
    topology = _as_fast_as_groups(topology, model, training)
    return float(work_flops(topology, model, training) / np.sum(topology.effective_flops(training.precision)))


def _as_fast_as_groups(topology, model, training):
    """``topology``, or where a calibration timed a tensor group of ``t`` faster than ``t`` times one
    member's speed (``_timed_speedups`` above ``t``: a table below the modelled compute), the same
    devices with every efficiency ``f`` times theirs, ``f`` the most a timed group exceeds its
    degree by: the bound's terms take a device's FLOP/s as the most it computes, alone or in a
    group, and the timed speed-ups over the faster members come out ``f`` times smaller, the ratios
    between a device's efficiencies (its slowdowns) unchanged."""
    per_sequence = layer_costs(model, training, 1, 1)
    timed = _timed_speedups(topology, per_sequence, topology.effective_flops(training.precision))
    factor = max([1.0] + [speedup / t for t, speedup in timed.items()])
    if factor <= 1.0:
        return topology
    faster = lambda value: value * factor if value else value  # 0: "as the blocks", kept
    return replace(topology, devices=tuple(
        replace(d, efficiency=d.efficiency * factor, head_efficiency=faster(d.head_efficiency),
                recompute_efficiency=faster(d.recompute_efficiency),
                split_backward_efficiency=faster(d.split_backward_efficiency)) for d in topology.devices))


def lower_bound_s(topology, model, training) -> float:
    """A bound on the iteration time of every plan the search can return.

    A plan is a grid of S stages x D replicas of cells, each cell one device or a tensor group of
    up to ``t`` devices of one type on one host (``_most_tensor_devices``: 1 where the job
    interleaves), running a block at most ``sigma`` times one member's speed (``_tensor_speedup``:
    its all-reduces); it uses ``U <= min(N, S D t)`` devices. For each degree pair (S, D) a plan
    could use, the largest of
    - the work bound over the plan's cells: at most the ``U`` fastest devices' FLOP/s, at most
      ``sigma`` times the ``S D`` fastest's (each cell's lead is a distinct device), and at most the
      ``S D`` fastest's plus what the ``N - S D`` spare devices add to tensor groups, less than a
      device each (``planner.search.tensor_cells``; the same for the heaviest stages' D cells);
    - the gradient sync of the largest stage (at least ``params / S``): a ring all-reduce moves
      ``2 (D - 1) / D * n`` bytes over its slowest hop (Patarasuk & Yuan 2009), and that hop is no
      faster than the D-th best device's fastest outgoing link (NIC-capped), since the ring's D
      members cannot all be among the D - 1 best; DTFM's sharded exchange sends as much from each
      member over its own links; a tensor group's sync is timed over its lead's links with the
      stage's whole gradients (``planner.plan.tensor``). A parameter server or a hierarchical
      all-reduce (where ``training.sync`` allows them) still sends ``n`` out of that slowest member,
      or ``n`` in the leads' ring where it leads a host (``cost_models.network.Sync``), so ``n``
      replaces ``2 (D - 1) / D * n`` then. ``n`` counts the fewest bytes any parameter adds to a sync
      (PowerSGD's best-compressed part, local steps' ``1 / H``: ``_least_sync_bytes_per_param``);
    - with two stages or more, the activations of the busiest replica (at least ``B / D`` of the
      global batch's ``B`` sequences) crossing one directed link, no faster than the fastest link
      (int8 messages: their codes and scales, ``_least_boundary_bytes``);
    - the stage with the most layers (at least ``ceil(L / S)``) computed then synchronised: its
      all-reduce starts after every replica's last backward there (formulas.md, Pipeline schedules),
      and the replica with the most sequences (at least ``B / D``) runs them through those layers
      on one cell no faster than ``sigma`` times the fastest device; then its gradients (at least
      ``ceil(L / S)`` layers' parameters) cross the ring as above;
    - every replica's heaviest stage, blocks and head (``_heaviest_stage_flops``: whole blocks, the
      head on the last stage), on its own cell: the busiest replica's on one cell as above, and all
      D of them on the fastest devices the other stages' cells leave (``N - (S - 1) D`` at most,
      ``D t`` at most, ``sigma`` times the D fastest at most);
    - with two stages or more, the busiest replica's round trips (``planner.search.round_trip``): each
      micro-batch's forward crosses ``S - 1`` boundaries to the last stage and its backward as many
      back (bytes over the fastest link, the least latency each), running every stage's forward
      and backward on cells no faster than the fastest; the first stage chains ``ceil(M / S)``
      of them under 1F1B and ZB-H1 (one per accumulation round; at least one under GPipe, which
      counts only where its kept activations fit, and under interleaving), then syncs its block
      and embeddings (at least) as above, and the deepest stage (``ceil(L / S)`` blocks) syncs
      after the chain's last trip reached the last stage; under GPipe, every activation of a round crosses the first
      boundary before any gradient of it crosses back; where the stages outnumber a cluster's
      devices, each trip crosses between clusters ``ceil(S / c) - 1`` times at least, both ways
      (``round_trip.crossing_extra_s``), and a GPipe round's phases cross such a boundary;
    - with two stages or more, every stage's own chain then its sync (``planner.search.stage_chains``):
      stage ``k`` waits for ``k`` messages, then runs the busiest replica's sequences through its
      blocks, or (1F1B, ZB-H1) chains its trips through the ``S - k - 1`` stages downstream ``S - k``
      micro-batches apart, or (GPipe) idles between its forwards and backwards for one micro-batch's
      trip, and syncs its own blocks (and the embeddings or the head) after; the least over the layer
      splits of the largest stage, over the schedules allowed; on topologies of at most
      ``_CLUSTERED_CHAINS_DEVICES`` devices also with one stage (any) syncing no faster than the
      ``(S D)``-th best device's fastest outgoing link (every cell one device, ring syncs only: the
      plan uses ``S D`` devices), and, at each clusters' level a plan's cells cannot fit in one
      cluster of, the least of a stage group's ring crossing (that stage syncing at most at the
      clusters' slower way) and every group in one cluster (each replica's chain then crossing
      between the clusters the groups fill: ``stage_chains.clustered_stage_chains_s``);
    - under GPipe (one chunk a device), the work over the cells' speed plus every boundary crossed
      once each way, by the crossings every replica pays: each cell idles that long in a round
      (``planner.search.gpipe_idle``), wherever the round trips are priced as above and below;
    - the blocks' work over the cells' speed plus every block's sync (as above) over ``S``: each
      stage syncs after every replica's last backward on it (``planner.search.stage_split``);
    - the clusters that slow links join (``planner.search.cluster_bound``, for each threshold of
      ``planner.search.link_clusters``): a plan inside one cluster that holds it runs on that
      cluster's devices; one that spans clusters has a stage group or a replica crossing a link of
      at most the threshold, whose sync or activations (and latencies) it pays, both ways where a
      boundary's or a two-member sync's pair, or any sync across exactly two clusters, must; where
      every replica crosses, the busiest's round trips cross too, and its messages take the slower
      way before a stage's sync (``planner.search.crossing_link``); where some stages cross, their
      blocks are whole;
    - the same clusters, where a replica's cells outnumber every cluster's devices
      (``planner.search.crossing_pipe``): every replica has a boundary between clusters, whose link
      carries the busiest replica's activations one after another; the micro-batch that crosses it
      last then runs its backward on every stage before their syncs (the first stage's after its
      gradient crossed back, the deepest stage's of ``ceil(L / S)`` blocks at least), each group
      syncing across the clusters where D cells fit in none;
    - the same clusters' stage groups (``planner.search.slow_crossings``): either every stage group
      sits in one cluster, and every replica's round trips cross between the clusters they fill, or
      some cross, and the round trips' chain ends with a crossing group's sync (over the layer
      splits, the least of the slowest stage's); its cells as fast as a tensor group of at most
      ``1 + N - S D`` devices (every other cell holds one at least); a group pure at one threshold
      still syncs over a slower link of any finer one whose clusters all hold fewer than D devices
      (``slow_crossings.every_group_crosses``);
    - the same cases with the backward passes' windows (``planner.search.backward_window``, up to
      ``MAX_WINDOW_CLUSTERS`` clusters): a backward runs only after its micro-batch's round trip
      through every cluster the replica visits, and the stage's last one before the way back or the
      stage's sync, so the batch's backward FLOPs fit in the cells' FLOP/s times what is left of
      the iteration; every group pure: the least over the sets of clusters that hold them, on their
      devices' FLOP/s; some crossing: their cells wait for a crossing ring;
    - two of those thresholds at once (``planner.search.nested_crossings``, the lowest with each
      higher one whose clusters hold two devices or more: ``_nested_pairs``): the stage groups that
      cross the coarser's clusters sync over its links, those that cross only the finer's over the
      finer's, and every replica's round trips cross between the clusters of both that the pure
      groups fill (or that a cluster too small for a pure group and a replica forces);
    - the same clusters' runs along each replica (``planner.search.replica_crossings``): the replicas
      that fit in few clusters are few, the others cross more on every round trip; each replica's
      sequences at its own crossings' cost, and the batch split between them, the first stage's sync
      after (a crossing group's where D cells fit in no cluster); under a chained schedule a tensor
      group saves at most its own cell's time, which it spends on each of its replica's sequences,
      so the groups add at most ``T rho E / (S a)`` sequences in all (``planner.search.cell_gains``);
      GPipe's forms only where GPipe fits; and the least over where the first and last stage groups
      sit (``planner.search.end_groups``): a crossing one syncs the embeddings or the head over a slow
      link, a pure one leaves at most ``n_max - D`` replicas inside one cluster (two pure ones in two
      clusters: every replica crosses, all but ``2 (n_max - D)`` twice);
    - on topologies of at most ``_CLUSTERED_CHAINS_DEVICES`` devices, a device alone behind a shared NIC
      slower than the fastest link that the plan's ``S D`` cells must use (``planner.search.slow_uplinks``):
      its replica's activations (one way on an end stage, both ways otherwise) hold that NIC before its
      stage's sync, which then crosses it, while the other replicas hold the batch's other sequences;
      the stage chains with that stage odd, over intervals of that replica's sequences, and with the
      clusters' cases (every group pure, or crossing groups' syncs at the slower way; between two
      clusters, as many slow stages as crossing groups the pure groups' room forces); every group
      pure, the busiest replica's messages over the slower way then a stage's sync
      (``planner.search.crossing_link``), over the same intervals;
    - on topologies of at most ``_CLUSTERED_CHAINS_DEVICES`` devices, every cell one device and rings
      the only sync, the clusters each cell sits in at each level (``planner.search.cluster_patterns``):
      the busiest replica's boundaries cross between the clusters its cells sit in, each at that pair's
      fastest links and least latencies both ways, and each stage syncs over the pair its group
      spans, the stage chains of each pattern the clusters' sizes allow, the least over them;
    minimised over the pairs whose largest stage's state fits: at least ``params / S`` parameters at
    the least state per parameter (sharded over every device where sharding is allowed), over ``t``
    members of a tensor group, on the largest device. Never below ``work_bound_s``'s reasoning
    applied to the devices a pair uses, so at least as tight as it.

    Where a device sends so slowly that one replica's messages through it alone would outlast that
    bound (``planner.search.slow_senders``: a cell's lead sends each of its replica's micro-batches
    across a boundary once at least), the plans that use such a device are bounded with each pair
    of two stages or more floored by the batch's messages over it and the other replicas' fastest
    senders, and the others by the same bound over the faster devices alone; the least of the two.

    With ``training.recompute`` auto, each worker of a plan may run any recomputation mode
    (``planner.plan.recompute``): the bound takes every block's FLOPs without recomputation, the
    fewest, and asks whether GPipe fits with each worker at the mode that needs the least memory
    (``round_trip.gpipe_fits``).
    """
    training, fits_training = _per_worker_recompute(measured_schedules(training, topology))
    return _split_by_senders_s(topology, model, training, fits_training, cuts=_SENDER_CUTS)


def _split_by_senders_s(topology, model, training, fits_training, *, cuts: int) -> float:
    """``_lower_bound_s``, split where a device sends too slowly for a pipeline
    (``planner.search.slow_senders``): the least of the bound on the plans that use a device slower
    than the cut (each pair's bound floored by what that device must send) and the bound on the
    faster devices alone, split again there, ``cuts`` times at most."""
    deferred, kept = {}, {}
    pairs = _pair_bounds_s(topology, model, training, clusters=True, deferred=deferred, fits_training=fits_training)
    bound = _least_pair_bound_s(topology, model, training, pairs, deferred, kept=kept)
    if cuts <= 0 or topology.size < 2:
        return bound
    rates = sender_rates_bytes_per_s(topology, _most_tensor_devices(topology, model, training))
    sequence_bytes = _least_boundary_bytes(layer_costs(model, training, 1, 1), training)
    cut = slow_cut_bytes_per_s(rates, batch=training.global_batch, sequence_bytes=sequence_bytes, bound_s=bound)
    if cut is None:
        return bound
    floor = partial(sender_floor_s, batch=training.global_batch, sequence_bytes=sequence_bytes,
                    slow_bytes_per_s=float(rates[rates < cut].max()), fastest_bytes_per_s=float(rates.max()))
    # the same table, floored: the terms computed for the bound above are not computed again
    with_slow = _least_pair_bound_s(topology, model, training, pairs, deferred, pair_floor_s=floor, kept=kept)
    fast_only = _split_by_senders_s(without_devices(topology, rates >= cut), model, training, fits_training,
                                    cuts=cuts - 1)
    return min(with_slow, fast_only)


def _per_worker_recompute(training) -> tuple:
    """(training for the FLOPs, training for the memory) of the bound: both ``training`` where its
    recomputation is resolved; under ``auto``, recomputation off, and ``training`` itself, whose
    memory ``round_trip.gpipe_fits`` takes at each worker's least over the modes."""
    if training.recompute != "auto":
        return training, training
    return replace(training, recompute=False), training


@lru_cache(maxsize=4)
def pair_bounds_s(topology, model, training) -> dict:
    """``{S: bounds}``: a bound on every plan of S stages and ``D = 1 .. len(bounds)`` replicas, for
    every S whose largest stage's state fits: ``lower_bound_s``'s terms but the deferred ones, which
    take seconds at scale (the nested crossings, the stage chains of every kind: plain, at the slow
    uplinks, per cluster pattern and clustered; the replicas' crossings and their end groups; the
    rings' slow crossings kept), and the terms that reorder the pairs worse (``_pair_bounds_s``'
    ``reordering``: GPipe's idle, the stage groups' spread, the replicas' throughput and the crossing
    stages' split). The search orders its degree pairs by it above
    ``DENSE_DEVICES`` (``front._bound_ordered``), before its phases and outside their time shares:
    with the deferred terms in it, ``plan`` on the 1,024 generated devices with ``--time-limit 6``
    took 9.9 s and its search was left with too few evaluations for a plan better than 43.01 s;
    without them 6.3 s and 4.28 s, and with ``--budget 5`` the same plan (4.27 s, 8 x 114) in 33.3
    CPU seconds instead of 36.8 (``benchmarks/scale.py --command --sizes 1024``, idle 2-core machine,
    ``benchmarks/results/scale_command_1024_*.json``). GPipe's idle and the spread lift many-stage
    pairs above the work bound but not to what their plans take, and first in the order they cost
    the search its budget: with them, a 27 x 32 plan of 15.06 s instead of 8 x 114 at 4.263 s
    (``benchmarks/bounds.py --generated 1024 --budget 5``); with the crossing stages' split in
    ``cluster_bound``, which lifts 8 x 114 (every plan of it syncs across hosts) above many-stage
    pairs whose bounds stay looser, 20 x 28 at 11.913 s. Kept for the last few jobs (a search asks
    once per tensor grouping); read-only."""
    deferred = {}
    table = _pair_bounds_s(topology, model, measured_schedules(training, topology), reordering=False, deferred=deferred,
                           windowed=False)
    for stages, terms in deferred.items():
        kept = [term() for term in terms if term.func is slow_crossing_s]
        table[stages] = np.maximum.reduce([table[stages], *kept])
    for bounds in table.values():
        bounds.setflags(write=False)
    return table


_FLOORED = (end_groups_s, replica_crossings_s)  # deferred terms that may stop short below a floor


def _lower_bound_s(topology, model, training, *, clusters: bool, fits_training=None) -> float:
    """``lower_bound_s``, with or without the clusters' term (``_least_pair_bound_s`` over
    ``_pair_bounds_s``' table and its deferred terms)."""
    deferred = {}
    pairs = _pair_bounds_s(topology, model, training, clusters=clusters, deferred=deferred,
                           fits_training=fits_training)
    return _least_pair_bound_s(topology, model, training, pairs, deferred)


def _least_pair_bound_s(topology, model, training, pairs: dict, deferred: dict, *, pair_floor_s=None,
                        kept: dict | None = None) -> float:
    """The least bound over ``pairs`` (``_pair_bounds_s``' table) raised by their ``deferred`` terms.
    The slow crossings' and the stage chains' terms only raise a pair's bound, so they are computed
    for the stage counts whose other terms' least is below the least found so far, those with the
    lowest first, and no further once the stage count's least reaches it (the least over every pair
    all the same). ``pair_floor_s(S, D)``: (D,) seconds every plan of the pairs bounded takes besides
    (``_split_by_senders_s``). ``kept``: the values of the terms without a floor already computed on
    this table, filled in as they are (another call on the same table reuses them)."""
    kept = {} if kept is None else kept
    if pair_floor_s is not None:
        pairs = {s: np.maximum(b, pair_floor_s(s, np.arange(1, len(b) + 1))) for s, b in pairs.items()}
    best = np.inf
    for stages in sorted(pairs, key=lambda s: float(pairs[s].min())):
        if float(pairs[stages].min()) >= best:
            break
        values = pairs[stages]
        # the replicas' crossings first (where slow links split the replicas they bind most often, and
        # they may stop short below the others' bound)
        for term in sorted(deferred.get(stages, ()), key=lambda term: term.func not in _FLOORED):
            if term.func in _FLOORED:
                # pairs already at the least found need no exact value: any bound at most theirs will do
                raised = term(floor=np.where(values >= best, np.inf, values))
            else:
                raised = kept[term] if term in kept else kept.setdefault(term, term())
            values = np.maximum(values, raised)
            if float(values.min()) >= best:  # this S cannot lower the least: its other terms are not needed
                break
        best = min(best, float(values.min()))
    return best if np.isfinite(best) else work_bound_s(topology, model, training)


def _pair_bounds_s(topology, model, training, *, clusters: bool = True, round_trips: bool = True,
                   deferred: dict | None = None, reordering: bool = True, fits_training=None,
                   windowed: bool = True, cases: dict | None = None) -> dict:
    """``{S: bounds}``: the bound on every plan of S stages and ``D = 1 .. len(bounds)`` replicas,
    for every S whose largest stage's state fits (``lower_bound_s``: their least); without the
    clusters' or the round trips' term where ``clusters`` or ``round_trips`` is False. Given a dict
    ``deferred``, the slow crossings' terms are left out of the bounds and put there instead, as
    ``{S: [callables giving (D,) seconds]}``. Without ``reordering``, GPipe's idle, the stage
    groups' spread and ``cluster_bound``'s reordering terms are left out (``pair_bounds_s``). ``fits_training``: the training whose memory
    GPipe must fit in (``_per_worker_recompute``; ``training`` where None). Without ``windowed``, the
    backward passes' windows (``planner.search.backward_window``) are left out. Given a dict
    ``cases``, ``cluster_bound``'s cases for S stages at the ``k``-th clustering level go in
    ``cases[S, k]`` (its ``parts``)."""
    fits_training = fits_training or training
    topology = _as_fast_as_groups(topology, model, training)
    work = work_flops(topology, model, training)
    flops = topology.effective_flops(training.precision)
    speed = np.sort(flops)[::-1]
    fastest = np.cumsum(speed)
    per_sequence = layer_costs(model, training, 1, 1)  # the stage model for one sequence, one stage
    params = per_sequence.layers * per_sequence.layer_params + per_sequence.first_params  # the whole model
    tensor = _most_tensor_devices(topology, model, training)
    memory = topology.memory_bytes()
    # The least state a device can hold: the model's sharded over every device if sharding is allowed,
    # split over a tensor group's members.
    # With one replica there is no outer (local steps) or PowerSGD state: the least of one and of all.
    state = params * min(layer_costs(model, training, 1, 1, r).state_bytes_per_param
                         for r in (1, topology.size)) / tensor
    fewest_stages = max(1, math.ceil(state / float(memory.max())))
    layer_params = per_sequence.layer_params
    # a block's FLOPs as the fastest-counting device counts them (Device.block_slowdown)
    least_slowdown = _least_block_slowdown(topology, training)
    sequence_layer_flops = per_sequence.layer_flops * least_slowdown
    zero_bubble_share = zero_bubble_trip_share(least_slowdown)  # of a trip's compute that ZB-H1 keeps
    gradient_bytes = _least_sync_bytes_per_param(model, training)
    boundary_bytes = _least_boundary_bytes(per_sequence, training)
    best_out = np.sort(topology.network.fastest_out_bytes_per_s())[::-1]  # each device's fastest outgoing link, best first
    timed = _timed_speedups(topology, per_sequence, flops)
    speedup = _tensor_speedup(per_sequence, tensor, sequence_layer_flops, float(flops.min()), float(best_out[0]),
                              timed)
    # a cell of a plan of S D cells holds at most 1 + N - S D devices: its speedup with that many at most
    speedups = np.array([_tensor_speedup(per_sequence, most, sequence_layer_flops, float(flops.min()),
                                         float(best_out[0]), timed) for most in range(1, tensor + 1)])
    n = topology.size
    rho = gain_per_spare_device(speedups)  # what a spare device adds to a tensor group, at most
    syncs = syncs_for(training, 2)
    whole_message_syncs = any(s in (Sync.HIERARCHICAL, Sync.PARAMETER_SERVER) for s in syncs)
    # Local steps in sync groups (``planner.plan.sync_groups``): the slowest member is a lead, whose
    # leads' ring of h >= 2 groups sends 2 (h - 1) / h >= 1 of n every H iterations, or in a group of
    # g >= 2, whose ring sends 2 (g - 1) / g >= 1 of n every iteration: n per H iterations at least.
    grouped = training.sync_every > 1 and training.sync_groups != REPLICA
    levels = cluster_levels(topology, training) if clusters else []
    counts = [group_counts(level.cluster_sizes, n, model.layers) for level in levels] if round_trips else []
    # the backward passes' windows (``planner.search.backward_window``): terms of ``lower_bound_s`` only
    windows = [window_of(topology.network, level.labels, flops, boundary_bytes) if round_trips and windowed else None
               for level in levels]
    batch = training.global_batch
    block_work = batch * model.layers * sequence_layer_flops  # every block, every sequence
    # of it, the backward FLOPs that wait for a round trip (ZB-H1's input gradients only, where it may run)
    trip_share = zero_bubble_share if Schedule.ZERO_BUBBLE in training.schedules else 1.0
    window_work = batch * model.layers * max(0.0, trip_share * sequence_layer_flops - per_sequence.layer_forward_flops)
    head_flops = (work - block_work) / batch  # one sequence's head, as work_flops counts it
    heaviest_by_stages = [_heaviest_stage_flops(model.layers, s, sequence_layer_flops, head_flops,
                                                training.virtual_stages != 1) for s in range(1, model.layers + 1)]
    two_stages = layer_costs(model, training, 1, 2)  # a pipeline's first and last stages' extras
    end_params = layer_params + max(two_stages.first_params, two_stages.last_params)
    crossing = Crossing(model_sync_bytes=model.layers * layer_params * gradient_bytes,
                        end_sync_bytes=end_params * gradient_bytes, layers=model.layers,
                        batch_bytes=batch * boundary_bytes, batch=batch, sharded=Sync.SHARDED in syncs,
                        ring_only=set(syncs) == {Sync.RING} and not grouped, sync_every=training.sync_every)
    sequence_s = work / batch / (speedup * speed[0])  # one sequence's forward and backward, every stage
    boundary_s = boundary_bytes / best_out[0] if best_out[0] > 0 else math.inf  # a lone device has no boundary
    latency_s = least_latency_s(topology.network)
    first_params = layer_params + two_stages.first_params  # a first stage's block and embeddings
    most_sequences = training.micro_batch_size or math.inf
    nic_rates = nic_rates_bytes_per_s(topology.network)  # devices alone behind a shared NIC (slow_uplinks)
    patterned = tensor == 1 and crossing.ring_only and n <= _CLUSTERED_CHAINS_DEVICES  # cluster_patterns' plans
    links = [cluster_links(topology.network, level.tau_bytes_per_s) for level in levels] if patterned else []
    pairs = {}
    for stages in range(fewest_stages, min(model.layers, n) + 1):
        replicas = np.arange(1, min(n // stages, batch) + 1)
        if replicas.size == 0:
            break
        used = np.minimum(stages * replicas * tensor, n)  # devices a plan of these degrees may use
        cells_flops = np.minimum(fastest[used - 1], speedup * fastest[stages * replicas - 1])
        spare = n - stages * replicas  # devices beyond one a cell: the most the tensor groups take
        cells_flops = np.minimum(cells_flops, most_cells_flops(fastest, stages * replicas, spare, speed[0], rho))
        compute = work / cells_flops
        share = 2.0 * (replicas - 1) / replicas
        if whole_message_syncs or grouped:
            share = np.minimum(share, 1.0)
        ring = share / np.where(replicas > 1, best_out[replicas - 1], 1.0)  # s/byte
        sync = params / stages * gradient_bytes * ring
        pipe = 0.0
        if stages > 1:
            pipe = np.ceil(batch / replicas) * boundary_bytes / best_out[0]
        deepest = math.ceil(model.layers / stages)
        busiest = np.ceil(batch / replicas)  # the busiest replica's sequences, at least
        cell_flops = speedup * speed[0]  # one cell at its fastest
        widest_stage = (busiest * deepest * sequence_layer_flops / cell_flops
                        + deepest * layer_params * gradient_bytes * ring)
        # Every replica's heaviest stage (``_heaviest_stage_flops`` per sequence) on its own cells:
        # the busiest replica's on one cell; all of them together on the fastest devices the other
        # stages' cells (one device at least each) leave.
        heaviest = heaviest_by_stages[stages - 1]
        group = np.minimum(replicas * tensor, n - (stages - 1) * replicas)
        busiest_cell = busiest * heaviest / cell_flops
        heaviest_flops = np.minimum.reduce([fastest[group - 1], speedup * fastest[replicas - 1],
                                            most_cells_flops(fastest, replicas, spare, speed[0], rho)])
        heaviest_cells = batch * heaviest / heaviest_flops
        terms = [compute, sync, np.broadcast_to(pipe, compute.shape), widest_stage, busiest_cell, heaviest_cells,
                 stage_split_s(block_work, cells_flops, crossing.model_sync_bytes * ring, stages)]
        crossing_trips = [None] * len(levels)  # each level's round trips where the busiest replica crosses it
        if stages > 1 and round_trips:
            fits = (gpipe_fits(model, fits_training, stages, busiest, tensor, n, float(memory.max()))
                    if Schedule.GPIPE in training.schedules else None)

            def level_crossing(level):  # what a clustering adds to a trip (round_trip.crossing_extra_s)
                return partial(crossing_extra_s, stages=stages, largest=int(level.sizes.max()),
                               tau_bytes_per_s=min(level.tau_bytes_per_s, float(best_out[0])),
                               both_ways_bytes_per_s=min(level.both_ways_bytes_per_s, float(best_out[0])),
                               between_latency_s=level.latency_s, sequence_bytes=boundary_bytes,
                               boundary_s=boundary_s, latency_s=latency_s)

            def level_crossings(fewest):
                return [level_crossing(level)(fewest=fewest) for level in levels]
            every = tuple(level_crossings(0))
            trips = partial(_round_trips_s, model, fits_training, stages, busiest, tensor, n, float(memory.max()),
                            sequence_s=sequence_s, most_sequences=np.minimum(most_sequences, busiest),
                            micro_batch=training.micro_batch_size or math.inf,
                            first_sync_s=first_params * gradient_bytes * ring, fits=fits,
                            cells_work_s=compute if reordering else None, zero_bubble_share=zero_bubble_share)
            deepest_sync_s = deepest * layer_params * gradient_bytes * ring
            both = trips(boundary_s=boundary_s, latency_s=latency_s, deepest_sync_s=deepest_sync_s,
                         crossing_sets=[every] + [every + (one,) for one in level_crossings(1)])
            terms.append(both[0])
            crossing_trips = both[1:]
            # every replica across a slow link: its messages over it, then a sync (``crossing_pipe``)
            terms += [crossing_pipe_s(level, stages=stages, layers=model.layers, replicas=replicas, batch=batch,
                                      sequence_bytes=boundary_bytes, fastest_bytes_per_s=float(best_out[0]),
                                      block_s=trip_share * sequence_layer_flops / cell_flops,
                                      block_sync_bytes=layer_params * gradient_bytes,
                                      first_sync_bytes=first_params * gradient_bytes,
                                      last_sync_bytes=(layer_params + two_stages.last_params) * gradient_bytes,
                                      ring_s_per_byte=ring, ring_only=crossing.ring_only, sharded=crossing.sharded,
                                      sync_every=training.sync_every) for level in levels]
            pure_tau, pure_latency = every_group_crosses(levels, replicas)
            cell_speedup = speedups[np.minimum(tensor, 1 + np.maximum(0, n - stages * replicas)) - 1]
            spared = partial(trips, sequence_s=work / batch / (cell_speedup * speed[0]))

            def crossed(b, lam, phases_b, phases_lam, deepest_s, trips=spared, **work):  # this S's, called later
                return trips(boundary_s=b, latency_s=lam, phases_boundary_s=phases_b, phases_latency_s=phases_lam,
                             deepest_sync_s=deepest_s, **work)[0]
            crossed_kwargs = dict(stages=stages, layers=model.layers, replicas=replicas, round_trips=crossed,
                                  boundary_s=boundary_s, latency_s=latency_s, sequence_bytes=boundary_bytes,
                                  block_s=busiest * sequence_layer_flops / (cell_speedup * speed[0]),
                                  block_sync_bytes=layer_params * gradient_bytes, fast_rate=ring,
                                  ring_only=crossing.ring_only, sharded=crossing.sharded,
                                  sync_every=training.sync_every, pure_tau_bytes_per_s=pure_tau,
                                  pure_latency_s=pure_latency)
            # each level's slow crossings, raised by its backward windows where it has them
            window_terms = dict(work_flops=work, window_flops=window_work, cells_flops=cells_flops,
                                chain_s=model.layers * per_sequence.layer_forward_flops / cell_flops)
            crossings = [partial(slow_crossing_s, level, count, **crossed_kwargs,
                                 window=None if window is None else WindowTerm(window=window, **window_terms))
                         for level, count, window in zip(levels, counts, windows)]
            # how far the stage groups spread: the least of its two cases at each clustering (``pure_groups``)
            spreads = dict(stages=stages, replicas=replicas, work_flops=work, cells_flops=cells_flops,
                          most_cells_flops=partial(_most_cells_flops, fastest, tensor, speedup), round_trips=crossed,
                          boundary_s=boundary_s, latency_s=latency_s, sequence_bytes=boundary_bytes,
                          block_sync_bytes=layer_params * gradient_bytes, ring_only=crossing.ring_only,
                          sharded=crossing.sharded, sync_every=training.sync_every)
            if reordering:
                terms += [np.minimum(*spread_floors_s(level, count, **spreads)) for level, count in zip(levels, counts)]
            crossings += [partial(nested_crossing_s, levels[i], counts[i], levels[j], counts[j], devices=n,
                                  **crossed_kwargs)
                          for i, j in _nested_pairs(levels)]
            chains = dict(stages=stages, layers=model.layers, busiest=busiest, schedules=training.schedules,
                          interleaved=training.virtual_stages != 1,
                          per_round=training.micro_batches_per_round or math.inf,
                          warmup_depth=bound_depth(training),
                          micro_batch=training.micro_batch_size or math.inf, layer_s=sequence_layer_flops / cell_flops,
                          head_s=head_flops / cell_flops, boundary_s=boundary_s, latency_s=latency_s,
                          layer_sync_s=layer_params * gradient_bytes * ring,
                          first_sync_s=two_stages.first_params * gradient_bytes * ring,
                          last_sync_s=two_stages.last_params * gradient_bytes * ring,
                          gpipe_fits=True if fits is None else fits, zero_bubble_share=zero_bubble_share)
            crossings.append(partial(stage_chains_s, **chains))
            plain = {k: v for k, v in chains.items() if k not in ("busiest", "gpipe_fits") and not k.endswith("sync_s")}
            crossings += [partial(pattern_chains_s, *link, replicas=replicas,
                                  busiest=busiest, ring_bytes_per_s=np.where(replicas > 1, best_out[replicas - 1], np.inf),
                                  share=share, block_sync_bytes=layer_params * gradient_bytes,
                                  first_sync_bytes=two_stages.first_params * gradient_bytes,
                                  last_sync_bytes=two_stages.last_params * gradient_bytes,
                                  sequence_bytes=boundary_bytes, gpipe_fits=chains["gpipe_fits"], **plain)
                          for link in links]
            if n <= _CLUSTERED_CHAINS_DEVICES and tensor == 1 and crossing.ring_only:
                # every cell one device: the plan's S D devices hold one whose fastest outgoing link is
                # at most the (S D)-th best, and with D >= 2 its stage's ring leaves it over that link
                slowest = share / np.where(replicas > 1, best_out[stages * replicas - 1], np.inf)  # s/byte
                crossings.append(partial(stage_chains_s, **chains, odd_sync=tuple(
                    bytes_ * gradient_bytes * slowest
                    for bytes_ in (layer_params, two_stages.first_params, two_stages.last_params))))
            if n <= _CLUSTERED_CHAINS_DEVICES:
                # a NIC no slower than the fastest link rarely binds: left out (time); before the
                # clustered chains, which it often makes unneeded (lower_bound_s stops at the least)
                uplink = slowest_used_rate(nic_rates, stages * replicas)
                if (uplink < best_out[0]).any():
                    crossings.append(partial(
                        uplink_chains_s, levels, stages=stages, replicas=replicas, batch=batch,
                        rate=np.where(uplink < best_out[0], uplink, np.inf), sequence_bytes=boundary_bytes,
                        share=share, ring_bytes_per_s=np.where(replicas > 1, best_out[replicas - 1], np.inf),
                        ring_only=crossing.ring_only, every_device_a_cell=stages * replicas == n,
                        block_sync_bytes=layer_params * gradient_bytes,
                        first_sync_bytes=two_stages.first_params * gradient_bytes,
                        last_sync_bytes=two_stages.last_params * gradient_bytes,
                        crossing_extras=[level_crossing(level) for level in levels],
                        **{k: v for k, v in chains.items() if k not in ("stages", "busiest")}))
                crossings += [partial(clustered_stage_chains_s, level, replicas=replicas, ring_only=crossing.ring_only,
                                      share=share, block_sync_bytes=layer_params * gradient_bytes,
                                      first_sync_bytes=two_stages.first_params * gradient_bytes,
                                      last_sync_bytes=two_stages.last_params * gradient_bytes,
                                      ring_bytes_per_s=np.where(replicas > 1, best_out[replicas - 1], np.inf),
                                      crossing_extra=level_crossing(level), **chains)
                               for level in levels]
            largest_params = max(params / stages, deepest * layer_params, first_params)
            replica_terms = [partial(replica_crossings_s, level, training, stages=stages, replicas=replicas,
                                     zero_bubble_share=zero_bubble_share,
                                     batch=batch, devices=n, sequence_s=work / batch / speed[0],
                                     heaviest_s=heaviest / speed[0],
                                     deepest_s=deepest * sequence_layer_flops / speed[0],
                                     deepest_sync_bytes=deepest * layer_params * gradient_bytes,
                                     tensor_speedups=speedups, boundary_s=boundary_s,
                                     latency_s=latency_s, sequence_bytes=boundary_bytes, most_sequences=most_sequences,
                                     first_sync_bytes=first_params * gradient_bytes,
                                     largest_sync_bytes=largest_params * gradient_bytes, fast_rate=ring,
                                     ring_only=crossing.ring_only, sharded=crossing.sharded,
                                     gpipe_fits=True if fits is None else fits, spare_gain=rho,
                                     last_sync_bytes=(layer_params + two_stages.last_params) * gradient_bytes)
                             for level in levels]
            # at the least of the end groups' placements (``end_groups_s``); above _END_GROUPS_DEVICES at
            # none (``ends=None``: weaker, a lower bound still, a quarter of the work)
            crossings += [partial(end_groups_s, term) if n <= _END_GROUPS_DEVICES else term for term in replica_terms]
            if deferred is None:
                terms += [term() for term in crossings]
            else:
                deferred[stages] = crossings
        every_block = busiest * model.layers * sequence_layer_flops / cell_flops  # K of cluster_bound
        terms += [cluster_bound(level, crossing, stages, replicas, used, speedup, cells_flops, work, block_work,
                                every_block, state / stages, crossing.model_sync_bytes * ring, trip,
                                reordering=reordering,
                                parts=None if cases is None else cases.setdefault((stages, k), {}))
                  for k, (level, trip) in enumerate(zip(levels, crossing_trips))]
        pairs[stages] = np.maximum.reduce(terms)
    return pairs


def _most_cells_flops(fastest: np.ndarray, tensor: int, speedup: float, cells: np.ndarray) -> np.ndarray:
    """The most FLOP/s ``cells`` (an array; 0 for none) cells reach together, as the work term's
    ``cells_flops``: the ``cells t`` fastest devices' at most, ``speedup`` times the ``cells`` fastest's
    (``fastest``: the devices' speeds, fastest first, summed)."""
    cells = np.asarray(cells)
    n = fastest.size
    most = np.minimum(fastest[np.clip(cells * tensor, 1, n) - 1], speedup * fastest[np.clip(cells, 1, n) - 1])
    return np.where(cells > 0, most, 0.0)


def _nested_pairs(levels) -> list:
    """The clusterings ``nested_crossings`` pairs: the coarsest with each finer one whose clusters hold
    two devices or more (each pair a valid term; the others are left out for time)."""
    return [(0, j) for j in range(1, len(levels)) if int(levels[j].cluster_sizes.max()) > 1]


def _round_trips_s(model, training, stages, busiest, tensor, devices, capacity_bytes, *, sequence_s, boundary_s,
                   latency_s, most_sequences, micro_batch, first_sync_s, deepest_sync_s,
                   phases_boundary_s=None, phases_latency_s=None, fits=None, crossing_sets=((),),
                   cells_work_s=None, zero_bubble_share: float = 0.0) -> list:
    """(D,) ``round_trip_s`` under the schedule that allows the fewest round trips, one array for each
    of ``crossing_sets`` (what the clusterings add to a trip, ``round_trip.crossing_extra_s``): the
    least over the schedules ``training`` allows (``schedule_windows``; GPipe only where its
    activations fit, ``gpipe_fits``; and never below ``gpipe_phases_s``, its first boundary's message
    and latency ``phases_boundary_s`` and ``phases_latency_s``, ``boundary_s`` and ``latency_s``
    unless given; ``fits``: ``gpipe_fits``'s answer where the caller has it). ZB-H1's chain runs the
    forwards and the input gradients' share of the backwards: ``zero_bubble_share`` of the compute
    at least (``cost_models.flops.zero_bubble_trip_share``; 0 counts none). Given ``cells_work_s``
    (the work over the cells' speed), GPipe (one chunk a device) is never below ``gpipe_idle_s``
    either, whose crossings every replica pays: the boundary prices given here must hold for every
    replica."""
    phases_boundary_s = boundary_s if phases_boundary_s is None else phases_boundary_s
    phases_latency_s = latency_s if phases_latency_s is None else phases_latency_s
    least = [np.full(np.shape(busiest), np.inf) for _ in crossing_sets]
    one_chunk = training.virtual_stages != "auto" and training.fixed_virtual_stages == 1
    for schedule, window in schedule_windows(training, stages).items():
        compute_s = sequence_s * (zero_bubble_share if schedule == Schedule.ZERO_BUBBLE else 1.0)
        floor = last_sync_s(stages=stages, busiest=busiest, window=window, micro_batch=micro_batch,
                            sequence_s=compute_s, boundary_s=boundary_s, latency_s=latency_s,
                            deepest_sync_s=deepest_sync_s)
        gpipe = schedule == Schedule.GPIPE
        if gpipe and fits is None:
            fits = gpipe_fits(model, training, stages, busiest, tensor, devices, capacity_bytes)
        allowed = fits if gpipe else True
        rounds = np.maximum(np.ceil(np.ceil(busiest / most_sequences) / window), 1.0)  # the fewest: 1 in one round
        for k, crossings in enumerate(crossing_sets):
            seconds = np.maximum(floor, round_trip_s(stages=stages, busiest=busiest, window=window,
                                                     max_micro_batch=most_sequences, sequence_s=compute_s,
                                                     boundary_s=boundary_s, latency_s=latency_s,
                                                     first_sync_s=first_sync_s, crossings=crossings,
                                                     micro_batch=micro_batch))
            if gpipe:
                seconds = np.maximum(seconds, gpipe_phases_s(busiest=busiest, rounds=rounds,
                                                             boundary_s=phases_boundary_s, latency_s=phases_latency_s,
                                                             first_sync_s=first_sync_s, crossings=crossings))
                if cells_work_s is not None and one_chunk:
                    seconds = np.maximum(seconds, gpipe_idle_s(stages=stages, cells_work_s=cells_work_s,
                                                               boundary_s=boundary_s, latency_s=latency_s,
                                                               micro_batch=micro_batch, crossings=crossings))
            least[k] = np.minimum(least[k], np.where(allowed, seconds, np.inf))
    return least


def work_flops(topology, model, training) -> float:
    """The iteration's training FLOPs as the cost model counts them (recomputation included; the
    head at the smallest calibrated head slowdown, never above 1: a faster head only lowers the bound;
    the blocks at the smallest ``Device.block_slowdown``; under ``recompute: auto`` none, the fewest:
    ``_per_worker_recompute``)."""
    training = _per_worker_recompute(training)[0]
    slowdown = min(float(topology.head_slowdowns().min()), 1.0)
    return iteration_flops(model, training.global_batch, recompute=training.recompute, head_slowdown=slowdown,
                           block_slowdown=_least_block_slowdown(topology, training))


def _least_block_slowdown(topology, training) -> float:
    """The smallest ``Device.block_slowdown`` of the topology under ``training``'s recomputation and
    the schedules a plan may run (ZB-H1's split backward where it is one of them)."""
    training = _per_worker_recompute(training)[0]
    return min(float(topology.block_slowdowns(training.recompute, split).min())
               for split in {schedule == Schedule.ZERO_BUBBLE for schedule in training.schedules})


def _most_tensor_devices(topology, model, training) -> int:
    """The most devices one cell of a plan may hold: the largest tensor degree that divides the
    model's heads and MLP width and fits in one host's devices of one type (1 where the job
    interleaves, which runs no tensor groups)."""
    if training.fixed_virtual_stages > 1:
        return 1
    most = max(Counter((d.host, d.type_name) for d in topology.devices).values())
    return max(t for t in TENSOR_DEGREES
               if t == 1 or (t <= most and model.heads % t == 0 and model.ffn_hidden % t == 0))


def _least_sync_bytes_per_param(model, training) -> float:
    """The fewest bytes any parameter adds to a sync per iteration: the training precision's, or
    PowerSGD's best-compressed part (``least_gradient_bytes_per_param``), over the local steps'
    ``H`` (``training.sync_every``: a sync every ``H`` iterations)."""
    costs = layer_costs(model, training, 1, 1, 2)  # two replicas: the sync as a data-parallel plan runs it
    rate = least_gradient_bytes_per_param(costs)
    return rate / costs.sync_every if costs.powersgd_rank else rate  # the plain rate is already over H


def _least_boundary_bytes(per_sequence, training) -> float:
    """Bytes one sequence's activation adds to a message across a stage boundary: at the training
    precision, or in block-wise int8 one byte per value and one fp32 scale per ``BLOCK_VALUES``
    values, without the last block's padding (``cost_models.compression.int8_message_bytes`` of a
    micro-batch of ``m`` sequences is at least ``m`` times this)."""
    if training.compress_messages != MessageCompression.INT8:
        return per_sequence.boundary_bytes
    values = per_sequence.raw_boundary_bytes / training.activation_bytes
    return values * (1.0 + SCALE_BYTES / BLOCK_VALUES)


def _heaviest_stage_flops(layers: int, stages: int, layer_flops: float, head_flops: float, interleaved: bool) -> float:
    """The least FLOPs per sequence of a plan's heaviest stage: ``layers`` whole blocks of
    ``layer_flops`` over ``stages`` stages of at least one block each, the last one also running the
    head (``head_flops``), the least over the last stage's share ``k`` of
    ``max(k w + h, ceil((L - k) / (S - 1)) w)``. ``interleaved``: a device may hold several chunks,
    so only ``max(ceil(L / S) w, (L w + h) / S, w + h)``."""
    w, h = layer_flops, head_flops
    if stages == 1:
        return layers * w + h
    if interleaved:
        return max(math.ceil(layers / stages) * w, (layers * w + h) / stages, w + h)
    last = np.arange(1, layers - stages + 2)
    return float(np.maximum(last * w + h, np.ceil((layers - last) / (stages - 1)) * w).min())


def _tensor_speedup(per_sequence, most: int, layer_flops: float, slowest_flops: float, best_link: float,
                    timed: dict | None = None) -> float:
    """How many times one device's block speed a tensor group of at most ``most`` devices reaches,
    at most: a block of ``w`` FLOPs per sequence takes a member of speed ``v`` at least
    ``w / (t v)`` plus the group's all-reduces of the block's activation (a ring's
    ``2 (t - 1) / t`` of each message over a link no faster than the fastest,
    ``planner.prediction.stage_model.tensor_layer_s``), so the group runs at most
    ``t / (1 + c_t t v / w)`` times one member's speed; that decreases with ``v``, so the slowest
    device's speed gives the most (1 for a cell of one device). A degree whose block a calibration
    timed (``timed``: ``_timed_speedups``) runs as timed, which may be faster: the larger of the two."""
    allreduces = (per_sequence.tensor_allreduces_forward + per_sequence.tensor_allreduces_backward)
    best = 1.0
    for t in TENSOR_DEGREES:
        if 1 < t <= most:
            seconds = allreduces * 2.0 * (t - 1) / t * per_sequence.tensor_message_bytes / best_link
            best = max(best, t / (1.0 + seconds * t * slowest_flops / layer_flops), (timed or {}).get(t, 1.0))
    return best


def _timed_speedups(topology, per_sequence, flops: np.ndarray) -> dict:
    """``{t: speedup}`` for each degree whose block a calibration timed on some device type
    (``Device.tensor_block_s``, and ``tensor_block_received_s`` where timed apart): how many times one member's speed the group runs at most, its
    plain block's FLOPs per sequence over the member's speed and the least time per sequence of the
    timings (``comm.measured_tensor_block_s`` is linear between them and proportional above them,
    so its time per sequence is least at a timed size); recomputation and a split backward scale
    the timed and the modelled block alike (``stage_model.tensor_layer_s``)."""
    from cost_models.flops import training_flops_multiplier

    plain = per_sequence.layer_forward_flops * training_flops_multiplier(False)
    timed = {}
    for device, speed in zip(topology.devices, flops):
        # a group that receives its input (or runs ZB-H1) runs as its received timings say
        for t, table in device.tensor_block_s + (device.tensor_block_received_s or ()):
            least = min(seconds / b for b, seconds in table)
            timed[t] = max(timed.get(t, 1.0), plain / (speed * least))
    return timed
