"""Block-wise int8 messages between pipeline stages (``cost_models.compression``, the formulas).

Every block of ``BLOCK_VALUES`` consecutive values becomes int8 codes ``round(x / scale)`` with one
fp32 scale ``absmax / 127`` per block (Dettmers et al. 2022, arXiv 2110.02861, sec. 2.1), so a value
comes back within ``scale / 2`` of itself. What crosses the wire: the ``n`` codes and the
``ceil(n / BLOCK_VALUES)`` scales, the bytes ``cost_models.compression.int8_message_bytes`` counts.
A block holding an inf or a NaN gets a non-finite scale, so its decoded values are non-finite too
and fp16 loss scaling still sees the overflow.
"""

import torch
import torch.nn.functional as F

from cost_models.compression import BLOCK_VALUES, int8_blocks

__all__ = ["encode_int8", "decode_int8", "int8_wire_shapes"]


def int8_wire_shapes(values: int, block_values: int = BLOCK_VALUES) -> tuple:
    """(codes, scales) element counts of a message of ``values`` values."""
    return values, int8_blocks(values, block_values)


def encode_int8(tensor: torch.Tensor, block_values: int = BLOCK_VALUES) -> tuple:
    """(int8 codes of every value, fp32 scale of every block) of ``tensor``, flattened. A message
    of whole blocks is viewed as blocks as it is (no padded copy); fp32 input is not copied."""
    flat = tensor.detach().reshape(-1).float()
    n, blocks = int8_wire_shapes(flat.numel(), block_values)
    if blocks * block_values != n:
        flat = F.pad(flat, (0, blocks * block_values - n))
    padded = flat.view(blocks, block_values)
    # absmax as the larger of max and -min: the same value (and NaN) as abs().amax, without an |x| copy
    scales = torch.maximum(padded.amax(dim=1), padded.amin(dim=1).neg_()).div_(127.0)
    divisor = torch.where(scales > 0, scales, torch.ones_like(scales))  # an all-zero block stays zero
    codes = (padded / divisor[:, None]).round_().clamp_(-127, 127).to(torch.int8)
    return codes.view(-1)[:n], scales


def decode_int8(codes: torch.Tensor, scales: torch.Tensor, shape, dtype: torch.dtype,
                block_values: int = BLOCK_VALUES) -> torch.Tensor:
    """The values of ``encode_int8``'s (codes, scales), as a ``shape`` tensor of ``dtype``."""
    n, blocks = codes.numel(), scales.numel()
    values = codes.to(torch.float32)
    if blocks * block_values != n:
        values = F.pad(values, (0, blocks * block_values - n))
    values = values.view(blocks, block_values).mul_(scales[:, None])
    return values.view(-1)[:n].view(shape).to(dtype)
