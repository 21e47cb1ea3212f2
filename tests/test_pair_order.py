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
