"""The re-plan benchmark's core (``benchmarks/replan.py``) on the six-device home topology: its
re-plans are those of ``plan --from --lost``, the same budget and seed give the same numbers, and
losing one device moves only the state it held or says why more must move."""

from pathlib import Path

import pytest
import yaml

from benchmarks.replan import ADD_ONE, LOSE_MOST, LOSE_SLOWEST, replan_rows
from tests.runtime_helpers import run_cli

ROOT = Path(__file__).resolve().parent.parent
TOPOLOGY = ROOT / "topologies" / "emulated" / "home-mini.yaml"
BUDGET_S = 1.0


def _without_wall_times(value):
    if isinstance(value, dict):
        return {k: _without_wall_times(v) for k, v in value.items() if k != "wall_s"}
    if isinstance(value, list):
        return [_without_wall_times(v) for v in value]
    return value


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> tuple:
    folder = tmp_path_factory.mktemp("replan-benchmark")
    return replan_rows(TOPOLOGY, budget_s=BUDGET_S, seed=0, folder=folder), folder


@pytest.mark.slow
def test_same_budget_and_seed_give_the_same_numbers(measured, tmp_path):
    first, _ = measured
    again = replan_rows(TOPOLOGY, budget_s=BUDGET_S, seed=0, folder=tmp_path)
    assert [r["change"] for r in first["rows"]] == [LOSE_MOST, LOSE_SLOWEST, ADD_ONE]
    assert not any(r[k]["clock_cut"] for r in first["rows"] for k in ("replan", "free"))
    assert _without_wall_times(again) == _without_wall_times(first)


def test_a_loss_moves_only_the_state_the_device_held_or_says_why(measured):
    """Each loss: either the re-plan says it moves only the lost device's state, and moves at most
    the bytes it held, or it says why more moves. Losing a 3090 (the slowest type), an idle 3090 of
    the same home takes its place and receives exactly the bytes the lost one held."""
    result, _ = measured
    for row in (r for r in result["rows"] if r["lost"]):
        replan = row["replan"]
        if "moves only the state the lost device(s) held" in replan["why"]:
            assert replan["move_bytes"] <= row["lost_held_bytes"] * (1 + 1e-9), row
        else:
            assert "moves more state than the lost device(s) held" in replan["why"], row
            assert "--move-weight" in replan["why"] or "cannot run without" in replan["why"], row
    slowest = next(r for r in result["rows"] if r["change"] == LOSE_SLOWEST)
    assert slowest["lost"][0].startswith("paris-3090") and slowest["lost_held_bytes"] > 0
    assert slowest["replan"]["chosen"].startswith("old layout with paris-3090")
    assert slowest["replan"]["move_bytes"] == pytest.approx(slowest["lost_held_bytes"], rel=1e-9)
    assert slowest["replan"]["iteration_s"] == pytest.approx(result["old"]["iteration_s"], rel=1e-9)


def test_where_a_spare_keeps_the_speed_the_minimal_move_replan_moves_less_than_a_free_one(measured):
    """Losing a 3090: with an idle 3090 in its place the old layout keeps its iteration time, and the
    minimal-move re-plan moves only the lost device's state; the free re-plan from scratch, as fast,
    re-lays the pipeline and moves more, so it scores worse on iteration time + move time / 1000."""
    result, _ = measured
    slowest = next(r for r in result["rows"] if r["change"] == LOSE_SLOWEST)
    replan, free = slowest["replan"], slowest["free"]
    assert free["iteration_s"] == pytest.approx(replan["iteration_s"], rel=1e-9)
    assert free["move_bytes"] > 2 * replan["move_bytes"] and free["move_s"] > replan["move_s"]
    assert replan["iteration_s"] + replan["move_s"] / 1000 < free["iteration_s"] + free["move_s"] / 1000


@pytest.mark.parametrize("change", [LOSE_MOST, ADD_ONE])
def test_the_benchmark_replans_as_the_command_it_records(measured, tmp_path, capsys, change):
    """The command the row records (``plan TOPOLOGY --from old.yaml --lost DEVICE`` or ``--added
    FILE``, ``--budget B``) writes the plan the benchmark measured: the same search (evaluations),
    iteration time, shape and moves."""
    result, folder = measured
    row = next(r for r in result["rows"] if r["change"] == change)
    argv = row["commands"]["replan"].split()[1:]
    assert argv[:3] == [str(TOPOLOGY), "--from", "old.yaml"] and argv[-2] == "-o"
    argv = [str(folder / a) if a.endswith(".yaml") and a != str(TOPOLOGY) else a for a in argv[:-1]]
    code, out, err = run_cli(argv + [tmp_path / "new.yaml", "--time-limit", 20], capsys)
    assert code == 0, err
    document = yaml.safe_load((tmp_path / "new.yaml").read_text())
    record = document["search"]["replan"]
    assert record["chosen"] == row["replan"]["chosen"] == "the search's plan for the new topology"
    assert document["search"]["evaluations"] == row["replan"]["evaluations"]  # the same search, the same work
    assert document["prediction"]["iteration_s"] == pytest.approx(row["replan"]["iteration_s"], rel=1e-9)
    assert record["move_bytes"] == pytest.approx(row["replan"]["move_bytes"], rel=1e-9)
    assert record["move_s"] == pytest.approx(row["replan"]["move_s"], rel=1e-9)
    assert [s["devices"] for s in document["stages"]] == [list(c) for c in zip(*row["replan"]["assignment"])]
