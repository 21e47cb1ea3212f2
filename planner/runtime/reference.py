"""References the runtime is checked against: plain single-process training of the whole model on
the whole global batch, and ``torch.distributed.pipelining`` (PyTorch's own GPipe/1F1B) on the same
stage split. Both use the runtime's model, data and initialisation.

On GPUs the pipelining run takes one of two precision recipes (``PIPELINING_RECIPES``), each with
a fused Adam: ``bf16-master`` is the runtime's own (bf16 weights, activations and messages, fp32
master weights and state), ``autocast`` is the common one (fp32 weights under bf16 autocast, fp32
messages). On the CPU both train in fp32."""

import datetime
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from planner.runtime.data import global_batch_tokens, training_inputs, training_targets
from planner.runtime.gpt import build_stage, compile_stage, lm_loss, vocabulary_logits
from planner.runtime.precision import MasterWeightOptimizer, plain_optimizer
from planner.runtime.spawn import gather_from_ranks

__all__ = ["train_single_process", "PipeliningRun", "pipelining_worker", "run_pipelining", "PIPELINING_RECIPES"]

PIPELINING_RECIPES = ("bf16-master", "autocast")


def train_single_process(spec, *, global_batch: int, iterations: int, seed: int = 0, learning_rate: float = 1e-3,
                         optimizer: str = "sgd") -> tuple:
    """(losses, state dict) of ``iterations`` steps of the whole model on the whole batch (CPU, fp32)."""
    model = build_stage(spec, 0, spec.layers, seed=seed)
    opt = plain_optimizer(model.parameters(), optimizer, learning_rate)
    losses = []
    for iteration in range(iterations):
        tokens = global_batch_tokens(seed, iteration, global_batch, spec.sequence, spec.vocabulary)
        logits = model(training_inputs(tokens))
        loss = F.cross_entropy(logits.flatten(0, -2), training_targets(tokens, spec).flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


@dataclass(frozen=True, kw_only=True)
class PipeliningRun:
    micro_batch_size: int
    micro_batches: int
    schedule: str
    iterations: int
    warmup: int = 0
    backend: str = "gloo"
    seed: int = 0
    learning_rate: float = 1e-3
    optimizer: str = "sgd"
    recipe: str = "bf16-master"
    compile: bool = False  # torch.compile each block and the loss, as the runtime does on GPUs
    virtual_stages: int = 1  # > 1: ScheduleInterleaved1F1B, rank r holding pieces r, r + world, ...


def pipelining_worker(rank: int, world: int, store_port: int, results, spec, layer_bounds: tuple,
                      run: PipeliningRun) -> None:
    """One rank of ``torch.distributed.pipelining`` on the runtime's stage split (one replica);
    with ``run.virtual_stages`` v > 1, ``layer_bounds`` lists the v * world pieces and rank r
    holds pieces r, r + world, ... (the runtime's chunk order) under ``ScheduleInterleaved1F1B``.

    Puts ``(rank, (losses, iteration seconds))`` on ``results`` (losses are known on the last stage
    only), or ``(rank, error text)``.
    """
    try:
        _pipelining(rank, world, store_port, results, spec, layer_bounds, run)
    except Exception as error:  # reported to gather_from_ranks, which names the rank
        results.put((rank, f"{type(error).__name__}: {str(error).strip()[:300]}"))


def _pipelining(rank, world, store_port, results, spec, layer_bounds, run: PipeliningRun) -> None:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    micro_batch_size, micro_batches, schedule = run.micro_batch_size, run.micro_batches, run.schedule
    iterations, warmup, backend, seed = run.iterations, run.warmup, run.backend, run.seed
    learning_rate, optimizer = run.learning_rate, run.optimizer
    store = dist.TCPStore("127.0.0.1", store_port, world, False, timeout=datetime.timedelta(seconds=120))
    cuda = backend == "nccl"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120), **({"device_id": device} if cuda else {}))
    try:
        master = cuda and run.recipe == "bf16-master"
        pieces = len(layer_bounds) - 1
        mine = range(rank, pieces, world)
        # Pipelining checks each output's strides against its shape inference, so the last stage
        # hands over the padded logits and the loss drops the padding (the same work as the runtime).
        modules = [build_stage(spec, layer_bounds[k], layer_bounds[k + 1], seed=seed, padded_logits=True)
                   .to(device=device, dtype=torch.bfloat16 if master else torch.float32) for k in mine]
        if any(m.tied_copy for m in modules):
            raise ValueError("the pipelining cross-check needs untied embeddings or a single stage")
        parameters = [p for m in modules for p in m.parameters()]
        if master:
            opt = MasterWeightOptimizer(parameters, optimizer, learning_rate, fused=True)
        else:
            opt = plain_optimizer(parameters, optimizer, learning_rate, fused=cuda)
        stages = [PipelineStage(m, k, pieces, device) for m, k in zip(modules, mine)]
        compiled = [compile_stage(m) for m in modules] if run.compile else []
        loss = compiled[-1] if compiled else lm_loss

        def loss_fn(logits, targets):
            return loss(vocabulary_logits(logits, spec), targets)

        if run.virtual_stages > 1:
            runner = ScheduleInterleaved1F1B(stages, n_microbatches=micro_batches, loss_fn=loss_fn)
        else:
            kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
            runner = kind(stages[0], n_microbatches=micro_batches, loss_fn=loss_fn)
        losses, seconds = [], []
        batch = micro_batch_size * micro_batches
        for iteration in range(warmup + iterations):
            tokens = global_batch_tokens(seed, iteration, batch, spec.sequence, spec.vocabulary).to(device)
            dist.barrier()
            if cuda:
                torch.cuda.synchronize()
            start = time.monotonic()
            per_microbatch = []
            autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=not master) if cuda \
                else torch.autocast("cpu", enabled=False)
            with autocast:
                if rank == 0:
                    runner.step(training_inputs(tokens).contiguous())
                elif rank == world - 1:
                    runner.step(target=training_targets(tokens, spec).contiguous(), losses=per_microbatch)
                else:
                    runner.step()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.synchronize()
            elapsed = torch.tensor([time.monotonic() - start], dtype=torch.float64, device=device)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            if iteration >= warmup:
                seconds.append(float(elapsed[0]))
                if per_microbatch:
                    losses.append(sum(float(x.detach()) for x in per_microbatch) / len(per_microbatch))
        results.put((rank, (losses, seconds)))
    finally:
        dist.destroy_process_group()


def run_pipelining(spec, layer_bounds, *, micro_batch_size: int, micro_batches: int, schedule: str, iterations: int,
                   warmup: int = 0, backend: str = "gloo", seed: int = 0, learning_rate: float = 1e-3,
                   optimizer: str = "sgd", recipe: str = "bf16-master", compile: bool = False,
                   virtual_stages: int = 1) -> tuple:
    """One ``pipelining_worker`` per rank (``len(layer_bounds) - 1`` pieces, ``virtual_stages`` per
    rank); returns (last stage's losses, iteration seconds)."""
    run = PipeliningRun(micro_batch_size=micro_batch_size, micro_batches=micro_batches, schedule=schedule,
                        iterations=iterations, warmup=warmup, backend=backend, seed=seed,
                        learning_rate=learning_rate, optimizer=optimizer, recipe=recipe, compile=compile,
                        virtual_stages=virtual_stages)
    world = (len(layer_bounds) - 1) // virtual_stages
    got = gather_from_ranks(pipelining_worker, world, args=(spec, tuple(layer_bounds), run))
    return got[world - 1][0], got[0][1]
