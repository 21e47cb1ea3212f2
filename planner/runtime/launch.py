"""``plan launch``: start every rank of a plan, watch them, stop them all if one fails.

Local: one process per device of the plan on this host (NCCL when there is a GPU for each, else gloo
on the CPU; ``emulate`` runs the plan's devices and network emulated, see ``emulation``). With a
hostfile: one ``torchrun`` per host (``dry_run`` prints the commands; otherwise hosts other than this
one are reached with ``ssh``). Either way, if any rank dies or raises, the others are stopped at once
and the launch fails naming the rank, its device and the error (a rank that stops answering is found
by its heartbeat, ``supervise``); no process is left behind, even when the launcher itself is killed
(``guard``). Before anything starts, ``preflight`` re-checks memory with the plan's own model,
refuses a GPU plan on a host without CUDA (``--backend gloo`` runs it on the CPU anyway, after saying
what an iteration will cost) and makes sure the results folder can take the results.
"""

import contextlib
import datetime
import functools
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from cost_models.schedule import Schedule
from planner.errors import InputError
from planner.runtime.graphs import COMPILE_CHOICES, calibration_disagrees, compiles, graphed_stages
from planner.runtime.guard import die_with_parent
from planner.runtime.hostfile import parse_hostfile, shell_line, torchrun_arguments
from planner.runtime.inputs import RunInputs, load_run_inputs
from planner.runtime.supervise import LaunchFailure, local_rank, stop_processes, watch

__all__ = ["LaunchOptions", "LaunchFailure", "launch", "auto_time_scale", "load_warning", "EMULATION_TARGET_S"]

EMULATION_TARGET_S = 2.0  # an emulated iteration is scaled to last about this long (seconds of this host)
_SLOW_FIRST_ITERATION_S = 60.0  # a CPU run whose first iteration is estimated longer gets the estimate said
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
    progress_s: float = 15.0  # local launches: every this many seconds, say what each rank is doing
    # torch.compile each block and the loss: "on", "off", "graphs" (compiled, every compiled stage's blocks
    # replayed as CUDA graphs on GPUs), "auto" (on with NCCL/CUDA, tensor-group stages as CUDA graphs:
    # ``planner.runtime.graphs``)
    compile: str = "auto"
    profile: bool = False  # each rank's operator table of the last measured iteration (planner.runtime.profile)
    checkpoint_every: int = 0  # 0: none; else save every this many iterations into checkpoint_dir
    checkpoint_dir: str | None = None
    resume: str | None = None  # a checkpoint folder (or the checkpoint_dir of a run) to continue from
    elastic: bool = False  # a rank that dies: re-plan without its device, resume from the last checkpoint
    # elastic: the re-plan's work budget (planner.search.deadline: the same seed and budget give the
    # same re-plan on a loaded host); the clock caps it at REPLAN_CLOCK_FACTOR times that
    replan_budget_s: float = 10.0
    slow: str = ""  # emulated straggler "DEVICE:FACTOR[@ITERATION]" (``planner.runtime.emulation.Slowdown``)

    def __post_init__(self):
        if self.compile not in COMPILE_CHOICES:
            raise ValueError(f"LaunchOptions.compile must be one of {', '.join(COMPILE_CHOICES)}, not {self.compile!r}")


def _compiled_on_devices(options: LaunchOptions) -> bool:
    """How the memory check counts the loss: as the ranks will run it on GPUs (NCCL: ``compiles``);
    compiled elsewhere (emulation, CPU runs with gloo), where no device's memory is at stake and a plan
    is checked as planned."""
    nccl = not options.emulate and (options.backend == "nccl" or (options.backend == "auto" and
                                                                  (bool(options.hostfile) or _gpus() > 0)))
    return compiles(options.compile, "nccl") if nccl else True


def auto_time_scale(inputs: RunInputs) -> float:
    """Scale so the emulated iteration lasts about ``EMULATION_TARGET_S`` seconds of this host."""
    from planner.prediction.predict import predict

    predicted = predict(inputs.plan, inputs.topology, inputs.model, inputs.training)[0].iteration_s
    return EMULATION_TARGET_S / predicted


