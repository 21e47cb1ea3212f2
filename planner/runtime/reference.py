"""References the runtime is checked against: plain single-process training of the whole model on
the whole global batch, and ``torch.distributed.pipelining`` (PyTorch's own GPipe/1F1B) on the same
stage split. Both use the runtime's model, data and initialisation."""

import datetime
import multiprocessing
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from planner.runtime.data import global_batch_tokens
from planner.runtime.gpt import build_stage
from planner.runtime.precision import plain_optimizer

__all__ = ["train_single_process", "pipelining_worker", "run_pipelining"]


def train_single_process(spec, *, global_batch: int, iterations: int, seed: int = 0, learning_rate: float = 1e-3,
                         optimizer: str = "sgd") -> tuple:
    """(losses, state dict) of ``iterations`` steps of the whole model on the whole batch (CPU, fp32)."""
    model = build_stage(spec, 0, spec.layers, seed=seed)
    opt = plain_optimizer(model.parameters(), optimizer, learning_rate)
    losses = []
    for iteration in range(iterations):
        tokens = global_batch_tokens(seed, iteration, global_batch, spec.sequence, spec.vocabulary)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def pipelining_worker(rank: int, world: int, spec, layer_bounds: tuple, *, micro_batch_size: int, microbatches: int,
                      schedule: str, iterations: int, warmup: int, store_port: int, backend: str, seed: int,
                      learning_rate: float, optimizer: str, results) -> None:
    """One rank of ``torch.distributed.pipelining`` on the runtime's stage split (one replica).

    Puts ``(rank, losses, iteration seconds)`` on ``results``; losses are known on the last stage only.
    """
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

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
        module = build_stage(spec, layer_bounds[rank], layer_bounds[rank + 1], seed=seed).to(device)
        if module.tied_copy:
            raise ValueError("the pipelining cross-check needs untied embeddings or a single stage")
        opt = plain_optimizer(module.parameters(), optimizer, learning_rate)
        stage = PipelineStage(module, rank, world, device)

        def loss_fn(logits, targets):
            return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())

        kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
        runner = kind(stage, n_microbatches=microbatches, loss_fn=loss_fn)
        losses, seconds = [], []
        batch = micro_batch_size * microbatches
        for iteration in range(warmup + iterations):
            tokens = global_batch_tokens(seed, iteration, batch, spec.sequence, spec.vocabulary).to(device)
            dist.barrier()
            if cuda:
                torch.cuda.synchronize()
            start = time.monotonic()
            per_microbatch = []
            autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else torch.autocast("cpu", enabled=False)
            with autocast:
                if rank == 0:
                    runner.step(tokens[:, :-1].contiguous())
                elif rank == world - 1:
                    runner.step(target=tokens[:, 1:].contiguous(), losses=per_microbatch)
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
        results.put((rank, losses, seconds))
    finally:
        dist.destroy_process_group()


def run_pipelining(spec, layer_bounds, *, micro_batch_size: int, microbatches: int, schedule: str, iterations: int,
                   warmup: int = 0, backend: str = "gloo", seed: int = 0, learning_rate: float = 1e-3,
                   optimizer: str = "sgd") -> tuple:
    """Spawn one ``pipelining_worker`` per stage; returns (last stage's losses, iteration seconds)."""
    world = len(layer_bounds) - 1
    store = dist.TCPStore("127.0.0.1", 0, world + 1, True, wait_for_workers=False)
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    kwargs = dict(micro_batch_size=micro_batch_size, microbatches=microbatches, schedule=schedule,
                  iterations=iterations, warmup=warmup, store_port=store.port, backend=backend, seed=seed,
                  learning_rate=learning_rate, optimizer=optimizer, results=results)
    processes = [context.Process(target=pipelining_worker, args=(rank, world, spec, tuple(layer_bounds)),
                                 kwargs=kwargs) for rank in range(world)]
    for p in processes:
        p.start()
    try:
        got = {}
        while len(got) < world:
            if any(p.exitcode not in (None, 0) for p in processes):
                raise RuntimeError("a torch.distributed.pipelining rank failed")
            try:
                rank, losses, seconds = results.get(timeout=1.0)
            except Exception:  # queue.Empty
                continue
            got[rank] = (losses, seconds)
    finally:
        for p in processes:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    return got[world - 1][0], got[0][1]
