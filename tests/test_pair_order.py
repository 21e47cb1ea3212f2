"""Degree pairs are constructed in the order of a probe estimate, not of the compute bound alone."""

from dataclasses import replace

from planner.inputs.job import load_job
from planner.search.front import SearchOptions, search

from conftest import ROOT


def test_a_few_fast_devices_beat_many_behind_slow_links():
    # 4 H100 on one host and 16 RTX 3090 in homes on 1 Gbit/s lines: the compute bound ranks the
    # pairs that use the homes first; in bound order the 4-H100 data-parallel plan (2.68 s) was never
    # constructed and the search returned a 5 x 4 plan over the homes (21.6 s).
    job = load_job(ROOT / "topologies" / "hetero" / "h100-3090-homes.yaml")
    training = replace(job.training, recompute=False)
    # a work budget, not the clock alone, so that machine load cannot change the plan
    result = search(job.topology, job.model, training, SearchOptions(time_limit_s=120, budget_s=10))
    used = set(result.plan.used_devices)  # tensor groups' members included
    assert used == {f"h100-{i}" for i in range(4)}
    assert result.predicted_s < 3.0


def test_a_pair_whose_probes_do_not_fit_is_judged_by_pipelines_that_mix_the_types():
    # 16 A100 80 GB, 8 V100 32 GB and 8 T4 16 GB in two datacenters, the optimizer state sharded:
    # the 4 x 8 pair's probes put four T4s in a row, which cannot hold a pipeline, so the pair went
    # unjudged behind the pairs the bound orders first, and at this budget the search returned a
    # 12 x 2 plan of 23.2 s, slower than the A100s alone (2 x 8, 18.96 s). Judged by its stage
    # groups dealt across the pipelines (probe_fallback), 4 x 8 is constructed first: 16.57 s.
    import numpy as np

    from planner.search.construct import probe_fallback, probe_layouts
    from planner.search.evaluate import evaluate_placement, make_context

    job = load_job(ROOT / "topologies" / "hetero" / "two-datacenters-a100-v100-t4.yaml")
    training = replace(job.training, precision="auto", shard_optimizer="auto", recompute=False)
    ctx = make_context(job.topology, job.model, training)
    probes = probe_layouts(job.topology, ctx.speed, ctx.capacity, 4, 8, [])
    assert all(evaluate_placement(ctx, a, 1, "1f1b") is None for a in probes)
    fallback = probe_fallback(probes[0])
    assert sorted(fallback.ravel().tolist()) == list(range(32)) and fallback.shape == (8, 4)
    assert evaluate_placement(ctx, fallback, 1, "1f1b").score_s < 18.0
    result = search(job.topology, job.model, training, SearchOptions(seed=0, time_limit_s=120, budget_s=2.5))
    assert (result.plan.stages, result.plan.replicas) == (4, 8)
    assert result.predicted_s < 18.96 * 0.95
    assert np.isfinite(result.lower_bound_s)


def _generated(devices: int):
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from scale import generated_topology

    from planner.inputs.model import model_preset, parse_training
    from planner.inputs.topology import parse_topology

    topology = parse_topology(generated_topology(devices), name=f"generated-{devices}")
    training = parse_training({"global_batch": 2 * devices, "micro_batch_size": 1, "precision": "bf16",
                               "recompute": True, "flash_attention": True})
    return topology, model_preset("gpt3-6.7b"), training


def test_the_pairs_that_fill_one_region_are_probed_inside_it():
    # 256 generated devices in two regions of 128 joined at 1-10 Gbit/s: for each stage count, the
    # most replicas one region holds, probed as whole pipelines inside one region; nothing goes first
    # that does not beat the other probes, and only the pairs from `after` on are probed.
    import time

    import numpy as np

    from planner.search.deadline import Budget
    from planner.search.evaluate import make_context
    from planner.search.front import _inside_layout, _inside_one_cluster
    from planner.search.locality import bandwidth_clusters

    topology, model, training = _generated(256)
    ctx = make_context(topology, model, training)
    levels = bandwidth_clusters(topology)
    assert np.bincount(levels[-1]).tolist() == [128, 128]
    pairs = [(0.0, s, d) for s, d in ((18, 7), (16, 8), (4, 64), (18, 6), (8, 16), (2, 64))]
    budget = Budget(limit_s=600.0, started=time.perf_counter(), work_s=60.0)

    def inside(beat, after=0):
        return _inside_one_cluster(ctx, topology, pairs, 1, "1f1b", budget, np.inf, levels, beat=beat, after=after)
    first, units = inside(np.inf)
    # (18, 6) and (4, 64) do not fill a region (6 < 128 // 18, 4 x 64 is two regions' worth); the rest do
    assert sorted(first) == [0, 1, 4, 5] and units > 0
    for index in first:
        layout = _inside_layout(ctx, topology, levels[-1], *pairs[index][1:])
        assert layout.shape == pairs[index][:0:-1]
        assert len({topology.devices[i].region for i in layout.ravel()}) == 1
    assert inside(0.0)[0] == []
    assert inside(np.inf, after=2)[0] == [i for i in first if i >= 2]


def test_a_pair_that_fills_the_larger_of_two_regions_is_probed_inside_it(tmp_path):
    # h100-a100-two-regions with its A100 region doubled (32 H100 beside 64 A100): 4 x 16 fills the
    # A100 region; whole pipelines cut in the clusters' order would start in the H100 region and spill
    # over into the other, the probe's layout stays in the one region that holds it.
    import numpy as np
    import yaml

    from planner.inputs.job import load_job
    from planner.search.evaluate import make_context
    from planner.search.front import _inside_layout
    from planner.search.locality import bandwidth_clusters

    document = yaml.safe_load((ROOT / "topologies" / "hetero" / "h100-a100-two-regions.yaml").read_text())
    for entry in document["devices"]:
        if entry["type"] == "A100-40GB":
            entry["count"] *= 2
    path = tmp_path / "bigger-a100-region.yaml"
    path.write_text(yaml.safe_dump(document))
    job = load_job(path)
    ctx = make_context(job.topology, job.model, job.training)
    levels = bandwidth_clusters(job.topology)
    sizes = sorted(np.bincount(levels[-1]).tolist())
    assert sizes[-1] > sizes[0]
    layout = _inside_layout(ctx, job.topology, levels[-1], 4, sizes[-1] // 4)
    assert len({job.topology.devices[i].region for i in layout.ravel()}) == 1


def test_a_plan_inside_one_region_is_found_at_256_devices():
    # The probes' share of the budget reached 230 of the 1,028 pairs in the compute bound's order,
    # never 18 x 7, and the search returned 16 x 16 at 3.308 s (4 x 64 at 1.971 s on a budget of 30);
    # probed inside one region, 18 x 7 takes 1.551 s with the other region idle.
    topology, model, training = _generated(256)
    result = search(topology, model, training, SearchOptions(seed=0, time_limit_s=600, budget_s=5))
    assert len({topology.devices[topology.index(name)].region for name in result.plan.used_devices}) == 1
    assert result.predicted_s < 1.6