def parse_slowdown(text: str):
    """``DEVICE:FACTOR[@ITERATION]`` as a ``Slowdown`` (None for ""); a mistake is one line."""
    from planner.runtime.emulation import Slowdown

    if not text:
        return None
    try:
        device, rest = text.rsplit(":", 1)
        factor, _, first = rest.partition("@")
        slowdown = Slowdown(device=device, factor=float(factor), first=int(first) if first else 1)
    except ValueError:
        raise InputError(f"{text!r} is not DEVICE:FACTOR or DEVICE:FACTOR@ITERATION (e.g. gpu-1:2.5@3)",
                         field="--slow") from None
    if not (device and 0 < slowdown.factor < 1000 and slowdown.first >= 1):
        raise InputError(f"{text!r}: needs a device, a factor in (0, 1000) and an iteration from 1", field="--slow")
    return slowdown


def _check(options: LaunchOptions) -> None:
    parse_slowdown(options.slow)
    if options.slow and not options.emulate:
        raise InputError("slows an emulated device: add --emulate", field="--slow")
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
    if options.checkpoint_every < 0:
        raise InputError(f"must be 0 (no checkpoints) or more, got {options.checkpoint_every}",
                         field="--checkpoint-every")
    if bool(options.checkpoint_every) != bool(options.checkpoint_dir):
        raise InputError("--checkpoint-every N and --checkpoint-dir DIR go together: pass both", field=(
            "--checkpoint-dir" if options.checkpoint_every else "--checkpoint-every"))
    if options.elastic and not options.checkpoint_every:
        raise InputError("resumes from the last checkpoint: add --checkpoint-every N --checkpoint-dir DIR",
                         field="--elastic")
    if options.hostfile and (options.checkpoint_every or options.resume):
        raise InputError("checkpoints are written and resumed by local launches only: drop --hostfile",
                         field="--checkpoint-every" if options.checkpoint_every else "--resume")


def launch(plan_path, options: LaunchOptions, *, log=print) -> dict | None:
    """Run ``plan_path``; returns the results document (None for a dry run).

    Input mistakes raise ``InputError`` before anything starts (and leave no folder behind); a failed
    rank raises ``LaunchFailure``. SIGTERM stops every rank and raises ``LaunchFailure``; SIGKILL of
    this process stops every rank too (see ``planner.runtime.guard``).
    """
    _check(options)
    import importlib.util

    if importlib.util.find_spec("torch") is None:  # the runtime's one optional dependency
        raise InputError("needs torch: pip install -e '.[runtime]'", field="plan launch") from None
    inputs = load_run_inputs(plan_path, options.topology)
    from planner.runtime.preflight import check_memory

    options = replace(options, resume=_check_resume(inputs, options) or None)  # the checkpoint folder itself
    slowdown = parse_slowdown(options.slow)
    if slowdown and not any(slowdown.device in inputs.plan.members(d) for d in inputs.plan.used_devices):
        raise InputError(f"{slowdown.device} is not a device the plan uses: name one of "
                         f"{', '.join(inputs.plan.used_devices)}", field="--slow")
    problem = check_memory(inputs, refuse=not options.emulate, compiled=_compiled_on_devices(options))
    if problem:
        log(f"warning: {problem}; emulated anyway (emulation does not hold the real memory)")
    with _stopped_by_sigterm():
        if options.hostfile:
            return _launch_hosts(inputs, options, log)
        if options.elastic:
            return _launch_elastic(inputs, options, log)
        return _launch_local(inputs, options, log)


ELASTIC_RESTARTS = 3  # an elastic launch re-plans at most this many times
REPLAN_CLOCK_FACTOR = 3.0  # an elastic re-plan's clock cap, in multiples of its work budget


