"""Synthetic token data, generated deterministically from (seed, iteration); nothing is downloaded.

Each sequence follows ``x[t+1] = (x[t] + step) mod V`` from a random start with a random step, and
one token in ten replaced by noise: learnable (the loss falls) yet free of any dataset.
"""

import torch

__all__ = ["global_batch_tokens", "micro_batch_rows", "training_inputs", "training_targets"]

_NOISE = 0.1


def global_batch_tokens(seed: int, iteration: int, sequences: int, sequence: int, vocabulary: int) -> torch.Tensor:
    """Tokens (sequences, sequence + 1), int64 on the CPU: inputs are ``[:, :-1]``, targets ``[:, 1:]``."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + iteration)
    start = torch.randint(0, vocabulary, (sequences, 1), generator=generator)
    step = torch.randint(1, max(vocabulary, 2), (sequences, 1), generator=generator)
    tokens = (start + step * torch.arange(sequence + 1)) % vocabulary
    noise = torch.rand((sequences, sequence + 1), generator=generator) < _NOISE
    tokens[noise] = torch.randint(0, vocabulary, (int(noise.sum()),), generator=generator)
    return tokens


def training_inputs(tokens: torch.Tensor) -> torch.Tensor:
    """The model's input tokens of ``global_batch_tokens`` rows: every position but the last."""
    return tokens[:, :-1]


def training_targets(tokens: torch.Tensor, spec) -> torch.Tensor:
    """What the head learns for ``global_batch_tokens`` rows: the next token at every position (LM
    head), or a class per sequence, its first token modulo ``classes`` (classification head:
    learnable from the input, no labels to download)."""
    if spec.head == "classification":
        return tokens[:, 0] % spec.classes
    return tokens[:, 1:]


def micro_batch_rows(micro_batches: tuple, micro_batch_size: int, replica: int, microbatch: int) -> slice:
    """Rows of the global batch that ``microbatch`` of ``replica`` trains on (replicas in order)."""
    first = sum(micro_batches[:replica]) + microbatch
    return slice(first * micro_batch_size, (first + 1) * micro_batch_size)
