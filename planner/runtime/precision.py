"""Mixed-precision training as the memory model counts it: 16-bit weights and gradients on the
device, fp32 master weights and optimizer state beside them (Micikevicius et al. 2018, sec. 3.1;
2 + 2 + 12 = 16 bytes per parameter with Adam, ZeRO sec. 3.1).

The fp32 step runs one chunk of parameters at a time, so its transient fp32 gradients stay at
``CHUNK_BYTES`` instead of 4 bytes per parameter.

fp16 (for devices without bf16: V100, T4) scales the loss so small gradients survive fp16's range
(Micikevicius et al. 2018, sec. 3.2) with the dynamic rule of ``torch.amp.GradScaler`` and
Megatron-LM's ``DynamicGradScaler``: start at 2^16, halve and skip the step on an overflow, double
after ``GROWTH_INTERVAL`` clean steps. It is written here rather than taken from ``GradScaler``
because ``GradScaler`` refuses fp16 gradients (it expects fp32 weights under autocast) and decides
an overflow per process, while a pipeline must skip the step on every stage together: the overflow
flag is all-reduced over all ranks.
"""

import torch
import torch.distributed as dist

__all__ = ["MasterWeightOptimizer", "PlainOptimizer", "DynamicLossScaler", "plain_optimizer", "runtime_dtype",
           "CHUNK_BYTES"]

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def runtime_dtype(precision: str, device: torch.device) -> torch.dtype:
    """Weights, activations and messages: the plan's 16-bit format on GPUs; fp32 on the CPU, whose
    kernels are fp32 (emulated runs and tests)."""
    return _DTYPES[precision] if device.type == "cuda" else torch.float32


class DynamicLossScaler:
    """The loss scale of an fp16 run, the same on every rank (the overflow flag is all-reduced)."""

    INITIAL = 2.0**16
    GROWTH_INTERVAL = 1000
    MIN_SCALE = 1.0

    def __init__(self, device: torch.device, *, initial: float = INITIAL, growth_interval: int = GROWTH_INTERVAL,
                 group=None):
        self.scale, self.growth_interval, self.group, self.device = float(initial), growth_interval, group, device
        self.clean_steps, self.skipped = 0, 0

    def overflowed(self, grads: list) -> bool:
        """Whether any rank has an inf or nan among its gradients (largest magnitudes, which cannot
        overflow themselves); updates the scale."""
        flag = torch.zeros(1, device=self.device)
        if grads:
            largest = torch.stack(torch._foreach_norm(grads, float("inf"))).float()  # as clip_grad_norm_ does
            flag += (~torch.isfinite(largest)).any().float()
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        overflow = bool(flag.item())
        if overflow:
            self.scale, self.clean_steps = max(self.scale / 2, self.MIN_SCALE), 0
            self.skipped += 1
        else:
            self.clean_steps += 1
            if self.clean_steps == self.growth_interval:
                self.scale, self.clean_steps = self.scale * 2, 0
        return overflow

CHUNK_BYTES = 64 * 2**20


def plain_optimizer(parameters, name: str, learning_rate: float, fused: bool = False):
    """SGD with momentum 0.9, or Adam, over ``parameters`` as they are (no master copies)."""
    if name == "sgd":
        return torch.optim.SGD(parameters, lr=learning_rate, momentum=0.9)
    return torch.optim.Adam(parameters, lr=learning_rate, fused=fused)


class MasterWeightOptimizer:
    """Steps fp32 master copies of 16-bit ``parameters`` and writes the result back into them."""

    def __init__(self, parameters, name: str, learning_rate: float, *, fused: bool):
        self.parameters = list(parameters)
        self.chunks = []
        chunk, size = [], 0
        for p in self.parameters:
            chunk.append(p)
            size += p.numel() * 4
            if size >= CHUNK_BYTES:
                self.chunks.append(chunk)
                chunk, size = [], 0
        if chunk:
            self.chunks.append(chunk)
        self.masters = [[p.detach().float().clone() for p in chunk] for chunk in self.chunks]
        self.optimizers = [plain_optimizer(masters, name, learning_rate, fused) for masters in self.masters]

    def grads(self) -> list:
        return [p.grad for p in self.parameters if p.grad is not None]

    @torch.no_grad()
    def step(self, unscale: float = 1.0) -> None:
        for chunk, masters, optimizer in zip(self.chunks, self.masters, self.optimizers):
            grads = [m for p, m in zip(chunk, masters) if p.grad is not None]
            for p, m in zip(chunk, masters):
                m.grad = p.grad.float() if p.grad is not None else None
            if unscale != 1.0 and grads:
                torch._foreach_mul_([m.grad for m in grads], unscale)
            optimizer.step()
            torch._foreach_copy_(chunk, masters)  # one launch per chunk instead of one per parameter
            for m in masters:
                m.grad = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.parameters:
            p.grad = None


class PlainOptimizer:
    """A torch optimizer over fp32 parameters as they are (no loss scaling in fp32)."""

    def __init__(self, parameters, name: str, learning_rate: float, *, fused: bool):
        self.parameters = list(parameters)
        self.optimizer = plain_optimizer(self.parameters, name, learning_rate, fused)

    def grads(self) -> list:
        return [p.grad for p in self.parameters if p.grad is not None]

    def step(self, unscale: float = 1.0) -> None:
        assert unscale == 1.0, "fp32 runs do not scale the loss"
        self.optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)
