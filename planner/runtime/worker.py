"""One process of a launch: join the group under its logical rank, build its stage, train, report.

Started by ``plan launch`` (local processes, rendezvous on a store the launcher made) or by
``torchrun`` on each host of a hostfile (``python -m planner.runtime.worker ...``; torchrun's agent
store lets every worker pick its logical rank). Rank 0 gathers every rank's report and writes the
results file.
"""

import argparse
import ctypes
import datetime
import os
import platform
import signal
import socket
import sys
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from cost_models.schedule import Schedule
from planner.prediction.predict import build_pipeline_job, model_flops_per_iteration, predict
from planner.prediction.stage_model import optimizer_shards
from planner.plan.document import plan_to_document
from planner.plan.recompute import plan_modes
from planner.plan.sync_groups import outer_weights
from planner.runtime.checkpoint import checkpoint_due, checkpoint_meta, save_checkpoint
from planner.runtime.emulation import Emulator, SharedResources, now_s, slowed_job
from planner.runtime.engine import Layout, StageExecutor, make_groups, split_parameters
from planner.runtime.gpt import ChunkedStage, build_stage, compile_split_stage, compile_stage, lm_loss
from planner.runtime.inputs import RunInputs, emulated_model, load_run_inputs
from planner.runtime.graphs import Graphed, receives_input, release_graphs, stage_graphed
from planner.runtime.gradient_sync import route_matters, sync_route
from planner.runtime.local_steps import LocalSteps, master_copies
from planner.runtime.optimizer import make_optimizer
from planner.runtime.precision import runtime_dtype
from planner.runtime.profile import profiled
from planner.runtime.results import RESULTS_FORMAT, chrome_trace, comparison, summarise_iterations, write_results
from planner.runtime.straggler import device_index_in_job, straggler_report
from planner.runtime.tensor_parallel import broadcast_whole, follow_lead, full_state, shard_stage

__all__ = ["WorkerConfig", "run_local_worker", "main"]

_PREDICTED_TRACE_LIMIT = 20_000  # records kept in results.json (larger plans keep only the Chrome trace)


@dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    plan_path: str
    topology_path: str
    out_dir: str
    iterations: int = 10
    warmup: int = 2
    seed: int = 0
    learning_rate: float = 1e-3
    timeout_s: float = 120.0
    emulate: bool = False
    time_scale: float = 1.0
    backend: str = "gloo"
    threads: int = 1
    save_state: bool = False
    cuda_devices: tuple = field(default=())  # rank -> CUDA index, for local launches
    compile: bool = False  # torch.compile each block and the loss (planner.runtime.gpt.compile_stage)
    graphs: str = Graphed.NONE.value  # compiled stages replayed as CUDA graphs (planner.runtime.graphs)
    checkpoint_every: int = 0  # 0: no checkpoints; else every this many iterations into checkpoint_dir
    checkpoint_dir: str = ""
    resume_from: str = ""  # a checkpoint folder (``checkpoint.read_checkpoint``) to start from
    slow: tuple = ()  # emulated straggler: (device, factor, first iteration, 1-based) or ()
    profile: bool = False  # the last measured iteration under torch.profiler (planner.runtime.profile)