def _launch_elastic(inputs: RunInputs, options: LaunchOptions, log) -> dict:
    """Run; when a rank dies, re-plan on the topology without its device (``planner.search.replan``),
    write the new topology and plan in ``OUT/elastic/``, resume from the last checkpoint under the new
    plan for the iterations left, and record each event in ``results.json`` under ``elastic``."""
    from planner.runtime.checkpoint import latest_checkpoint, read_checkpoint
    from planner.runtime.results import read_results, update_results

    resume = options.resume
    first = int(read_checkpoint(resume)[1]["iteration"]) if resume else 0
    total = first + options.warmup + options.iterations  # the iteration the run ends before
    events, current, segment = [], inputs, options
    while True:
        started = time.time()
        if events:
            events[-1]["restarted_after_s"] = started - events[-1].pop("_detected")
        try:
            results = _launch_local(current, segment, log)
            break
        except LaunchFailure as failure:
            detected = time.time()
            found = latest_checkpoint(options.checkpoint_dir) or (Path(resume) if resume else None)
            if failure.rank is None or len(events) >= ELASTIC_RESTARTS or found is None:
                why = ("no checkpoint to resume from yet" if found is None and failure.rank is not None else
                       f"{ELASTIC_RESTARTS} restarts already" if failure.rank is not None else "")
                raise LaunchFailure(f"{failure}" + (f"; not restarted: {why}" if why else ""),
                                    rank=failure.rank) from None
            device = _rank_devices(current.plan)[failure.rank]
            _, checkpoint = read_checkpoint(found)
            done = int(checkpoint["iteration"])
            log(f"elastic: {failure}; re-planning without {device}, resuming from iteration {done}")
            replan_started = time.time()
            current, replanned, files = _replan_without(current, device, len(events) + 1, options)
            events.append({
                "failed_rank": failure.rank, "device": device, "failure": str(failure),
                "detected_after_s": detected - started, "checkpoint": str(found), "checkpoint_iteration": done,
                "lost_s": detected - float(checkpoint.get("written_at_unix_s", detected)),
                "replan_s": time.time() - replan_started, **files, "chosen": replanned.chosen, "why": replanned.why,
                "moves": {"bytes": replanned.moves.bytes, "seconds": replanned.moves.seconds,
                          "checkpoint_bytes": replanned.moves.checkpoint_bytes},
                "new_plan": {"stages": replanned.plan.stages, "replicas": replanned.plan.replicas,
                             "layer_bounds": list(replanned.plan.layer_bounds),
                             "assignment": [list(row) for row in replanned.plan.assignment],
                             "predicted_iteration_s": replanned.plan.prediction.iteration_s},
                "_detected": detected})
            log(f"elastic: {replanned.chosen} ({replanned.plan.replicas} replica(s) x {replanned.plan.stages} "
                f"stage(s)); {replanned.why}")
            if total - done < 1:
                raise LaunchFailure(f"{failure}; the last checkpoint is after the last iteration: nothing is left "
                                    "to run", rank=failure.rank) from None
            warmup = max(0, options.warmup - (done - first))
            resume = str(found)
            segment = replace(options, warmup=warmup, iterations=max(total - done - warmup, 1), resume=resume)
    if events:
        update_results(options.out_dir, "elastic", {"events": events, "first_iteration": first, "end_iteration": total,
                                                    "final_plan": current.plan_path})
        results = read_results(options.out_dir)
    return results


