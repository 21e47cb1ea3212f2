"""fp16 training: dynamic loss scaling that skips a step on every rank together."""

import os

import pytest

torch = pytest.importorskip("torch")

from planner.runtime.optimizer import TrainingOptimizer  # noqa: E402
from planner.runtime.precision import DynamicLossScaler, MasterWeightOptimizer, runtime_dtype  # noqa: E402

CPU = torch.device("cpu")


def test_scale_halves_on_overflow_and_doubles_after_clean_steps():
    scaler = DynamicLossScaler(CPU, initial=1024.0, growth_interval=3)
    assert scaler.overflowed([torch.tensor([1.0, float("inf")])])
    assert scaler.scale == 512.0 and scaler.skipped == 1
    assert scaler.overflowed([torch.tensor([float("nan")])]) and scaler.scale == 256.0
    for _ in range(2):
        assert not scaler.overflowed([torch.tensor([65504.0], dtype=torch.float16)])  # fp16's largest is finite
    assert scaler.scale == 256.0
    assert not scaler.overflowed([torch.ones(3)])
    assert scaler.scale == 512.0 and scaler.clean_steps == 0


def _fp16_model():
    torch.manual_seed(0)
    return torch.nn.Linear(8, 4).to(torch.float16)


def test_the_step_unscales_gradients_and_matches_fp32():
    model = _fp16_model()
    reference = torch.nn.Linear(8, 4)
    reference.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    optimizer = TrainingOptimizer([MasterWeightOptimizer(model.parameters(), "sgd", 0.1, fused=False)],
                                  DynamicLossScaler(CPU))
    x = torch.randn(16, 8)
    loss = model(x.half()).float().pow(2).mean()
    (loss * optimizer.loss_scale).backward()
    assert max(p.grad.abs().max().item() for p in model.parameters()) > 1.0  # scaled by 2^16
    optimizer.step()
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    reference(x).pow(2).mean().backward()
    reference_optimizer.step()
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.allclose(p.float(), q, atol=2e-3), (p, q)
    assert optimizer.scaler.skipped == 0


def test_an_overflow_skips_the_step_and_keeps_the_weights():
    model = _fp16_model()
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = TrainingOptimizer([MasterWeightOptimizer(model.parameters(), "adam", 0.1, fused=False)],
                                  DynamicLossScaler(CPU))
    for p in model.parameters():
        p.grad = torch.full_like(p, float("inf"))
    optimizer.step()
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    assert optimizer.loss_scale == DynamicLossScaler.INITIAL / 2


def test_fp16_is_the_plans_format_on_gpus_and_fp32_on_the_cpu():
    assert runtime_dtype("fp16", torch.device("cuda", 0)) == torch.float16
    assert runtime_dtype("bf16", torch.device("cuda", 0)) == torch.bfloat16
    assert runtime_dtype("fp16", CPU) == torch.float32


def _rank(rank: int, world: int, port: int, out) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}")
    scaler = DynamicLossScaler(CPU)
    grads = [torch.tensor([float("inf") if rank == 1 else 1.0])]  # only the last stage overflows
    out.put((rank, scaler.overflowed(grads), scaler.scale))
    dist.destroy_process_group()


def test_every_rank_skips_when_one_overflows():
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.get_context("spawn")
    out = context.Queue()
    processes = [context.Process(target=_rank, args=(r, 3, port, out)) for r in range(3)]
    for p in processes:
        p.start()
    results = sorted(out.get(timeout=60) for _ in processes)
    for p in processes:
        p.join(timeout=30)
    assert results == [(r, True, DynamicLossScaler.INITIAL / 2) for r in range(3)], (results, os.getpid())
