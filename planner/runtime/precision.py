"""Mixed-precision training as the memory model counts it: 16-bit weights and gradients on the
device, fp32 master weights and optimizer state beside them (Micikevicius et al. 2018, sec. 3.1;
2 + 2 + 12 = 16 bytes per parameter with Adam, ZeRO sec. 3.1).

The fp32 step runs one chunk of parameters at a time, so its transient fp32 gradients stay at
``CHUNK_BYTES`` instead of 4 bytes per parameter.
"""

import torch

__all__ = ["MasterWeightOptimizer", "make_optimizer", "plain_optimizer", "CHUNK_BYTES"]

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

    @torch.no_grad()
    def step(self) -> None:
        for chunk, masters, optimizer in zip(self.chunks, self.masters, self.optimizers):
            for p, m in zip(chunk, masters):
                m.grad = p.grad.float() if p.grad is not None else None
            optimizer.step()
            for p, m in zip(chunk, masters):
                p.copy_(m)
                m.grad = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.parameters:
            p.grad = None


def make_optimizer(module, name: str, learning_rate: float, dtype: torch.dtype, device: torch.device):
    """The optimizer for ``module``: plain fp32, or master weights when the module is 16-bit."""
    fused = device.type == "cuda"
    if dtype == torch.float32:
        return plain_optimizer(module.parameters(), name, learning_rate, fused)
    return MasterWeightOptimizer(module.parameters(), name, learning_rate, fused=fused)