def _replan_without(inputs: RunInputs, device: str, index: int, options: LaunchOptions) -> tuple:
    """(the run inputs of the re-plan without ``device``, the re-plan, the files written): the
    topology without it and the plan, ``OUT/elastic/topology-K.yaml`` and ``plan-K.yaml``."""
    from planner.io import read_yaml, write_document
    from planner.plan.document import plan_to_document, write_plan
    from planner.search.front import SearchOptions
    from planner.search.replan import replan, topology_without
    from planner.inputs.calibration import replan_calibration
    from planner.inputs.job import load_topology

    folder = Path(options.out_dir).resolve() / "elastic"
    folder.mkdir(parents=True, exist_ok=True)
    topology_path, plan_path = folder / f"topology-{index}.yaml", folder / f"plan-{index}.yaml"
    write_document(topology_without(read_yaml(inputs.topology_path), [device]), topology_path)
    # Scored on the devices the old plan was calibrated on, as the command-line re-plan does.
    topology, record = replan_calibration(load_topology(topology_path), inputs.plan.calibration, inputs.plan_path)
    result = replan(inputs.plan, topology, inputs.model, inputs.training,
                    SearchOptions(seed=options.seed, budget_s=options.replan_budget_s,
                                  time_limit_s=REPLAN_CLOCK_FACTOR * options.replan_budget_s,
                                  tensor_degrees=(1,)))  # the runtime needs one degree per stage: none
    result = replace(result, plan=replace(result.plan, calibration=record))
    write_plan(plan_to_document(result.plan, model=inputs.model, training=result.training,
                                topology_source=str(topology_path)), plan_path)
    return load_run_inputs(plan_path), result, {"topology": str(topology_path), "plan": str(plan_path)}


def _check_resume(inputs: RunInputs, options: LaunchOptions) -> str:
    """The checkpoint folder a resumed run loads ("" without --resume), after refusing one of another
    model, global batch, optimizer or seed; the checkpoint folder must take a checkpoint."""
    from planner.runtime.checkpoint import check_resumable, read_checkpoint
    from planner.runtime.inputs import emulated_model

    executed = emulated_model(inputs.model, inputs.plan.degrees.tensor) if options.emulate else inputs.model
    if options.checkpoint_dir:
        from planner.runtime.preflight import prepare_out_folder

        prepare_out_folder(options.checkpoint_dir, _checkpoint_bytes(inputs, executed), field="--checkpoint-dir")
    if not options.resume:
        return ""
    folder, document = read_checkpoint(options.resume)
    check_resumable(document, str(folder / "checkpoint.json"), model=executed, training=inputs.training,
                    seed=options.seed)
    return str(folder)


def _checkpoint_bytes(inputs: RunInputs, executed) -> int:
    """Space one checkpoint takes: fp32 weights and optimizer state of the model the run executes,
    and with PowerSGD each replica's fp32 error memory (at most one value per parameter)."""
    from planner.prediction.stage_model import layer_costs, stage_parameters
    import numpy as np

    plan = inputs.plan
    costs = layer_costs(executed, inputs.training, plan.micro_batch_size, plan.stages)
    counts = np.diff(plan.stage_bounds)
    parameters = sum(float(stage_parameters(costs, counts[s], s)) for s in range(plan.stages))
    per_parameter = 4 * (1 + (2 if inputs.training.optimizer == "adam" else 1))
    if plan.compression.gradients == "powersgd" and plan.replicas > 1:
        per_parameter += 4 * plan.replicas
    return int(parameters * per_parameter)


class _Terminated(BaseException):
    """SIGTERM arrived: unwinds the launcher so that every rank is stopped on the way out."""


@contextlib.contextmanager
def _stopped_by_sigterm():
    """SIGTERM unwinds the launch (stopping every rank) instead of ending the process on the spot."""
    def handler(signum, frame):
        raise _Terminated()

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: the guards still stop the ranks if this process dies
        yield
        return
    try:
        yield
    except _Terminated:
        raise LaunchFailure("the launcher got SIGTERM; every rank was stopped") from None
    finally:
        signal.signal(signal.SIGTERM, previous)


def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _backend(options: LaunchOptions, world: int, gpus: int) -> tuple:
    """(backend, CUDA indices per rank or ())."""
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


def load_warning(load: float, cores: int) -> str | None:
    """A warning where this host is busier than its cores (``load``: the 1-minute load average):
    emulated ranks then wait for the CPU, and the measured times run long of the plan's."""
    if load <= cores:
        return None
    return (f"warning: this host's load ({load:.1f} over the last minute) exceeds its {cores} core(s): the emulated "
            "ranks will wait for the CPU and measure long; emulate on an idle host to compare with the prediction")


