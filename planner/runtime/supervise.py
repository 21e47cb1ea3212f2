"""Watching the ranks of a local launch: heartbeats, what each rank is doing, and who failed first.

Each locally spawned rank starts in ``local_rank``: it asks the kernel to kill it if the launcher
dies (``guard.die_with_parent``, before torch is even imported), then a daemon thread writes a
heartbeat and the rank's current phase into a shared array twice a second. The phase is read from
the rank's own call stack (the innermost function of ``PHASES`` on it), so the runtime needs no
hooks. The launcher's ``watch`` prints what every rank is doing while the run is slow to show
anything, names a rank that stopped answering (no heartbeat: stopped by SIGSTOP, or hung without
the interpreter), and on the first failure collects reports briefly and names the rank at fault.
"""

import multiprocessing.connection
import os
import signal
import sys
import threading
import time

from planner.runtime.guard import die_with_parent

__all__ = ["PHASES", "BEAT_S", "local_rank", "phase_of", "watch", "stop_processes", "LaunchFailure"]

BEAT_S = 0.5  # heartbeat period of every rank
_GRACE_S = 1.0  # after a failure, how long to collect the other ranks' reports before stopping them
_SILENT_S = 5.0  # a rank whose last heartbeat is older than this is not answering

# (file, function) on a rank's stack -> what it is doing; the innermost match wins.
PHASES = (
    ("starting", None),
    ("loading torch and the runtime", None),
    ("reading the plan", ("inputs.py", "load_run_inputs")),
    ("joining the process group", ("distributed_c10d.py", "init_process_group")),
    ("joining the process group", ("engine.py", "make_groups")),
    ("building its stage", ("gpt.py", "build_stage")),
    ("training: forward", ("gpt.py", "forward")),
    ("training: backward", ("_tensor.py", "backward")),
    ("training: waiting for the previous or next stage", ("engine.py", "_recv")),
    ("training: gradient all-reduce", ("engine.py", "_sync")),
    ("training: emulated compute", ("engine.py", "_emulate_compute")),
    ("training", ("engine.py", "iteration")),
    ("loading a checkpoint", ("checkpoint.py", "load_checkpoint")),
    ("writing a checkpoint", ("worker.py", "_checkpoint")),
    ("training: synchronising ranks between iterations", ("worker.py", "_run")),
    ("writing results", ("worker.py", "_write")),
    ("finished", None),
)
_STARTING, _IMPORTING, _FINISHED = 0, 1, len(PHASES) - 1
_BY_FRAME = {}
for _code, (_, _key) in enumerate(PHASES):
    if _key is not None:
        _BY_FRAME.setdefault(_key, _code)


class LaunchFailure(RuntimeError):
    """A rank died, raised or stopped answering; the message names it, ``rank`` is its number
    (None where no rank is at fault: the launcher was stopped, or no results were written)."""

    def __init__(self, message: str, *, rank: int | None = None):
        super().__init__(message)
        self.rank = rank


def phase_of(frame) -> int:
    """Index in ``PHASES`` of the innermost known function on the stack ending at ``frame``."""
    while frame is not None:
        code = frame.f_code
        key = (os.path.basename(code.co_filename), code.co_name)
        if key in _BY_FRAME:
            return _BY_FRAME[key]
        frame = frame.f_back
    return _IMPORTING


def _beat(heartbeats, rank: int, main_ident: int, done: threading.Event) -> None:
    while not done.is_set():
        frame = sys._current_frames().get(main_ident)
        heartbeats[2 * rank] = time.monotonic()
        heartbeats[2 * rank + 1] = phase_of(frame)
        del frame
        done.wait(BEAT_S)


def local_rank(rank: int, world: int, config_fields: dict, store_port: int, shared, errors, heartbeats,
               parent_pid: int) -> None:
    """Entry of a locally spawned rank (``multiprocessing`` spawn): guard, heartbeat, then the worker."""
    die_with_parent(parent_pid)
    done = threading.Event()
    heartbeats[2 * rank + 1] = _IMPORTING
    threading.Thread(target=_beat, args=(heartbeats, rank, threading.main_thread().ident, done), daemon=True,
                     name="heartbeat").start()
    try:
        from planner.runtime.worker import WorkerConfig, run_local_worker

        run_local_worker(rank, world, WorkerConfig(**config_fields), store_port, shared, errors)
    finally:
        done.set()
        heartbeats[2 * rank + 1] = _FINISHED


