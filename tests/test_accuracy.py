"""Accuracy metrics and ``plan plot`` from small committed results files."""

from pathlib import Path

import pytest
from scipy.stats import spearmanr

from planner.report.accuracy import mean_absolute_percentage_error, rank_correlation
from planner.cli import main

DATA = Path(__file__).resolve().parent / "data"


def test_rank_correlation_matches_scipy_with_ties():
    predicted = [3.0, 1.0, 2.0, 2.0, 5.0, 4.0]
    measured = [2.9, 1.2, 2.5, 2.1, 4.0, 4.5]
    assert rank_correlation(predicted, measured) == pytest.approx(spearmanr(predicted, measured).statistic)
    assert rank_correlation([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)


def test_rank_correlation_of_runs_that_do_not_differ_is_nan_without_a_warning():
    """The same plan run twice predicts the same time: no rank to correlate (numpy would warn)."""
    import math
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert math.isnan(rank_correlation([0.3, 0.3], [0.31, 0.32]))
        assert math.isnan(rank_correlation([0.3], [0.31]))


def test_mean_absolute_percentage_error_by_hand():
    assert mean_absolute_percentage_error([1.1, 0.9], [1.0, 1.0]) == pytest.approx(0.1)


def test_plot_writes_every_figure_from_committed_results(tmp_path, capsys):
    runs = [str(DATA / name) for name in ("emulated-run", "gpu-run")]
    assert main(["plot", *runs, "--out", str(tmp_path)]) == 0
    written = {Path(line).name for line in capsys.readouterr().out.split()}
    for stem in ("accuracy", "timeline-emulated-run", "timeline-gpu-run", "memory-gpu-run"):
        for suffix in ("png", "svg"):
            assert f"{stem}.{suffix}" in written
            assert (tmp_path / f"{stem}.{suffix}").stat().st_size > 5000
    assert "memory-emulated-run.png" not in written  # no allocator on the CPU: no memory figure


def test_plot_into_a_folder_whose_parent_is_missing_is_one_line(tmp_path, capsys):
    """As ``plan -o``: the figures' folder may be new, the folder holding it must exist (a typo in
    the path makes no tree of folders)."""
    assert main(["plot", str(DATA / "gpu-run"), "--out", str(tmp_path / "missing" / "figures")]) == 2
    err = capsys.readouterr().err
    assert "field '--out'" in err and "does not exist" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "missing").exists()
    assert main(["plot", str(DATA / "gpu-run"), "--out", str(tmp_path / "figures")]) == 0


