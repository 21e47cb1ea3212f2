"""``plan plot``: figures of predicted against measured, from run folders (matplotlib, headless).

- ``accuracy``: predicted vs measured iteration time over runs, the y = x line, points numbered and
  named in a legend (numbers never overlap), MAPE and Spearman's rank correlation in the title.
- ``timeline``: one run's predicted and measured per-rank Gantt charts, one above the other, on the
  run's clock: an emulated run's in emulated seconds (the plan's seconds times the time scale), the
  title giving both clocks.
- ``memory``: predicted vs measured peak allocator memory per device.
- ``loss`` (asked for by name): the measured loss per iteration of every run on one axis, each run
  labelled with what it changes in the optimisation (compression, local steps), to set a lossy
  run's curve next to the uncompressed one.
Each figure is written as PNG and SVG. Errors are ``(predicted - measured) / measured``
(``planner.report.accuracy.prediction_error``).
"""

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FuncFormatter, NullFormatter  # noqa: E402

from planner.report.accuracy import (mean_absolute_percentage_error, memory_rows, prediction_error,  # noqa: E402
                                     rank_correlation, run_row)

__all__ = ["plot_accuracy", "plot_timeline", "plot_memory", "plot_loss", "loss_label", "timeline_title", "FORMATS"]

FORMATS = ("png", "svg")
_COLOURS = {"fwd": "#4C72B0", "bwd": "#DD8452", "wgrad": "#937860", "recv": "#C8C8C8", "send": "#8C8C8C",
            "sync": "#55A868", "step": "#C44E52"}
_LEGEND = {"fwd": "forward", "bwd": "backward", "wgrad": "weight gradients (zb-h1)", "recv": "waiting for a message",
           "send": "message in flight", "sync": "gradient sync", "step": "optimizer step"}


def _save(figure, stem: Path) -> list:
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in FORMATS:
        path = stem.with_suffix(f".{fmt}")
        figure.savefig(path, dpi=150, bbox_inches="tight")
        paths.append(path)
    plt.close(figure)
    return paths


def plot_accuracy(runs: list, stem, *, title: str = "Predicted vs measured iteration time") -> list:
    """``runs``: (label, results document) pairs. Returns the written paths."""
    rows = [run_row(results, label) for label, results in runs]
    predicted = [r["predicted_s"] for r in rows]
    measured = [r["measured_s"] for r in rows]
    figure, axes = plt.subplots(figsize=(7.5, 6))
    low, high = min(predicted + measured) * 0.8, max(predicted + measured) * 1.25
    axes.plot([low, high], [low, high], color="black", linewidth=1, label="y = x")
    for k, r in enumerate(rows, start=1):
        marker = "o" if r["emulated"] else "s"
        axes.scatter(r["measured_s"], r["predicted_s"], marker=marker, s=36, color="#4C72B0", zorder=3)
        axes.annotate(str(k), (r["measured_s"], r["predicted_s"]), textcoords="offset points", xytext=(4, 4),
                      fontsize=8)
    if high / low > 10:
        axes.set_xscale("log")
        axes.set_yscale("log")
    axes.set_xlim(low, high)
    axes.set_ylim(low, high)
    for axis in (axes.xaxis, axes.yaxis):
        axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        axis.set_minor_formatter(NullFormatter())
    axes.set_xlabel("measured iteration time (s; emulated runs at the plan's scale)")
    axes.set_ylabel("predicted iteration time (s)")
    mape = mean_absolute_percentage_error(predicted, measured)
    rho = rank_correlation(predicted, measured)
    spearman = "n/a (the runs do not differ in rank)" if math.isnan(rho) else f"{rho:.3f}"
    axes.set_title(f"{title}\nMAPE {100 * mape:.1f}%, Spearman {spearman}, {len(rows)} runs", fontsize=11)
    names = [f"{k}: {r['label']} ({100 * r['error']:+.1f}%)" for k, r in enumerate(rows, start=1)]
    handles = [Patch(color="none", label=n) for n in names]
    axes.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=7, frameon=False,
                handlelength=0, title="run ((predicted - measured) / measured)", title_fontsize=8)
    axes.grid(alpha=0.3)
    return _save(figure, Path(stem))


def _bars(axes, trace: list, rows: dict, scale: float) -> None:
    for op in trace:
        kind = "wgrad" if op["kind"] == "bwd_weight" else op["kind"].split("_")[0]
        start, end = op["start_s"] * scale, op["end_s"] * scale
        if end <= start:
            continue
        axes.barh(rows[op["rank"]], end - start, left=start, height=0.7, color=_COLOURS.get(kind, "#999999"),
                  edgecolor="none")