def _die_with_parent() -> None:
    """Ask Linux to kill this process if the launcher dies, so no rank is ever orphaned."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass


def run_local_worker(rank: int, world: int, config: WorkerConfig, store_port: int, shared, errors) -> None:
    """Entry point of a locally spawned rank; any failure is reported on ``errors`` and exits non-zero."""
    _die_with_parent()
    try:
        store = dist.TCPStore("127.0.0.1", store_port, world, False,
                              timeout=datetime.timedelta(seconds=config.timeout_s))
        device_index = config.cuda_devices[rank] if config.cuda_devices else None
        _train(rank, world, config, {"store": store}, device_index, shared)
    except BaseException as error:  # report, then exit non-zero: the launcher names the rank
        if errors is not None:
            errors.put((rank, _describe(error)))
        raise SystemExit(1) from None


def _describe(error: BaseException) -> str:
    frames = traceback.extract_tb(error.__traceback__)
    where = f" ({os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}{where}"


def _train(rank: int, world: int, config: WorkerConfig, rendezvous: dict, device_index, shared) -> None:
    inputs: RunInputs = load_run_inputs(config.plan_path, config.topology_path)
    plan = inputs.plan
    layout = Layout.of_plan(plan)
    if layout.world != world:
        raise RuntimeError(f"the plan has {layout.world} workers but {world} processes were started")
    replica, stage, member = layout.place(rank)
    torch.set_num_threads(config.threads)
    if config.backend == "nccl":
        torch.cuda.set_device(device_index)
        device = torch.device("cuda", device_index)
    else:
        device = torch.device("cpu")
    dist.init_process_group(config.backend, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=config.timeout_s), **rendezvous)
    try:
        _run(rank, config, inputs, layout, replica, stage, device, shared, member)
    finally:
        try:  # a failing release (a sticky CUDA error) neither hides the rank's error nor skips the destroy
            if device.type == "cuda" and config.graphs != Graphed.NONE.value:
                release_graphs(device)
        finally:
            dist.destroy_process_group()



def _run(rank, config: WorkerConfig, inputs: RunInputs, layout, replica, stage, device, shared, member=0) -> None:
    plan, model, training = inputs.plan, inputs.model, inputs.training
    executed = emulated_model(model, plan.degrees.tensor) if config.emulate else model
    local = plan.sync_every > 1 and layout.replicas > 1  # local steps: the outer step every sync_every iterations
    groups = make_groups(layout, stage, executed.tied_embeddings, local_steps=local,
                         sync_groups=plan.sync_groups if local else ())
    recompute = plan_modes(plan, training)[replica][stage]  # this worker's mode, every chunk of it
    chunks = [build_stage(executed, first, end, seed=config.seed, recompute=recompute)
              for first, end in plan.chunk_layers(stage)]
    module = chunks[0] if len(chunks) == 1 else ChunkedStage(chunks)  # interleaved 1F1B: v chunks
    degree = layout.degree(stage)
    if degree > 1:  # this member's share of every block (planner.runtime.tensor_parallel)
        shard_stage(module, groups.tensor, member, degree)
        if member:
            follow_lead(module)
    # 16-bit weights with fp32 master weights on GPUs (as the memory model counts); fp32 on the CPU.
    dtype = runtime_dtype(training.precision, device)
    module = module.to(device=device, dtype=dtype)
    own, _ = split_parameters(module, layout.stages)
    shard = optimizer_shards(training, layout.replicas) > 1  # the cost model's rule
    trained = [p for p in module.parameters() if not getattr(p, "follows_lead", False)]
    optimizer = make_optimizer(trained, training.optimizer, config.learning_rate, dtype, device,
                               sharded=own if shard else (), shard_group=groups.stage)
    first, resumed = 0, None  # the iteration to run first (the data of iteration i is fixed by i)
    if config.resume_from:
        from planner.runtime.checkpoint import load_checkpoint, read_checkpoint

        folder, resumed = read_checkpoint(config.resume_from)
        first = load_checkpoint(folder, resumed, module=module, optimizer=optimizer,
                                tensor=(member, degree) if degree > 1 else None)
    # The snapshot is taken from the weights trained from (a resumed run's outer momentum starts at zero).
    local_steps = LocalSteps(trained, sync_every=plan.sync_every, momentum=training.outer_momentum,
                             learning_rate=training.outer_learning_rate, group=groups.outer, replicas=layout.replicas,
                             masters=master_copies(optimizer), weight=_outer_weight(plan, replica),
                             within=groups.sync_group if len(plan.sync_groups) > 1 else None,
                             source=groups.sync_lead) if local else None
    emulator = None
    if config.emulate:
        job = build_pipeline_job(plan, inputs.topology, model, training)
        resources = SharedResources(shared, inputs.topology.size, len(inputs.topology.hosts))
        slow = (None, 1)
        if config.slow:
            name, factor, first_slow = config.slow
            slow = (slowed_job(job, device_index_in_job(plan, job, name), factor), first_slow)
        emulator = Emulator(job, resources, time_scale=config.time_scale, replica=replica, stage=stage, slow=slow)
    loss = lm_loss
    zero_bubble = plan.schedule == Schedule.ZERO_BUBBLE
    graphed = config.compile and stage_graphed(config.graphs, degree, zero_bubble=zero_bubble,
                                               cuda=device.type == "cuda",
                                               receives=receives_input(stage, plan.virtual_stages))
    if config.compile:  # a split backward (ZB-H1): its linear layers as an op the compiler keeps whole
        loss = compile_split_stage(module) if zero_bubble else compile_stage(module, graphs=graphed)
    executor = StageExecutor(module=module, optimizer=optimizer, plan=plan, layout=layout, replica=replica,
                             stage=stage, device=device, groups=groups, seed=config.seed,
                             dtype=dtype, emulator=emulator, loss=loss, member=member, graphed=graphed)
    barrier = (lambda: dist.barrier(device_ids=[device.index])) if device.type == "cuda" else dist.barrier
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    total = config.warmup + config.iterations
    executor.local_steps = local_steps
    route = sync_route(plan, inputs.topology, layout, stage, member, rank) if layout.replicas > 1 else None
    if route is not None and route_matters(route):  # the stage's gradient sum by the plan's algorithm and route
        executor.sync_route = route
        if shard:  # ZeRO stage 1's reduce-scatter and all-gather over the same route
            optimizer.sharded.route = route
    powersgd = {"stage": executor.powersgd, "embedding": executor.embedding_powersgd}
    if resumed:
        from planner.runtime.checkpoint import load_powersgd

        said = load_powersgd(folder, resumed, module=module, powersgd=powersgd, replica=replica, plan=plan,
                             tensor=(member, degree) if degree > 1 else None)
        told = [None] * layout.world if rank == 0 else None
        dist.gather_object(said, told, dst=0)
        if rank == 0 and any(told):
            print(next(line for line in told if line), flush=True)  # one line, whichever ranks reset
    times, losses, traces, checkpoints, sync_bytes, message_bytes = [], [], [], [], [], []
    for iteration in range(first, first + total):
        tokens = executor.batch(iteration)  # the input pipeline's work, outside the timed iteration
        if emulator is not None:
            emulator.iteration = iteration - first + 1  # as the progress lines count (a straggler's start)
        barrier()
        start = now_s()
        sent = executor.sync_bytes + (local_steps.bytes_sent if local_steps else 0)
        messages = executor.message_bytes
        with profiled(config.profile and iteration == first + total - 1, device,
                      Path(config.out_dir) / f"profile-rank-{rank}.txt"):
            loss, trace = executor.iteration(iteration, tokens)
        messages = executor.message_bytes - messages
        if local_steps is not None and local_steps.due(iteration):
            local_steps.outer_step()
            if groups.tensor is not None:  # the lead's outer step of the whole parameters is the group's
                broadcast_whole(module, groups.tensor, groups.tensor_lead)
        sent = executor.sync_bytes + (local_steps.bytes_sent if local_steps else 0) - sent
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elapsed = now_s() - start
        stats = torch.tensor([elapsed, loss], dtype=torch.float64, device=device)
        slowest = stats[:1].clone()
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        loss_total = stats[1:].clone()
        dist.all_reduce(loss_total)
        warm = iteration - first < config.warmup
        if rank == 0:
            label = "warm-up" if warm else "measured"
            print(f"iteration {iteration - first + 1}/{total} ({label}): {float(slowest[0]):.4f} s, "
                  f"loss {float(loss_total[0]):.4f}", flush=True)
        if not warm:
            times.append(float(slowest[0]))
            losses.append(float(loss_total[0]))
            traces.append(trace)
            sync_bytes.append(sent)
            message_bytes.append(messages)
        if checkpoint_due(iteration, config.checkpoint_every):
            checkpoints.append(_checkpoint(config, inputs, executed, module, optimizer, rank, replica, stage,
                                           iteration + 1, tensor=(groups.tensor, degree, groups.tensor_lead, member)
                                           if degree > 1 else None, powersgd=powersgd))
    peak = int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None
    device_name = plan.members(plan.assignment[replica][stage])[member]
    report = {"rank": rank, "replica": replica, "stage": stage, "member": member, "device": device_name,
              "peak_memory_bytes": peak, "traces": traces, "data_parallel_bytes": sync_bytes,
              "pipeline_bytes": message_bytes, "graphed": graphed,
              # the modes its blocks ran (planner.runtime.gpt.Block.recompute): one, its worker's
              "recompute": ",".join(sorted({str(block.recompute) for block in module.blocks.values()})),
              # graphs torch.compile fell back from (planner.runtime.graphs: then the stage ran its kernels)
              "graph_skips": _graph_skips() if graphed else 0}
    gathered = [None] * layout.world if rank == 0 else None
    dist.gather_object(report, gathered, dst=0)
    if config.save_state and replica == 0:
        state = (full_state(module, groups.tensor, degree, groups.tensor_lead, member) if degree > 1 else
                 {k: v.detach().cpu() for k, v in module.state_dict().items()})
        if member == 0:
            state_dir = os.path.join(config.out_dir, "state")
            os.makedirs(state_dir, exist_ok=True)
            torch.save(state, os.path.join(state_dir, f"stage{stage}.pt"))
    if rank == 0:
        scaler = getattr(optimizer, "scaler", None)  # fp16: every rank holds the same scale
        scaling = {"loss_scale": scaler.scale, "skipped_steps": scaler.skipped} if scaler else {}
        scaling["optimizer_shards"] = optimizer.sharded.shards if optimizer.sharded else 1
        # Message bytes every rank handed to the data-parallel sync (gradients, or local steps' deltas), per iteration.
        scaling["sync_every"] = plan.sync_every
        scaling["data_parallel_bytes_per_iteration"] = [sum(r["data_parallel_bytes"][i] for r in gathered)
                                                        for i in range(len(times))]
        # Bytes of the messages every rank sent to its neighbouring stages (as compressed), per iteration.
        scaling["compression"] = {"messages": str(plan.compression.messages),
                                  "gradients": str(plan.compression.gradients), "rank": plan.compression.rank}
        scaling["pipeline_bytes_per_iteration"] = [sum(r["pipeline_bytes"][i] for r in gathered)
                                                   for i in range(len(times))]
        scaling.update(first_iteration=first, checkpoints=checkpoints,
                       resumed_from={"path": config.resume_from, "iteration": first} if resumed else None)
        _write(config, inputs, executed, times, losses, gathered, device, dtype, scaling)


def _graph_skips() -> int:
    """Times torch.compile ran a graphed stage's code without its CUDA graph in this process."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["cudagraph_skips"])


