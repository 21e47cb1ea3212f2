"""``plan launch``: start every rank of a plan, watch them, stop them all if one fails.

Local: one process per device of the plan on this host (NCCL when there is a GPU for each, else gloo
on the CPU; ``emulate`` runs the plan's devices and network emulated, see ``emulation``). With a
hostfile: one ``torchrun`` per host (``dry_run`` prints the commands; otherwise hosts other than this
one are reached with ``ssh``). Either way, if any rank dies or raises, the others are stopped at once
and the launch fails naming the rank, its device and the error; no process is left behind.
"""

import datetime
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

from planner.errors import InputError
from planner.runtime.hostfile import parse_hostfile, shell_line, torchrun_arguments
from planner.runtime.inputs import RUNTIME_PRECISIONS, RunInputs, load_run_inputs

__all__ = ["LaunchOptions", "LaunchFailure", "launch", "auto_time_scale", "EMULATION_TARGET_S"]

EMULATION_TARGET_S = 2.0  # an emulated iteration is scaled to last about this long (seconds of this host)
_GRACE_S = 1.0  # after a failure, how long to collect the other ranks' reports before stopping them
_LOCAL_NAMES = {"localhost", "127.0.0.1", "::1"}


@dataclass(frozen=True, kw_only=True)
class LaunchOptions:
    iterations: int = 10
    warmup: int = 2
    out_dir: str = "runs/latest"
    emulate: bool = False
    time_scale: float | None = None  # None: EMULATION_TARGET_S / predicted iteration
    seed: int = 0
    learning_rate: float = 1e-3
    timeout_s: float = 120.0
    backend: str = "auto"
    topology: str | None = None
    hostfile: str | None = None
    dry_run: bool = False
    master_port: int = 29500
    save_state: bool = False


class LaunchFailure(RuntimeError):
    """A rank died or raised; the message names it."""


def auto_time_scale(inputs: RunInputs) -> float:
    """Scale so the emulated iteration lasts about ``EMULATION_TARGET_S`` seconds of this host."""
    from planner.prediction.predict import predict

    predicted = predict(inputs.plan, inputs.topology, inputs.model, inputs.training)[0].iteration_s
    return EMULATION_TARGET_S / predicted


def _check(options: LaunchOptions) -> None:
    if options.iterations < 1:
        raise InputError(f"must be at least 1, got {options.iterations}", field="--iterations")
    if options.warmup < 0:
        raise InputError(f"must be 0 or more, got {options.warmup}", field="--warmup")
    if options.timeout_s <= 0:
        raise InputError(f"must be positive, got {options.timeout_s}", field="--timeout")
    if options.time_scale is not None and not 0 < options.time_scale <= 1000:
        raise InputError(f"must be in (0, 1000], got {options.time_scale}", field="--time-scale")
    if options.time_scale is not None and not options.emulate:
        raise InputError("only applies to emulated runs: add --emulate or drop it", field="--time-scale")
    if options.hostfile and options.emulate:
        raise InputError("emulation runs on one host: drop --hostfile or --emulate", field="--emulate")
    if options.dry_run and not options.hostfile:
        raise InputError("prints the torchrun command of each host: pass --hostfile FILE", field="--dry-run")


def launch(plan_path, options: LaunchOptions, *, log=print) -> dict | None:
    """Run ``plan_path``; returns the results document (None for a dry run).

    Input mistakes raise ``InputError`` before anything starts; a failed rank raises ``LaunchFailure``.
    """
    _check(options)
    import importlib.util

    if importlib.util.find_spec("torch") is None:  # the runtime's one optional dependency
        raise InputError("needs torch: pip install -e '.[runtime]'", field="plan launch") from None
    inputs = load_run_inputs(plan_path, options.topology)
    if not options.emulate and inputs.training.precision not in RUNTIME_PRECISIONS:
        raise InputError(f"the runtime trains in {' or '.join(RUNTIME_PRECISIONS)}, not {inputs.training.precision}: "
                         "plan again with precision bf16, or --emulate", source=inputs.plan_path,
                         field="training.precision")
    if options.hostfile:
        return _launch_hosts(inputs, options, log)
    return _launch_local(inputs, options, log)