def timeline_title(results: dict, label: str = "") -> tuple:
    """(suptitle, x-axis label) of a run's timeline, naming the clock: an emulated run is drawn in
    emulated seconds, which are the plan's seconds times ``run.time_scale``."""
    c, run = results["comparison"], results["run"]
    error = prediction_error(c["predicted_s"], c["measured_s"])
    name = label or results["plan"]["topology"]["name"]
    if run["emulated"]:
        scale = run["time_scale"]
        return (f"{name}: predicted {c['predicted_s']:.3f}, measured {c['measured_s']:.3f} emulated s "
                f"(plan: {c['predicted_s'] / scale:.3f} s predicted, {c['measured_s'] / scale:.3f} s measured; "
                f"time scale {scale:.4g}); error {100 * error:+.1f}% (predicted - measured) / measured",
                f"emulated seconds since the iteration started (plan seconds x {scale:.4g})")
    return (f"{name}: predicted {c['predicted_s']:.3f} s, measured {c['measured_s']:.3f} s; "
            f"error {100 * error:+.1f}% (predicted - measured) / measured",
            "seconds since the iteration started")


def plot_timeline(results: dict, stem, *, label: str = "") -> list:
    """Predicted (top) and measured (bottom) Gantt charts of one run, on the run's clock."""
    measured = results["measured"]["trace"]
    predicted = results["predicted"]["trace"]
    scale = results["run"]["time_scale"]
    ranks = sorted({op["rank"] for op in measured} | {op["rank"] for op in predicted})
    names = {op["rank"]: f"r{op['replica']} s{op['stage']} {op['device']}" for op in measured + predicted}
    rows = {rank: k for k, rank in enumerate(ranks)}
    height = 1.2 + 0.32 * len(ranks)
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(11, 2 * height), sharex=True)
    _bars(top, predicted, rows, scale)
    _bars(bottom, measured, rows, 1.0)
    for axes, what in ((top, "predicted"), (bottom, "measured (median iteration)")):
        axes.set_yticks(range(len(ranks)))
        axes.set_yticklabels([names[r] for r in ranks], fontsize=8)
        axes.invert_yaxis()
        axes.set_title(what, fontsize=10, loc="left")
        axes.grid(axis="x", alpha=0.3)
    title, xlabel = timeline_title(results, label)
    bottom.set_xlabel(xlabel)
    figure.suptitle(title, fontsize=10)
    figure.legend(handles=[Patch(color=_COLOURS[k], label=_LEGEND[k]) for k in _COLOURS], loc="lower center",
                  ncol=6, fontsize=8, frameon=False, bbox_to_anchor=(0.5, -0.02))
    figure.tight_layout(rect=(0, 0.04, 1, 1))
    return _save(figure, Path(stem))


def plot_memory(results: dict, stem, *, label: str = "") -> list:
    """Grouped bars: predicted and measured peak allocator memory per device (GB). Empty if not measured."""
    rows = memory_rows(results)
    if not rows:
        return []
    figure, axes = plt.subplots(figsize=(max(4.5, 1.2 * len(rows) + 2), 4))
    x = range(len(rows))
    axes.bar([i - 0.2 for i in x], [p / 1e9 for _, p, _ in rows], width=0.4, label="predicted", color="#4C72B0")
    axes.bar([i + 0.2 for i in x], [m / 1e9 for _, _, m in rows], width=0.4, label="measured", color="#DD8452")
    for i, (_, p, m) in enumerate(rows):
        axes.annotate(f"{100 * prediction_error(p, m):+.1f}%", (i, max(p, m) / 1e9), textcoords="offset points",
                      xytext=(0, 3), ha="center", fontsize=8)
    axes.set_xticks(list(x))
    axes.set_xticklabels([d for d, _, _ in rows])
    axes.set_ylabel("peak allocated memory (GB)")
    axes.set_title(f"{label}: predicted vs measured peak memory (CUDA allocator)", fontsize=10)
    axes.legend(fontsize=8)
    axes.grid(axis="y", alpha=0.3)
    return _save(figure, Path(stem))


def loss_label(results: dict, label: str) -> str:
    """``label`` and what the run changes in the optimisation (compression, local steps), if anything."""
    run = results.get("run", {})
    compression = run.get("compression") or {}
    changes = []
    if compression.get("messages", "off") != "off":
        changes.append(f"{compression['messages']} messages")
    if compression.get("gradients", "off") != "off":
        changes.append(f"{compression['gradients']} rank {compression.get('rank')}")
    if run.get("sync_every", 1) > 1:
        changes.append(f"sync every {run['sync_every']}")
    return f"{label} ({', '.join(changes) or 'uncompressed'})"


def plot_loss(runs: list, stem, *, title: str = "Measured loss per iteration") -> list:
    """``runs``: (label, results document) pairs; each run's measured losses against the iteration
    (the run's first measured one counted from its ``first_iteration``). Returns the written paths."""
    figure, axes = plt.subplots(figsize=(7.5, 4.5))
    for label, results in runs:
        losses = results["measured"]["loss"]
        run = results.get("run", {})
        first = run.get("first_iteration", 0) + run.get("warmup", 0) + 1
        axes.plot(range(first, first + len(losses)), losses, marker=".", label=loss_label(results, label))
    axes.set_xlabel("iteration")
    axes.set_ylabel("loss (measured)")
    axes.set_title(title, fontsize=11)
    axes.legend(fontsize=8, frameon=False)
    axes.grid(alpha=0.3)
    return _save(figure, Path(stem))