def _outer_weight(plan, replica: int) -> float:
    """The weight of ``replica``'s delta (its sync group's) in the outer step: its share of the tokens."""
    groups = plan.sync_groups or tuple((r,) for r in range(plan.replicas))
    mine = next(k for k, g in enumerate(groups) if replica in g)
    return outer_weights(groups, plan.micro_batches)[mine]


def _checkpoint(config: WorkerConfig, inputs: RunInputs, executed, module, optimizer, rank, replica, stage,
                next_iteration: int, tensor=None, powersgd=None) -> dict:
    """Save the state before ``next_iteration`` (every rank takes part); what it cost, for the results."""
    started = now_s()
    meta = checkpoint_meta(seed=config.seed, model=executed, training=inputs.training, plan=inputs.plan)
    folder = save_checkpoint(config.checkpoint_dir, iteration=next_iteration, module=module, optimizer=optimizer,
                             rank=rank, replica=replica, stage=stage, meta=meta, tensor=tensor, powersgd=powersgd)
    return {"iteration": next_iteration, "path": str(folder), "seconds": now_s() - started}


def _write(config: WorkerConfig, inputs: RunInputs, executed, times, losses, reports, device, dtype,
           scaling: dict) -> None:
    plan, model, training, topology = inputs.plan, inputs.model, inputs.training, inputs.topology
    prediction, timeline = predict(plan, topology, model, training, keep_records=True, compiled=config.compile)
    plan = plan.with_prediction(prediction)
    measured = summarise_iterations(times)
    median_index = min(range(len(times)), key=lambda i: abs(times[i] - measured["median_s"]))
    plan_seconds = measured["median_s"] / config.time_scale
    peak = sum(topology.devices[topology.index(d)].peak_flops_for(training.precision)
               for d in plan.used_devices)
    flops = model_flops_per_iteration(model, plan.global_batch)
    measured.update({
        "plan_seconds_median": plan_seconds,
        "tokens_per_s": plan.global_batch * model.sequence / plan_seconds,
        "achieved_flops": flops / plan_seconds,
        "mfu": flops / plan_seconds / peak,
        "loss": losses,
        "peak_memory_bytes": {r["device"]: r["peak_memory_bytes"] for r in reports},
        "median_iteration": median_index,
        "trace": [{"rank": r["rank"], "replica": r["replica"], "stage": r["stage"], "device": r["device"],
                   "kind": k, "microbatch": mb, "chunk": c, "start_s": a, "end_s": b, "host_s": h}
                  for r in reports for (k, mb, a, b, c, h) in r["traces"][median_index]],
    })
    layout = Layout.of_plan(plan)
    predicted_trace = [{"rank": layout.rank(r, s), "replica": r, "stage": s, "device": plan.assignment[r][s],
                        "kind": k, "microbatch": mb, "start_s": a, "end_s": b}
                       for (r, s, k, mb, a, b) in timeline.records]
    document = {
        "format": RESULTS_FORMAT,
        "plan": plan_to_document(plan, model=model, training=training, topology_source=inputs.topology_path),
        "run": {
            "started_at_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "host": socket.gethostname(), "python": platform.python_version(), "torch": torch.__version__,
            "backend": config.backend, "device": device.type,
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
            "world": len(reports), "iterations": config.iterations, "warmup": config.warmup, "seed": config.seed,
            "learning_rate": config.learning_rate, "emulated": config.emulate, "compiled": config.compile,
            "graphs": config.graphs, "graphed_stages": sorted({r["stage"] for r in reports if r.get("graphed")}),
            "graph_skips": sum(r.get("graph_skips", 0) for r in reports),
            "recompute": {r["device"]: r["recompute"] for r in reports},  # each worker's mode, its members'
            "time_scale": config.time_scale,
            "executed_model": asdict(executed),
            "precision": {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32"), **scaling,
            "plan_path": inputs.plan_path, "topology_path": inputs.topology_path,
        },
        "measured": measured,
        "predicted": {"iteration_s": prediction.iteration_s, "breakdown_s": dict(prediction.breakdown_s),
                      "memory_bytes": dict(prediction.memory_bytes),
                      "allocated_bytes": {d: b - topology.devices[topology.index(d)].memory_reserved_bytes
                                          for d, b in prediction.memory_bytes.items()},
                      "trace": predicted_trace if len(predicted_trace) <= _PREDICTED_TRACE_LIMIT else []},
        "comparison": comparison(prediction.iteration_s, config.time_scale, measured["median_s"]),
    }
    # Which worker computed slower than the plan against the others, from every rank's measured ops.
    document["straggler"] = straggler_report(inputs, build_pipeline_job(plan, topology, model, training), reports,
                                             times, config.time_scale, config.warmup,
                                             document["comparison"]["predicted_s"])
    names = {r["rank"]: f"rank {r['rank']} {r['device']} (r{r['replica']} s{r['stage']})" for r in reports}
    all_measured = [{"rank": r["rank"], "iteration": i, "kind": k, "microbatch": mb, "start_s": a, "end_s": b}
                    for r in reports for i, trace in enumerate(r["traces"]) for (k, mb, a, b, *_) in trace]
    write_results(config.out_dir, document, chrome_trace(all_measured, predicted_trace, names, config.time_scale))


def _parse(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m planner.runtime.worker",
                                description="One rank of a plan under torchrun (plan launch --hostfile writes these).")
    p.add_argument("--plan", required=True)
    p.add_argument("--topology", required=True)
    p.add_argument("--devices", required=True, help="comma-separated plan devices of this host, by local rank")
    p.add_argument("--out", required=True)
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--backend", choices=["gloo", "nccl"], default="nccl")
    p.add_argument("--compile", action="store_true", help="torch.compile each block and the loss")
    p.add_argument("--graphs", choices=[g.value for g in Graphed], default=Graphed.NONE.value,
                   help="compiled stages whose blocks replay as CUDA graphs")
    p.add_argument("--profile", action="store_true", help="profile the last measured iteration")
    return p.parse_args(argv)


def main(argv=None) -> int:
    """torchrun entry: LOCAL_RANK picks this process's device from ``--devices``; its logical rank follows."""
    args = _parse(sys.argv[1:] if argv is None else argv)
    local_rank = int(os.environ["LOCAL_RANK"])
    world = int(os.environ["WORLD_SIZE"])
    devices = args.devices.split(",")
    inputs = load_run_inputs(args.plan, args.topology)
    plan = inputs.plan
    where = Layout.of_plan(plan).device_ranks(plan)
    rank = where[devices[local_rank]]
    config = WorkerConfig(plan_path=args.plan, topology_path=args.topology, out_dir=args.out,
                          iterations=args.iterations, warmup=args.warmup, seed=args.seed, learning_rate=args.lr,
                          timeout_s=args.timeout, backend=args.backend, compile=args.compile, graphs=args.graphs,
                          profile=args.profile, threads=max(1, (os.cpu_count() or 1) // max(len(devices), 1)))
    device_index = local_rank if args.backend == "nccl" else None
    _train(rank, world, config, {"init_method": "env://"}, device_index, None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
