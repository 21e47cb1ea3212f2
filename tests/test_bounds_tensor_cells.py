"""The work bound's cap on what spare devices add to tensor groups (``planner.search.tensor_cells``):
by hand, and on 8 hosts of 8 V100s (DTFM's on-demand case) and a small cluster like it, above the
bound without it and below the simulated time of plans whose spare devices form tensor groups."""

import numpy as np
import pytest

from planner.search.tensor_cells import gain_per_spare_device, most_cells_flops


def test_gain_per_spare_device_by_hand():
    """Groups of 2 at 1.4x, of 4 at 1.75x, of 8 at 2x one member: per device taken 0.4, 0.25 and 1/7;
    sizes 3, 5, 6, 7 are no tensor degree."""
    speedups = np.array([1.0, 1.4, 1.4, 1.75, 1.75, 1.75, 1.75, 2.0])
    assert np.isclose(gain_per_spare_device(speedups), 0.4)
    assert np.isclose(gain_per_spare_device(np.array([1.0, 1.1, 1.1, 1.9])), 0.3)  # the group of 4: 0.9 / 3
    assert gain_per_spare_device(np.array([1.0])) == 0.0


def test_most_cells_flops_by_hand():
    """Devices of 4, 3, 2, 1 FLOP/s: 2 cells with 2 spare devices reach at most 4 + 3 + 2 x 0.4 x 4 =
    10.2 (the fastest device's speed for each spare one's share); 4 cells, none spare: 10."""
    fastest = np.cumsum([4.0, 3.0, 2.0, 1.0])
    assert np.isclose(most_cells_flops(fastest, np.array([2]), np.array([2]), 4.0, 0.4)[0], 10.2)
    assert np.isclose(most_cells_flops(fastest, np.array([4]), np.array([0]), 4.0, 0.4)[0], 10.0)


def test_raises_the_on_demand_case():
    """DTFM's on-demand case: 5 x 8 leaves 24 spare devices, at 0.41 of a device each in groups of 2:
    the work over 40 + 24 x 0.41 devices' speed, 10.0 s, where every device counted gave 7.79 s; the
    least over the pairs rises from 7.79 s to above 8.0 s (its searched plan: 12.03 s)."""
    from planner.inputs.job import load_job
    from planner.search.bounds import _pair_bounds_s, lower_bound_s, work_bound_s

    job = load_job("topologies/dtfm/case1-datacenter-ondemand.yaml")
    pairs = _pair_bounds_s(job.topology, job.model, job.training)
    work = work_bound_s(job.topology, job.model, job.training)
    assert pairs[5][7] > 1.25 * work
    assert lower_bound_s(job.topology, job.model, job.training) > 8.0


def test_stays_below_plans_with_tensor_groups(monkeypatch):
    """Two hosts of 4 V100s (100 Gbit/s inside, 3.125 Gbit/s between), GPT-3 XL and a small model,
    16 sequences: plans of 1 to 4 cells, their spare devices in tensor groups of 2 or 4 inside a host,
    simulate at or above their pair's bound, which the cap raises on some of them."""
    import planner.search.bounds as bounds
    from planner.inputs.model import model_preset, parse_training
    from planner.inputs.topology import parse_topology
    from planner.prediction.predict import predict
    from planner.search.evaluate import evaluate_placement, make_context
    from planner.search.plans import candidate_to_plan

    topology = parse_topology({"devices": [{"name": "gpu", "count": 8, "type": "V100-16GB", "gpus_per_host": 4,
                                            "host": "instance", "region": "dc"}],
                               "network": {"host": {"latency": "0ms", "bandwidth": "100Gbps"},
                                           "region": {"latency": "0ms", "bandwidth": "3.125Gbps"}}}, name="hosts")
    names = topology.names
    layouts = {  # (stages, replicas): tensor groups (device indices), the cells in order
        (2, 1): [(0, 1, 2, 3), (4, 5, 6, 7)],
        (1, 2): [(0, 1, 2, 3), (4, 5, 6, 7)],
        (2, 2): [(0, 1), (2, 3), (4, 5), (6, 7)],
        (4, 1): [(0, 1), (2, 3), (4, 5), (6, 7)],
        (1, 4): [(0, 1), (2, 3), (4, 5), (6, 7)],
        (3, 1): [(0, 1), (2, 3), (4, 5)],
        (1, 3): [(0, 1, 2, 3), (4, 5)],
    }
    checked = raised = 0
    for preset in ("gpt3-xl", "small"):
        model = model_preset(preset)
        for schedule in ("1f1b", "gpipe"):
            training = parse_training({"global_batch": 16, "micro_batch_size": 1, "schedule": schedule,
                                       "precision": "fp16", "recompute": True, "sync": "ring"})
            pairs = bounds._pair_bounds_s(topology, model, training)
            with monkeypatch.context() as patch:
                patch.setattr(bounds, "gain_per_spare_device", lambda speedups: 1e9)  # no cap
                without = bounds._pair_bounds_s(topology, model, training)
            for (stages, replicas), groups in layouts.items():
                ctx = make_context(topology, model, training, tuple(tuple(names[i] for i in g) for g in groups))
                cells = [ctx.topology.names.index(names[g[0]]) for g in groups]  # a group's cell: its lead's
                if len(cells) < stages * replicas:
                    continue
                assign = np.array(cells[:stages * replicas]).reshape(replicas, stages)
                candidate = evaluate_placement(ctx, assign, 1, schedule)
                if candidate is None:
                    continue
                prediction, _ = predict(candidate_to_plan(ctx, candidate), topology, model, training)
                if not prediction.fits:
                    continue
                bound = pairs[stages][replicas - 1]
                checked += 1
                raised += bound > 1.02 * without[stages][replicas - 1]
                assert bound <= prediction.iteration_s * (1 + 1e-9), (preset, schedule, stages, replicas, bound,
                                                                     prediction.iteration_s)
    assert checked >= 16
    assert raised >= 4