def _say_what_it_costs(inputs: RunInputs, backend: str, log) -> None:
    """Before a CPU run of a full-size model: the first iteration's estimated time on this host."""
    from planner.runtime.preflight import cpu_flops, first_iteration_estimate, format_duration

    if backend != "gloo":
        return
    flops = cpu_flops()
    estimate = first_iteration_estimate(inputs, flops)
    log(f"training the full {inputs.model.name} on this CPU: at least {format_duration(estimate)} per iteration "
        f"(its model FLOPs at this CPU's {flops / 1e9:.0f} GFLOP/s of matrix products)"
        + (" - Ctrl-C stops it; --emulate runs the plan's devices emulated" if estimate > _SLOW_FIRST_ITERATION_S
           else ""))


def _launch_local(inputs: RunInputs, options: LaunchOptions, log) -> dict:
    import torch.distributed as dist

    from planner.runtime.emulation import resource_slots
    from planner.runtime.preflight import check_devices_present, prepare_out_folder, results_bytes
    from planner.runtime.results import read_results

    plan = inputs.plan
    world = len(plan.used_devices)  # one rank per device, tensor groups' members included
    gpus = _gpus()
    if not options.emulate:
        check_devices_present(inputs, options.backend, gpus)
    backend, cuda_devices = _backend(options, world, gpus)
    scale = 1.0
    if options.emulate:
        scale = options.time_scale if options.time_scale is not None else auto_time_scale(inputs)
    slowdown = parse_slowdown(options.slow)
    config = dict(plan_path=inputs.plan_path, topology_path=inputs.topology_path, out_dir=options.out_dir,
                  iterations=options.iterations, warmup=options.warmup, seed=options.seed,
                  learning_rate=options.learning_rate, timeout_s=options.timeout_s,
                  emulate=options.emulate, time_scale=scale, backend=backend,
                  threads=max(1, (os.cpu_count() or 1) // world) if backend == "gloo" else 4,
                  compile=compiles(options.compile, backend), graphs=graphed_stages(options.compile, backend).value,
                  save_state=options.save_state, cuda_devices=cuda_devices,
                  checkpoint_every=options.checkpoint_every, checkpoint_dir=options.checkpoint_dir or "",
                  resume_from=options.resume or "", profile=options.profile,
                  slow=(slowdown.device, slowdown.factor, slowdown.first) if slowdown else ())
    prepare_out_folder(options.out_dir, results_bytes(inputs, options.iterations, options.warmup,
                                                      options.save_state))
    if not options.emulate:
        _say_calibration_disagrees(inputs, options, backend, log)
    names = _rank_names(plan)
    mode = f"emulated at time scale {scale:.4g}" if options.emulate else backend
    groups = f" x tensor groups of up to {plan.degrees.tensor}" if plan.tensor_groups else ""
    log(f"launching {world} ranks ({plan.replicas} replica(s) x {plan.stages} stage(s){groups}, {mode}), "
        f"{options.warmup} warm-up + {options.iterations} measured iterations")
    if options.resume:
        log(f"resuming from {options.resume}")
    if not options.emulate:
        _say_what_it_costs(inputs, backend, log)
    elif hasattr(os, "getloadavg"):
        busy = load_warning(os.getloadavg()[0], os.cpu_count() or 1)
        if busy:
            log(busy)
    store = dist.TCPStore("127.0.0.1", 0, world + 1, True, timeout=datetime.timedelta(seconds=options.timeout_s),
                          wait_for_workers=False)
    context = multiprocessing.get_context("spawn")
    shared = None
    if options.emulate:
        shared = context.Array("d", resource_slots(inputs.topology.size, len(inputs.topology.hosts)))
    heartbeats = context.Array("d", 2 * world, lock=False)
    errors = context.Queue()
    processes = {rank: context.Process(target=local_rank, name=f"rank{rank}",
                                       args=(rank, world, config, store.port, shared, errors, heartbeats,
                                             os.getpid()))
                 for rank in range(world)}
    started = time.monotonic()
    try:
        for process in processes.values():
            process.start()
        watch(processes, errors, names, heartbeats, timeout_s=options.timeout_s, log=log, started_s=started,
              progress_s=options.progress_s)
    finally:
        stop_processes(processes.values())
    if not os.path.exists(os.path.join(options.out_dir, "results.json")):
        raise LaunchFailure(f"every rank exited but rank 0 wrote no results in {options.out_dir}")
    if options.emulate:
        _record_overrun(inputs, options.out_dir, scale, log, slowdown, options.warmup)
    results = read_results(options.out_dir)
    _say_straggler(results, log)
    return results


def _say_calibration_disagrees(inputs: RunInputs, options: LaunchOptions, backend: str, log) -> None:
    """A warning where the plan's calibration timed the blocks otherwise than this launch runs them
    (``--compile``: eager, compiled, CUDA graphs): the prediction is then another run's."""
    calibration = inputs.calibration
    if calibration is None:
        return
    plan = inputs.plan
    used_types = {d.type_name for d in inputs.topology.devices if d.name in set(plan.used_devices)}
    degrees = tuple(plan.tensor_degree(0, s) for s in range(plan.stages))
    problem = calibration_disagrees(calibration.device_types, used_types, degrees, compiles(options.compile, backend),
                                    graphed_stages(options.compile, backend),
                                    zero_bubble=plan.schedule == Schedule.ZERO_BUBBLE,
                                    virtual_stages=plan.virtual_stages)
    if problem:
        log(f"warning: {calibration.path} {problem} (--compile {options.compile}): the plan's predicted time "
            f"describes the calibrated run; calibrate with 'plan calibrate --compile {options.compile}' to compare")


def _say_straggler(results: dict, log) -> None:
    """The straggler the run's measurements name (``planner.runtime.straggler``), and whether an
    emulated one was found; nothing when neither."""
    found = results.get("straggler") or {}
    emulated = results.get("emulation", {}).get("slowdown")
    if found.get("device") or emulated:
        log(found["summary"])
    overrun = results.get("emulation", {}).get("compute_overrun") or {}
    if found.get("device") and not emulated and overrun.get("warning"):
        log(f"this host also overran the plan's compute times (above), which can make a worker look slow: rerun "
            f"with --time-scale {overrun['suggested_time_scale']:.3g} before re-planning around {found['device']}")
    if emulated and not emulated["detected"]:
        log(f"the emulated straggler {emulated['device']} ({emulated['factor']:g}x from iteration "
            f"{emulated['from_iteration']}) was not found in the measurements"
            + (": it started after the run's last iteration" if emulated["after_last_iteration"] else ""))


def _record_overrun(inputs: RunInputs, out_dir, scale: float, log, slowdown=None, warmup: int = 0) -> None:
    """Compare the emulated compute ops with the plan's (the slowed device's, from the emulated
    straggler's first iteration on); warn and record when the host overran them. With an emulated
    straggler, record what was emulated and whether the measurements named it (``results.straggler``)."""
    from planner.prediction.predict import build_pipeline_job
    from planner.runtime.emulation import compute_overrun, slowed_job
    from planner.runtime.results import read_results, update_results
    from planner.runtime.straggler import device_index_in_job

    results = read_results(out_dir)
    job = build_pipeline_job(inputs.plan, inputs.topology, inputs.model, inputs.training)
    record = {}
    if slowdown is not None:
        found = results.get("straggler") or {}
        measured = len(results["measured"]["iteration_s"])
        record["slowdown"] = {"device": slowdown.device, "factor": slowdown.factor, "from_iteration": slowdown.first,
                              "detected": slowdown.device in (found.get("members") or ()),
                              "after_last_iteration": slowdown.first > warmup + measured}
        if warmup + results["measured"]["median_iteration"] + 1 >= slowdown.first:  # the trace compared below
            job = slowed_job(job, device_index_in_job(inputs.plan, job, slowdown.device), slowdown.factor)
    overrun = compute_overrun(results["measured"]["trace"], job, scale, results["comparison"]["predicted_s"],
                              names=_rank_names(inputs.plan))
    if overrun["warning"]:
        log(f"warning: {overrun['warning']}")
    update_results(out_dir, "emulation", {"compute_overrun": overrun, **record})


def _rank_devices(plan) -> dict:
    """Rank -> plan device (``planner.runtime.engine.Layout``)."""
    from planner.runtime.engine import Layout

    return {rank: name for name, rank in Layout.of_plan(plan).device_ranks(plan).items()}


def _rank_names(plan) -> dict:
    from planner.runtime.engine import Layout

    layout = Layout.of_plan(plan)
    names = {}
    for rank, name in sorted(_rank_devices(plan).items()):
        r, s, k = layout.place(rank)
        names[rank] = f"rank {rank} (device {name}, replica {r}, stage {s}" + (f", member {k})" if
                                                                               layout.degree(s) > 1 else ")")
    return names


def _launch_hosts(inputs: RunInputs, options: LaunchOptions, log) -> dict | None:
    entries = parse_hostfile(options.hostfile, inputs.plan, inputs.topology)
    backend = "nccl" if options.backend == "auto" else options.backend
    _say_calibration_disagrees(inputs, options, backend, log)
    commands = [["torchrun"] + torchrun_arguments(
        entries, node, plan_path=inputs.plan_path, topology_path=inputs.topology_path, out_dir=options.out_dir,
        iterations=options.iterations, warmup=options.warmup, seed=options.seed,
        learning_rate=options.learning_rate, timeout_s=options.timeout_s, backend=backend,
        master_port=options.master_port, compile=compiles(options.compile, backend),
        graphs=graphed_stages(options.compile, backend).value, profile=options.profile)
        for node in range(len(entries))]
    if options.dry_run:
        for entry, command in zip(entries, commands):
            log(f"# on {entry.address} ({len(entry.devices)} process(es): {', '.join(entry.devices)})")
            log(shell_line(command))
        return None
    local = _LOCAL_NAMES | {socket.gethostname(), socket.getfqdn()}
    if entries[0].host in local:  # rank 0 writes the results here: check the folder before starting
        from planner.runtime.preflight import prepare_out_folder, results_bytes

        prepare_out_folder(options.out_dir, results_bytes(inputs, options.iterations, options.warmup, False))
    # In each child between fork and exec: SIGTERM when this launcher dies (guard and ssh exit cleanly on it).
    parent_death = functools.partial(die_with_parent, os.getpid(), signal.SIGTERM)
    started = []
    try:
        for entry, command in zip(entries, commands):
            # Each torchrun runs under a guard that stops its tree when this launcher dies (parent-death
            # signal here, end of the stdin pipe this process holds, there and across ssh).
            if entry.host in local:
                argv = [sys.executable, "-m", "planner.runtime.guard", "--stdin", "--parent", str(os.getpid()),
                        "--", sys.executable, "-m", "torch.distributed.run"] + command[1:]
            else:
                guarded = ["python3", "-m", "planner.runtime.guard", "--stdin", "--"] + command
                remote = f"cd {shell_line([os.getcwd()])} && exec {shell_line(guarded)}"
                argv = ["ssh", "-o", "BatchMode=yes", "--", entry.ssh_target, remote]
            log(f"starting on {entry.address}: {shell_line(command)}")
            started.append((entry, subprocess.Popen(argv, stdin=subprocess.PIPE, start_new_session=True,
                                                    preexec_fn=parent_death)))
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
            process.stdin.close()  # the guard's signal to stop
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
        results = read_results(options.out_dir)
        _say_straggler(results, log)
        return results
    log(f"results were written by rank 0 on {entries[0].address} in {options.out_dir}")
    return None