def _state(pid: int) -> str:
    """The kernel's one-letter state of ``pid`` (``T``: stopped), or ``""`` where unknown."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _ranges(ranks: list) -> str:
    ranks, parts, i = sorted(ranks), [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(parts)


class _Ranks:
    """The launcher's view of the heartbeat array."""

    def __init__(self, heartbeats, processes: dict, started_s: float):
        self.heartbeats, self.processes, self.started_s = heartbeats, processes, started_s

    def silent_s(self, rank: int, now_s: float) -> float:
        last = self.heartbeats[2 * rank]
        return now_s - max(last, self.started_s)

    def phase(self, rank: int) -> str:
        code = int(self.heartbeats[2 * rank + 1])
        return PHASES[code][0] if 0 <= code < len(PHASES) else "running"

    def summary(self) -> str:
        groups = {}
        for rank, process in self.processes.items():
            if process.exitcode is None:
                groups.setdefault(self.phase(rank), []).append(rank)
        return "; ".join(f"{_ranges(ranks)} {phase}" for phase, ranks in groups.items())

    def not_answering(self, now_s: float) -> list:
        """(rank, seconds silent, stopped) of live ranks without a recent heartbeat, most silent first."""
        found = []
        for rank, process in self.processes.items():
            if process.exitcode is not None:
                continue
            stopped = _state(process.pid) in ("T", "t")
            silent = self.silent_s(rank, now_s)
            if stopped or (silent > _SILENT_S and int(self.heartbeats[2 * rank + 1]) != _STARTING):
                found.append((rank, silent, stopped))
        return sorted(found, key=lambda item: -item[1])


def watch(processes: dict, errors, names: dict, heartbeats, *, timeout_s: float, log, progress_s: float = 15.0,
          started_s: float | None = None) -> None:
    """Wait for every rank; print what they do every ``progress_s``; on the first failure (or a rank
    silent for ``timeout_s``) collect reports briefly, then raise ``LaunchFailure`` naming the culprit."""
    ranks = _Ranks(heartbeats, processes, time.monotonic() if started_s is None else started_s)
    alive = dict(processes)
    next_progress = ranks.started_s + progress_s
    while alive:
        multiprocessing.connection.wait([p.sentinel for p in alive.values()], timeout=BEAT_S)
        now = time.monotonic()
        codes = {r: p.exitcode for r, p in alive.items()}  # read once: a rank may exit meanwhile
        failed = [r for r, code in codes.items() if code not in (None, 0)]
        for rank in [r for r, code in codes.items() if code is not None]:
            del alive[rank]
        silent = [item for item in ranks.not_answering(now) if item[1] > timeout_s]
        if failed or silent:
            time.sleep(_GRACE_S)
            rank, message = _failure(processes, errors, names, ranks)
            raise LaunchFailure(message, rank=rank)
        summary = ranks.summary() if now >= next_progress and alive else ""
        if summary:  # empty where the last ranks exited since their exit codes were read
            log(f"[{now - ranks.started_s:.0f} s] {summary}")
            next_progress = now + progress_s


def _failure(processes: dict, errors, names: dict, ranks: _Ranks) -> tuple:
    """(the rank at fault, the message naming it and what happened)."""
    reported = {}
    while True:
        try:
            rank, text = errors.get(timeout=0.1)
        except Exception:  # queue.Empty
            break
        reported.setdefault(rank, text)
    killed = [r for r, p in processes.items() if p.exitcode is not None and p.exitcode < 0]
    if killed:
        rank = killed[0]
        signame = signal.Signals(-processes[rank].exitcode).name
        return rank, f"{names[rank]} was killed by {signame}; the other ranks were stopped"
    quiet = ranks.not_answering(time.monotonic())
    if quiet:
        rank, silent, stopped = quiet[0]
        why = "its process is stopped (SIGSTOP or a debugger)" if stopped else "it is hung"
        waiting = [r for r in reported if r != rank]
        tail = f"; {_ranges(waiting)} timed out waiting for it" if waiting else ""
        return rank, (f"{names[rank]} stopped answering: no heartbeat for {silent:.0f} s, {why}{tail}; "
                      "the other ranks were stopped")
    secondary = ("connection", "closed", "timed out", "timeout", "peer", "broken pipe")
    causes = [r for r, text in reported.items() if not any(word in text.lower() for word in secondary)]
    rank = (causes or sorted(reported) or [r for r, p in processes.items() if p.exitcode not in (None, 0)])[0]
    text = reported.get(rank, f"exited with code {processes[rank].exitcode}")
    doing = ranks.summary() if reported and not causes else ""  # only waits failed: who was doing what
    return rank, (f"{names[rank]} failed: {text}; " + (f"still running then: {doing}; " if doing else "")
                  + "the other ranks were stopped")


def stop_processes(processes) -> None:
    """Terminate what still runs (continuing stopped ones), then kill what ignores it; reap everything."""
    processes = list(processes)
    for p in processes:
        if p.is_alive():
            p.terminate()
            try:
                os.kill(p.pid, signal.SIGCONT)
            except (ProcessLookupError, TypeError):
                pass
    deadline = time.monotonic() + 5.0
    for p in processes:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()