@pytest.mark.parametrize("ratio, schedule", [(0.9, "1f1b"), (0.5, "1f1b"), (0.5, "zb-h1")])
def test_a_group_timed_faster_than_its_members_compute_stays_above_the_bound(ratio, schedule):
    """Eight hosts of two RTX 4090s whose calibration timed a group of 2 at ``ratio`` times the
    modelled compute of its block (faster than two members' FLOP/s: the table is what runs), a
    256-token GPT of hidden 4096, one replica of 8 stages on the 8 groups: the plan simulates above
    its pair's bound and the lower bound. Before the bound took the devices as fast as their
    fastest group (``bounds._as_fast_as_groups``), its work terms held the members' own FLOP/s as
    the most they compute: 2.42 s against 2.37 s simulated at 0.9, 1.38 s at 0.5."""
    from dataclasses import replace

    from planner.inputs.model import parse_model, parse_training
    from planner.inputs.topology import parse_topology
    from planner.prediction.predict import predict
    from planner.prediction.stage_model import layer_costs
    from planner.search.bounds import _pair_bounds_s, lower_bound_s
    from planner.search.evaluate import evaluate_placement, make_context
    from planner.search.plans import candidate_to_plan

    model = parse_model({"layers": 32, "hidden": 4096, "heads": 32, "sequence": 256, "vocabulary": 512})
    training = parse_training({"global_batch": 256, "micro_batch_size": 1, "schedule": schedule, "precision": "fp16",
                               "recompute": False, "sync": "ring"})
    devices = [{"name": f"h{i}", "count": 2, "type": "RTX-4090", "host": f"h{i}", "region": "city"} for i in range(8)]
    topology = parse_topology({"devices": devices, "network": {"host": {"latency": "0.01ms", "bandwidth": "400Gbps"},
                                                               "region": {"latency": "0.1ms", "bandwidth": "100Gbps"}}},
                              name="groups")
    plain = layer_costs(model, training, 1, 1).layer_forward_flops * 3
    topology = replace(topology, devices=tuple(
        replace(d, tensor_block_s=((2, ((1, ratio * plain / (2 * d.effective_flops("fp16"))),
                                        (2, 2 * ratio * plain / (2 * d.effective_flops("fp16"))))),))
        for d in topology.devices))
    names = topology.names
    groups = tuple((names[2 * i], names[2 * i + 1]) for i in range(8))
    ctx = make_context(topology, model, training, groups)
    assign = np.array([[ctx.topology.index(g[0]) for g in groups]])
    plan = candidate_to_plan(ctx, evaluate_placement(ctx, assign, 1, schedule))
    assert plan.tensor_groups
    simulated = predict(plan, topology, model, training)[0].iteration_s
    assert lower_bound_s(topology, model, training) <= _pair_bounds_s(topology, model, training)[8][0] <= simulated
