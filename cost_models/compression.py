"""Compression on the wire: what it sends and what its encoding costs (pure formulas).

Two schemes, each a closed set of choices:

- **Messages between pipeline stages** (activations forward, their gradients backward) in
  block-wise absmax int8: every block of ``BLOCK_VALUES`` consecutive values is sent as int8 codes
  ``round(127 x / absmax)`` plus one fp32 scale ``absmax / 127`` (Dettmers et al. 2022, "8-bit
  Optimizers via Block-wise Quantization", arXiv 2110.02861, sec. 2.1; blocks of 2048 there for
  optimizer state, smaller here because activations have outlier channels; AQ-SGD, Wang et al. 2022,
  arXiv 2206.01299, compresses the same pipeline messages to 4-8 bits).
- **Gradient sync** by PowerSGD (Vogels et al. 2019, arXiv 1905.13727, Algorithm 1): an ``n x m``
  gradient matrix is all-reduced as ``P`` (``n x r``) and ``Q`` (``m x r``), ``r (n + m)`` values
  instead of ``n m``; vectors (biases, norms) are all-reduced whole.

Encoding is charged as memory traffic (roofline, Williams et al. 2009: a kernel that moves ``B``
bytes takes at least ``B / memory bandwidth``) at the share of the bandwidth the runtime's eager
torch ops were measured to reach (``INT8_CODEC_BANDWIDTH_SHARE``, ``POWERSGD_BANDWIDTH_SHARE``:
calibration data with their origin), PowerSGD's products as FLOPs (``2 n m r`` per matrix product,
the usual multiply-add count).
"""

import math
from enum import StrEnum

__all__ = ["MessageCompression", "GradientCompression", "BLOCK_VALUES", "SCALE_BYTES", "MAX_POWERSGD_RANK",
           "POWERSGD_VALUE_BYTES", "INT8_CODEC_BANDWIDTH_SHARE", "POWERSGD_BANDWIDTH_SHARE",
           "POWERSGD_STATE_BYTES_PER_PARAMETER", "POWERSGD_PASS_BYTES_PER_PARAMETER",
           "int8_blocks", "int8_message_bytes", "int8_encode_bytes", "int8_decode_bytes", "block_matrix_shapes",
           "powersgd_compresses", "powersgd_matrix_values", "powersgd_flops", "powersgd_sync"]

BLOCK_VALUES = 256  # values per scale (Dettmers et al. 2022 use 2048 for optimizer state)
SCALE_BYTES = 4  # one fp32 scale per block (absmax / 127)
MAX_POWERSGD_RANK = 1024  # Vogels et al. use ranks 1-4; above a few hundred it saves little
POWERSGD_VALUE_BYTES = 4  # P and Q are computed and all-reduced in fp32 (planner.runtime.powersgd)
POWERSGD_STATE_BYTES_PER_PARAMETER = 4.0  # the fp32 error-feedback memory of each compressed gradient
# Memory traffic per compressed parameter, roofline: M = G + E (read the 16-bit G and fp32 E, write M),
# E = M - P Q_w^T (read M and the product, write E), G = P Q^T (write the product, then G): 32 B.
POWERSGD_PASS_BYTES_PER_PARAMETER = 32.0
# Calibration (data, not formula): the share of the memory bandwidth the runtime's eager torch ops
# reach. Origin: benchmarks/compression_codec.py on one H100 SXM (torch 2.11, bf16, GPT-3 XL,
# micro-batch 2: 8.4M values per message; benchmarks/results/compression_codec.json): encode + decode
# 0.355 ms against 0.0202 ms at the catalog's full 3.35 TB/s (0.057); PowerSGD on one block's
# matrices at rank 4, 2.46 ms against 0.48 ms of error-feedback passes at full bandwidth (its
# products' FLOPs take 3 us; 0.196). Other devices are assumed to reach the same shares.
INT8_CODEC_BANDWIDTH_SHARE = 0.057
POWERSGD_BANDWIDTH_SHARE = 0.196


class MessageCompression(StrEnum):
    """How activations and their gradients cross a stage boundary."""

    OFF = "off"  # at the training precision
    INT8 = "int8"  # block-wise absmax int8 + one fp32 scale per BLOCK_VALUES values


