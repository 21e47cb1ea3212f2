"""``benchmarks/communication_savings.py``: every setting planned with one seed and budget, the
refused combinations named, the best row found, the same numbers on a second run."""

import math

import pytest

from planner.inputs.job import load_job
from planner.search.front import SearchOptions
from tests.conftest import small_topology


def _slow_link_job(write_yaml):
    """4 T4s in two regions joined by 1 Gbit/s and a model whose gradient sync across it costs more
    than a replica's compute saves, unless synced less often or compressed."""
    doc = small_topology(devices=[{"name": "e", "count": 2, "type": "T4", "region": "east"},
                                  {"name": "w", "count": 2, "type": "T4", "region": "west"}],
                         network={"region": {"latency": "1ms", "bandwidth": "10Gbps"},
                                  "global": {"latency": "20ms", "bandwidth": "1Gbps"}},
                         model={"layers": 8, "hidden": 1024, "heads": 16, "sequence": 1024, "vocabulary": 32000},
                         training={"global_batch": 16, "micro_batch_size": 1, "schedule": "1f1b",
                                   "precision": "fp16"})
    return load_job(write_yaml(doc))


def _numbers(table: dict) -> list:
    return [(r["setting"], r.get("iteration_s"), r.get("bytes_per_token"), r.get("stages"), r.get("replicas"),
             r.get("refused")) for r in table["rows"]]


def test_settings_table_plans_every_setting_refuses_local_steps_with_powersgd_and_repeats(write_yaml):
    from benchmarks.communication_savings import NONE, SETTINGS, settings_table

    job = _slow_link_job(write_yaml)
    options = SearchOptions(seed=3, time_limit_s=300.0, budget_s=0.5)
    table = settings_table(job, options)
    assert [r["setting"] for r in table["rows"]] == [label for label, _ in SETTINGS]
    refused = {r["setting"]: r["refused"] for r in table["rows"] if "refused" in r}
    assert set(refused) == {"H=4 + PowerSGD", "H=16 + PowerSGD"}  # every other combination plans
    assert all("training.compress_gradients" in line and "sync_every" in line for line in refused.values())
    planned = [r for r in table["rows"] if "refused" not in r]
    tokens = job.training.global_batch * job.model.sequence
    for r in planned:
        assert r["tokens_per_iteration"] == tokens and r["clock_cut"] == []
        assert math.isclose(r["seconds_per_token"], r["iteration_s"] / tokens)
        assert math.isclose(r["seconds_per_million_tokens"], 1e6 * r["seconds_per_token"])
        assert r["sync_every"] == dict(SETTINGS)[r["setting"]].get("sync_every", 1)
    none = next(r for r in planned if r["setting"] == NONE)
    best = next(r for r in planned if r["setting"] == table["best"])
    assert none["over_none"] == 1.0 and best["over_none"] == table["best_over_none"]
    assert best["seconds_per_token"] == min(r["seconds_per_token"] for r in planned)
    # Across 1 Gbit/s syncing less often or less pays: the best setting is faster than none, and
    # spreads over more replicas than none can afford.
    assert table["best"] != NONE and table["best_over_none"] < 0.9
    assert best["replicas"] > none["replicas"]
    # The same seed and budget give the same plans and numbers.
    assert _numbers(settings_table(job, options)) == _numbers(table)


def test_refused_setting_is_not_searched(write_yaml):
    from benchmarks.communication_savings import plan_setting
    from planner.errors import InputError

    job = _slow_link_job(write_yaml)
    with pytest.raises(InputError, match="compress_gradients"):
        plan_setting(job, {"sync_every": 4, "compress_gradients": "powersgd"}, SearchOptions(budget_s=0.1))
