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