class GradientCompression(StrEnum):
    """How a stage's replicas sum their gradients."""

    OFF = "off"  # the whole gradient, all-reduced
    POWERSGD = "powersgd"  # rank-r PowerSGD on matrices, vectors whole


def int8_blocks(values: float, block_values: int = BLOCK_VALUES) -> int:
    """Scale blocks of a message of ``values`` values (the last one padded): ``ceil(n / block)``."""
    return math.ceil(values / block_values)


def int8_message_bytes(values: float, block_values: int = BLOCK_VALUES) -> float:
    """Bytes on the wire for ``values`` values in block-wise int8: one byte each plus one scale per
    block (``int8_blocks``), ``n + ceil(n / block) * 4``."""
    return float(values) + int8_blocks(values, block_values) * SCALE_BYTES


def int8_encode_bytes(values: float, dtype_bytes: int, block_values: int = BLOCK_VALUES) -> float:
    """Memory traffic of encoding: the input read twice (absmax, then quantise) and the codes and
    scales written, ``2 d n + n + scales`` (a fused two-pass kernel)."""
    return 2.0 * dtype_bytes * values + int8_message_bytes(values, block_values)


def int8_decode_bytes(values: float, dtype_bytes: int, block_values: int = BLOCK_VALUES) -> float:
    """Memory traffic of decoding: the codes and scales read, the values written, ``n + scales + d n``."""
    return int8_message_bytes(values, block_values) + float(dtype_bytes) * values


def block_matrix_shapes(h: int, f: int, *, gated_mlp: bool = False, tensor: int = 1) -> list:
    """(rows, columns) of each weight matrix of one transformer block, as ``cost_models.flops``
    counts them: QKV ``3h x h``, output projection ``h x h``, MLP ``f x h`` (and the gate) and ``h x f``.
    ``tensor``: one member's shards in a tensor group of that degree (Shoeybi et al. 2019, sec. 3:
    the column-parallel QKV, fc1 and gate split by output rows, the row-parallel projection and fc2
    by input columns), ``3h/t x h``, ``h x h/t``, ``f/t x h`` and ``h x f/t``."""
    t = tensor
    return [(3 * h // t, h), (h, h // t), (f // t, h)] + ([(f // t, h)] if gated_mlp else []) + [(h, f // t)]


def powersgd_compresses(rows: int, columns: int, rank: int) -> bool:
    """Whether a matrix is sent as ``P`` and ``Q``: only where ``r (n + m) < n m`` (else whole, as
    torch's PowerSGD hook does for such tensors)."""
    return rank * (rows + columns) < rows * columns


def powersgd_matrix_values(rows: int, columns: int, rank: int) -> float:
    """Values PowerSGD all-reduces for one matrix it compresses: ``P`` and ``Q``, ``r (n + m)``
    (Vogels et al. 2019, sec. 3)."""
    return float(rank * (rows + columns))


def powersgd_flops(rows: int, columns: int, rank: int) -> float:
    """FLOPs of one PowerSGD step on an ``n x m`` matrix (Vogels et al. 2019, Algorithm 1): ``P = M Q``,
    ``Q = M^T P`` and the decompressed ``P Q^T`` (``2 n m r`` each) and the Gram-Schmidt of ``P``
    (``2 n r^2``); the error feedback's adds are memory-bound and left to the optimizer's traffic."""
    r = min(rank, rows, columns)
    return 6.0 * rows * columns * r + 2.0 * rows * r * r


def powersgd_sync(matrices, parameters: float, rank: int, dtype_bytes: int) -> tuple:
    """(bytes all-reduced, FLOPs, parameters compressed) of a set of ``parameters`` parameters whose
    ``matrices`` (``(rows, columns)`` each) PowerSGD may compress: ``P`` and ``Q`` in fp32 for the
    matrices it compresses, everything else whole at ``dtype_bytes`` per value."""
    packed = [(n, m) for n, m in matrices if powersgd_compresses(n, m, rank)]
    compressed = float(sum(n * m for n, m in packed))
    sent = POWERSGD_VALUE_BYTES * sum(powersgd_matrix_values(n, m, rank) for n, m in packed)
    return (sent + dtype_bytes * (parameters - compressed), sum(powersgd_flops(n, m, rank) for n, m in packed),
            compressed)