def _backend(options: LaunchOptions, world: int) -> tuple:
    """(backend, CUDA indices per rank or ())."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    choice = options.backend
    if options.emulate:
        if choice == "nccl":
            raise InputError("emulation runs on the CPU with gloo: drop --backend nccl", field="--backend")
        return "gloo", ()
    if choice == "auto":
        choice = "nccl" if gpus else "gloo"
    if choice == "nccl":
        if gpus < world:
            raise InputError(f"the plan runs {world} workers but this host has {gpus} GPU(s): use --emulate, "
                             "--backend gloo (CPU) or a hostfile", field="--backend")
        return "nccl", tuple(range(world))
    return "gloo", ()


def _launch_local(inputs: RunInputs, options: LaunchOptions, log) -> dict:
    import torch.distributed as dist

    from planner.runtime.emulation import resource_slots
    from planner.runtime.results import read_results
    from planner.runtime.worker import WorkerConfig, run_local_worker

    plan = inputs.plan
    world = plan.stages * plan.replicas
    backend, cuda_devices = _backend(options, world)
    scale = 1.0
    if options.emulate:
        scale = options.time_scale if options.time_scale is not None else auto_time_scale(inputs)
    config = WorkerConfig(plan_path=inputs.plan_path, topology_path=inputs.topology_path, out_dir=options.out_dir,
                          iterations=options.iterations, warmup=options.warmup, seed=options.seed,
                          learning_rate=options.learning_rate, timeout_s=options.timeout_s,
                          emulate=options.emulate, time_scale=scale, backend=backend,
                          threads=max(1, (os.cpu_count() or 1) // world) if backend == "gloo" else 4,
                          save_state=options.save_state, cuda_devices=cuda_devices)
    os.makedirs(options.out_dir, exist_ok=True)
    names = _rank_names(plan)
    mode = f"emulated at time scale {scale:.4g}" if options.emulate else backend
    log(f"launching {world} ranks ({plan.replicas} replica(s) x {plan.stages} stage(s), {mode}), "
        f"{options.warmup} warm-up + {options.iterations} measured iterations")
    store = dist.TCPStore("127.0.0.1", 0, world + 1, True, timeout=datetime.timedelta(seconds=options.timeout_s),
                          wait_for_workers=False)
    context = multiprocessing.get_context("spawn")
    shared = None
    if options.emulate:
        shared = context.Array("d", resource_slots(inputs.topology.size, len(inputs.topology.hosts)))
    errors = context.Queue()
    processes = {rank: context.Process(target=run_local_worker, name=f"rank{rank}",
                                       args=(rank, world, config, store.port, shared, errors))
                 for rank in range(world)}
    for process in processes.values():
        process.start()
    try:
        _watch(processes, errors, names)
    finally:
        _stop(processes.values())
    if not os.path.exists(os.path.join(options.out_dir, "results.json")):
        raise LaunchFailure(f"every rank exited but rank 0 wrote no results in {options.out_dir}")
    return read_results(options.out_dir)


def _rank_names(plan) -> dict:
    return {r * plan.stages + s: f"rank {r * plan.stages + s} (device {name}, replica {r}, stage {s})"
            for r, row in enumerate(plan.assignment) for s, name in enumerate(row)}


def _watch(processes: dict, errors, names: dict) -> None:
    """Wait for every rank; on the first failure collect reports briefly, then raise ``LaunchFailure``."""
    alive = dict(processes)
    while alive:
        multiprocessing.connection.wait([p.sentinel for p in alive.values()], timeout=1.0)
        codes = {r: p.exitcode for r, p in alive.items()}  # read once: a rank may exit meanwhile
        failed = [r for r, code in codes.items() if code not in (None, 0)]
        for rank in [r for r, code in codes.items() if code is not None]:
            del alive[rank]
        if failed:
            deadline = time.monotonic() + _GRACE_S
            while time.monotonic() < deadline:
                time.sleep(0.05)
            raise LaunchFailure(_failure_message(processes, errors, names))


def _failure_message(processes: dict, errors, names: dict) -> str:
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
        return f"{names[rank]} was killed by {signame}; the other ranks were stopped"
    secondary = ("connection", "closed", "timed out", "timeout", "peer", "broken pipe")
    causes = [r for r, text in reported.items() if not any(word in text.lower() for word in secondary)]
    rank = (causes or sorted(reported) or [r for r, p in processes.items() if p.exitcode not in (None, 0)])[0]
    text = reported.get(rank, f"exited with code {processes[rank].exitcode}")
    return f"{names[rank]} failed: {text}; the other ranks were stopped"


def _stop(processes) -> None:
    """Terminate what still runs, then kill what ignores it; reap everything."""
    processes = list(processes)
    for p in processes:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 5.0
    for p in processes:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def _launch_hosts(inputs: RunInputs, options: LaunchOptions, log) -> dict | None:
    entries = parse_hostfile(options.hostfile, inputs.plan, inputs.topology)
    backend = "nccl" if options.backend == "auto" else options.backend
    commands = [["torchrun"] + torchrun_arguments(
        entries, node, plan_path=inputs.plan_path, topology_path=inputs.topology_path, out_dir=options.out_dir,
        iterations=options.iterations, warmup=options.warmup, seed=options.seed,
        learning_rate=options.learning_rate, timeout_s=options.timeout_s, backend=backend,
        master_port=options.master_port) for node in range(len(entries))]
    if options.dry_run:
        for entry, command in zip(entries, commands):
            log(f"# on {entry.address} ({len(entry.devices)} process(es): {', '.join(entry.devices)})")
            log(shell_line(command))
        return None
    local = _LOCAL_NAMES | {socket.gethostname(), socket.getfqdn()}
    started = []
    for entry, command in zip(entries, commands):
        if entry.address in local:
            argv = [sys.executable, "-m", "torch.distributed.run"] + command[1:]
        else:
            remote = f"cd {shell_line([os.getcwd()])} && {shell_line(command)}"
            argv = ["ssh", "-o", "BatchMode=yes", entry.address, remote]
        log(f"starting on {entry.address}: {shell_line(command)}")
        started.append((entry, subprocess.Popen(argv, start_new_session=True)))
    try:
        while started:
            for entry, process in list(started):
                code = process.poll()
                if code is None:
                    continue
                started.remove((entry, process))
                if code != 0:
                    raise LaunchFailure(f"host {entry.address} ({', '.join(entry.devices)}) exited with code {code}; "
                                        "the other hosts were stopped")
            time.sleep(0.2)
    finally:
        for _, process in started:
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for _, process in started:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    from planner.runtime.results import read_results

    if os.path.exists(os.path.join(options.out_dir, "results.json")):
        return read_results(options.out_dir)
    log(f"results were written by rank 0 on {entries[0].address} in {options.out_dir}")
    return None
