"""Where one iteration's time goes on each rank: ``plan launch --profile`` runs the last measured
iteration under ``torch.profiler`` and writes each rank's operator table (self device time first)
to ``OUT/profile-rank-R.txt``, so a slow stage can be read op by op without a trace viewer."""

import contextlib
from pathlib import Path

import torch

__all__ = ["profiled", "PROFILE_ROWS"]

PROFILE_ROWS = 40  # operators listed per rank


@contextlib.contextmanager
def profiled(enabled: bool, device: torch.device, path: Path):
    """Profile the body when ``enabled`` (CPU ops, and CUDA kernels on a GPU) and write its table to ``path``."""
    if not enabled:
        yield
        return
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profiler:
        yield
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    table = profiler.key_averages().table(sort_by=sort, row_limit=PROFILE_ROWS)
    Path(path).write_text(table + "\n")