def test_plot_of_a_folder_without_results_is_one_line(tmp_path, capsys):
    assert main(["plot", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "results.json" in err and len(err.strip().splitlines()) == 1


def test_one_sign_for_the_prediction_error_everywhere():
    import json

    from planner.cli import _run_summary
    from planner.report.accuracy import prediction_error, run_row
    from planner.runtime.results import comparison

    assert prediction_error(1.1, 1.0) == pytest.approx(0.1)  # predicted too slow: positive
    c = comparison(predicted_plan_s=1.0, time_scale=2.0, measured_s=2.5)  # ran slower than predicted
    assert c["prediction_error"] == pytest.approx(-0.2) == prediction_error(c["predicted_s"], c["measured_s"])
    results = json.loads((DATA / "emulated-run" / "results.json").read_text())
    row = run_row(results, "run")
    assert row["error"] == pytest.approx(prediction_error(results["comparison"]["predicted_s"],
                                                          results["comparison"]["measured_s"]))
    summary = _run_summary(results, "runs/x")
    assert f"prediction error (predicted - measured) / measured = {100 * row['error']:+.1f}%" in summary


def test_nothing_reads_the_old_opposite_sign_key():
    root = Path(__file__).resolve().parent.parent
    sources = [*root.glob("planner/**/*.py"), *root.glob("benchmarks/*.py"), *root.glob("notebooks/*.ipynb")]
    assert len(sources) > 40
    assert [str(p) for p in sources if "relative_error" in p.read_text()] == []


def test_timeline_titles_name_the_clock():
    import json

    from planner.report.plot import timeline_title

    emulated = json.loads((DATA / "emulated-run" / "results.json").read_text())
    scale = emulated["run"]["time_scale"]
    title, xlabel = timeline_title(emulated, "e")
    assert emulated["run"]["emulated"] and "emulated s" in title and f"time scale {scale:.4g}" in title
    assert f"plan: {emulated['comparison']['predicted_s'] / scale:.3f} s predicted" in title
    assert xlabel == f"emulated seconds since the iteration started (plan seconds x {scale:.4g})"
    gpu = json.loads((DATA / "gpu-run" / "results.json").read_text())
    title, xlabel = timeline_title(gpu, "g")
    assert "emulated" not in title + xlabel and "(predicted - measured) / measured" in title


@pytest.mark.parametrize("pick, expected", [
    ("dtfm-case5-mini--planner-4x2-1f1b", {"zero1-uneven", "local-steps", "sync-parameter-server", "sync-sharded",
                                           "powersgd", "rounds", "zb-h1", "interleaved", "int8-messages",
                                           "warmup-depth", "recompute-per-worker", "recompute-selective"}),
    ("home-mini--planner-3x1-1f1b", {"rounds", "zb-h1", "int8-messages", "recompute-per-worker",
                                     "recompute-selective"}),
])
def test_emulated_dimension_plans_are_valid_plans(tmp_path, pick, expected):
    """Every plan the emulated benchmark adds for the plan space's dimensions passes the launch's checks."""
    from benchmarks.accuracy import DIMENSIONS, _dimension_plans, _wanted, _write
    from planner.inputs.job import Job
    from planner.runtime.inputs import load_run_inputs

    root = Path(__file__).resolve().parent.parent
    inputs = load_run_inputs(root / "benchmarks" / "results" / "accuracy_emulated" / "plans" / f"{pick}.yaml")
    job = Job(topology=inputs.topology, model=inputs.model, training=inputs.training)
    plans = _dimension_plans(inputs.plan, job, seed=0)
    assert {dimension for _, _, dimension in plans.values()} == expected and expected <= set(DIMENSIONS)
    for label, (plan, run_job, dimension) in plans.items():
        path = _write(plan, run_job, inputs.topology_path, tmp_path / f"{label}.yaml")
        ran = load_run_inputs(path).plan
        assert ran.stages == plan.stages and ran.replicas == plan.replicas
        assert _wanted(f"{inputs.topology.name}--{label}", dimension, (dimension,))
        assert not _wanted(f"{inputs.topology.name}--{label}", dimension, ("tensor",))


@pytest.mark.parametrize("resume, calibrated", [(False, 1), (True, 0)])
def test_the_gpu_benchmark_calibrates_on_its_host_unless_told_to_resume(tmp_path, monkeypatch, resume, calibrated):
    """``accuracy.py gpu`` measures its calibration on the host it runs on, over whatever file an
    earlier run (of another host, or the committed results) left in its out folder; ``--resume``
    keeps that file, to split the cases over several calls on one host."""
    import shutil

    from benchmarks import accuracy
    from planner.runtime import calibrate

    root = Path(__file__).resolve().parent.parent
    path = tmp_path / "calibration.yaml"
    shutil.copy(root / "benchmarks" / "results" / "accuracy_gpu_h200x2" / "calibration.yaml", path)
    calls = []
    monkeypatch.setattr(calibrate, "calibrate", lambda topology, options, log: calls.append(options.out))
    calibration, job = accuracy._calibrated(accuracy.GPU_TOPOLOGY, path, "auto", resume)
    assert calls == [str(path)] * calibrated
    assert calibration.document["device_types"] and job.topology.devices[0].tensor_block_s


def test_host_time_sums_a_trace_per_stage_and_op():
    """``benchmarks/host_time.py`` adds each op's ``host_s`` and device span per (stage, kind); the
    committed ZB-H1 run compiled between its linear layers issued 0.137 s of forward on stage 0."""
    import json

    from benchmarks.host_time import per_op

    root = Path(__file__).resolve().parent.parent
    results = json.loads((root / "benchmarks" / "results" / "zero_bubble_split_op" / "16d2bdb-between-linears.json")
                         .read_text())
    table = per_op(results)
    trace = results["measured"]["trace"]
    assert sum(count for _, _, count in table.values()) == len(trace)
    host, device, count = table[(0, "fwd")]
    assert count == 8 and round(host, 3) == 0.137 and device > 0
    assert sum(h for h, _, _ in table.values()) == pytest.approx(sum(op.get("host_s") or 0.0 for op in trace))
