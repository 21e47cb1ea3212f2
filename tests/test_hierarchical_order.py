"""A hierarchical sync is timed by the search's estimate in the order the plan then syncs in.

The estimate times a hierarchical all-reduce (reduce in each host, ring among the hosts' leads)
over ``locality.sorted_ring``'s order of the stage's devices, and the plan syncs in that order.
Before (6209301) the estimate took ``Network.ring_order``'s order and the plan its ring
all-reduce's order, whose leads' rings crossed the regions otherwise: on the generated 1,024
devices, a pipeline of one host of each type in each of 8 regions, one replica a region, the
estimate said 39.70 s and the simulator 14.60 s; two or three a region, 39.72 s and 39.46 s."""

import numpy as np
import pytest

from benchmarks.generated_layouts import _region_local
from benchmarks.scale import generated_topology
from planner.inputs.model import model_preset, parse_training
from planner.inputs.topology import parse_topology
from planner.prediction.predict import predict
from planner.search.evaluate import evaluate_placement, make_context
from planner.search.plans import candidate_to_plan
from planner.search.sync_choice import choose_sync


@pytest.fixture(scope="module")
def generated():
    topology = parse_topology(generated_topology(1024), name="generated-1024")
    rows = _region_local(topology)
    regions = np.array([topology.devices[r[0]].region for r in rows])
    return topology, rows, regions


MODEL = model_preset("gpt3-6.7b")


def _job(per_region: int, sync: str = "hierarchical") -> dict:
    return {"global_batch": 4 * 8 * per_region, "micro_batch_size": 1, "precision": "fp16", "recompute": True,
            "flash_attention": True, "sync": sync}


def _searched(generated, per_region: int) -> tuple:
    """(training, candidate, plan): ``per_region`` replicas a region, a hierarchical sync."""
    topology, rows, regions = generated
    assign = rows[np.concatenate([np.flatnonzero(regions == g)[:per_region] for g in topology.regions])]
    training = parse_training(_job(per_region))
    ctx = make_context(topology, MODEL, training)
    candidate = evaluate_placement(ctx, assign, 1, "gpipe")
    return training, candidate, candidate_to_plan(ctx, candidate)


@pytest.mark.parametrize("per_region", [1, 2, 3])
def test_estimate_equals_the_simulation(generated, per_region):
    topology = generated[0]
    training, candidate, plan = _searched(generated, per_region)
    simulated = predict(plan, topology, MODEL, training)[0].iteration_s
    assert simulated == pytest.approx(candidate.score_s, rel=1e-9)
    # sync: auto picks the algorithm on the simulator with the same order: hierarchical's time is the estimate's
    _, _, tried = choose_sync(plan, topology, MODEL, parse_training(_job(per_region, "auto")))
    assert tried["hierarchical"] == pytest.approx(candidate.score_s, rel=1e-9)


def test_a_plan_made_elsewhere_syncs_in_the_estimates_order(generated):
    """``plan_with_sync`` sets a hierarchical plan's ring orders itself (plans of other engines and
    re-plans reach it with ring orders of their own): from the replicas' order, one replica a region,
    the plan simulates at the estimate's time."""
    from dataclasses import replace

    from planner.search.sync_choice import plan_with_sync

    topology = generated[0]
    training, candidate, plan = _searched(generated, 1)
    elsewhere = replace(plan, ring_orders=tuple(tuple(range(plan.replicas)) for _ in range(plan.stages)))
    plan = plan_with_sync(elsewhere, topology, "hierarchical")
    assert predict(plan, topology, MODEL, training)[0].iteration_s == pytest.approx(candidate.score_s, rel=1e-9)
