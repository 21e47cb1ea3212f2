"""From the search's ``Candidate`` (device indices, counts) to a named ``Plan``."""

import numpy as np

from cost_models.schedule import run_depth
from planner.plan.dims import Compression, Sync
from planner.plan.plan import Plan
from planner.plan.sync import AUTO
from planner.search.evaluate import Candidate, charges_groups, ring_cost, ring_nic_rates, timed_positions, timed_ring
from planner.search.locality import best_ring
from planner.search.sync_choice import plan_with_sync

__all__ = ["candidate_to_plan", "plan_ring"]


def plan_ring(ctx, members: np.ndarray, *, exact: bool = False) -> list:
    """The ring order (positions into ``members``, a stage's devices by replica) the plan syncs
    in: the ring the search's estimate timed (``evaluate.ring_cost``: ``locality.sorted_ring``),
    or ``best_ring``'s on the replicas' order with ``Network.ring_order``'s 2-opt where that one is
    no slower per byte and no longer in latency, so the plan's all-reduce never takes longer than
    the estimate charged at any size, and where it holds no shared NIC longer (a ring that leaves a
    host twice holds its NIC twice as long: ``Network.ring_nic_rates``). (The 2-opt ring alone took
    stage 2 of a random 15-replica placement over 5 regions to 2.95 ns/byte and 1.47 s against the
    estimate's 2.86 and 1.30, simulated 5% above the estimate; and on another, left a host twice, so
    the other stage's sync queued 0.8 s longer for its NIC: 12% above.) ``exact``: the timed ring
    only, for local steps in sync groups (``evaluate.charges_groups``), whose inner rings and leads'
    ring are parts of it that a faster whole ring need not keep fast."""
    if exact:
        return timed_positions(ctx, members)
    members = [int(m) for m in members]
    key = tuple(sorted(members))
    timed = timed_ring(ctx, key)
    position = {d: i for i, d in enumerate(members)}
    improved = [members[i] for i in best_ring(ctx.topology, members, ctx.region_orders)]
    per_byte, latency = ring_cost(ctx, np.asarray(key))  # the estimate's, memoised
    better_per_byte, better_latency = ctx.network.ring_cost(improved)
    nics = dict(ring_nic_rates(ctx, key))
    no_busier = all(rate <= nics.get(nic, -1.0) for nic, rate in ctx.network.ring_nic_rates(improved))
    chosen = improved if better_per_byte <= per_byte and better_latency <= latency and no_busier else timed
    return [position[d] for d in chosen]


def candidate_to_plan(ctx, candidate: Candidate) -> Plan:
    """The plan of ``candidate``: each cell named by its device, or by its tensor group's lead with
    the group in ``tensor_groups``; idle: every device of the real topology that no cell uses."""
    topo = ctx.topology
    names = topo.names
    bounds = np.concatenate([[0], np.cumsum(candidate.layer_counts)]).tolist()
    assignment = tuple(tuple(names[d] for d in row) for row in candidate.assign)
    R, S = candidate.assign.shape
    exact = charges_groups(ctx.training, R)  # group rings are parts of the ring: only the timed one holds
    rings = tuple(tuple(plan_ring(ctx, candidate.assign[:, s], exact=exact)) for s in range(S))
    used = sorted(set(candidate.assign.ravel().tolist()))
    members = ctx.groups.members if ctx.groups is not None else tuple((name,) for name in names)
    working = {name for d in used for name in members[d]}
    real = ctx.groups.topology if ctx.groups is not None else topo
    plan = Plan(layer_bounds=tuple(bounds), assignment=assignment, micro_batches=candidate.micro_batches,
                micro_batch_size=candidate.micro_batch_size, schedule=candidate.schedule, ring_orders=rings,
                topology_name=topo.name, topology_sha256=topo.sha256,
                idle=tuple(name for name in real.names if name not in working),
                tensor_groups=tuple(members[d] for d in used if len(members[d]) > 1),
                sync_every=ctx.training.sync_every,
                micro_batches_per_round=ctx.training.micro_batches_per_round,
                compression=Compression.of_training(ctx.training),
                warmup_depth=run_depth(candidate.schedule, ctx.training.fixed_warmup_depth))
    if ctx.training.sync not in (AUTO, Sync.RING):  # auto: resolved on the final plan (``choose_sync``)
        plan = plan_with_sync(plan, real, Sync(ctx.training.sync))
    return plan
