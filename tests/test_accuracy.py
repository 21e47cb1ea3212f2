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


def test_plot_of_a_folder_without_results_is_one_line(tmp_path, capsys):
    assert main(["plot", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "results.json" in err and len(err.strip().splitlines()) == 1
