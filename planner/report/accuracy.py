"""Predicted against measured, over run folders written by ``plan launch``: the numbers behind the
accuracy benchmark and ``plan plot``.

One sign convention everywhere (CLI, results.json, figures, notebook, benchmarks): the prediction
error is ``(predicted - measured) / measured``; positive means the prediction was too slow (the run
was faster than predicted), negative that the run took longer than predicted.
"""

import numpy as np

__all__ = ["prediction_error", "run_row", "mean_absolute_percentage_error", "rank_correlation", "memory_rows"]


def prediction_error(predicted_s: float, measured_s: float) -> float:
    """``(predicted - measured) / measured``, as a fraction: the one sign convention (module docstring)."""
    return (predicted_s - measured_s) / measured_s


def run_row(results: dict, label: str) -> dict:
    """One run: predicted and measured iteration seconds at the plan's scale (an emulated run's
    measurement divided by its time scale), and the relative error of the prediction."""
    predicted = results["predicted"]["iteration_s"]
    degrees = results["plan"]["degrees"]  # named pipeline/data; runs recorded before the names: stages/replicas
    measured = results["comparison"]["measured_s"] / results["run"]["time_scale"]
    return {"label": label, "predicted_s": predicted, "measured_s": measured,
            "error": prediction_error(predicted, measured), "time_scale": results["run"]["time_scale"],
            "emulated": results["run"]["emulated"], "schedule": results["plan"]["schedule"],
            "stages": degrees.get("pipeline", degrees.get("stages")),
            "replicas": degrees.get("data", degrees.get("replicas")),
            "topology": results["plan"]["topology"]["name"]}


def mean_absolute_percentage_error(predicted, measured) -> float:
    """mean(|predicted - measured| / measured), as a fraction."""
    p, m = np.asarray(predicted, dtype=float), np.asarray(measured, dtype=float)
    return float(np.mean(np.abs(p - m) / m))


def _ranks(values) -> np.ndarray:
    """Ranks from 1, ties sharing their average rank."""
    values = np.asarray(values, dtype=float)
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(1, len(values) + 1)
    _, inverse = np.unique(values, return_inverse=True)
    sums = np.bincount(inverse, weights=ranks)
    counts = np.bincount(inverse)
    return (sums / counts)[inverse]


def rank_correlation(predicted, measured) -> float:
    """Spearman's rank correlation: Pearson's correlation of the ranks (1: the prediction orders the
    plans exactly as measured; Spearman 1904). NaN where it is undefined: fewer than two runs, or
    every run of the same predicted or measured rank (the same plan run twice)."""
    a, b = _ranks(predicted), _ranks(measured)
    if len(predicted) < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


def memory_rows(results: dict) -> list:
    """(device, predicted allocator bytes, measured allocator peak) where the run measured memory."""
    measured = results["measured"].get("peak_memory_bytes", {})
    predicted = results["predicted"].get("allocated_bytes") or results["predicted"]["memory_bytes"]
    return [(d, predicted[d], measured[d]) for d in sorted(measured) if measured[d] is not None and d in predicted]
