"""The GPT-style decoder the runtime trains, built one pipeline stage at a time.

Same shape family as ``planner.model.ModelSpec`` (and the same parameter count as
``cost_models.flops``, which a test checks): pre-norm blocks of causal self-attention and an MLP
(GELU, or SwiGLU when ``gated_mlp``), LayerNorm with biases or RMSNorm without, learned positions or
rotary embeddings, and a tied or separate LM head (Radford et al. 2019; Touvron et al. 2023).

Every module is initialised from its own seed (embedding = 0, block i = i + 1, head = layers + 1),
so a stage built alone holds exactly the weights of the same layers in the whole model. With tied
embeddings and more than one stage the last stage keeps its own copy of the token embedding, whose
gradient is summed with the first stage's (Megatron-LM's embedding group).

The embedding and the head have ``padded_vocabulary(V)`` rows (a multiple of 128, as Megatron-LM
pads): the extra rows start at zero, are never looked up, and their logits are dropped before the
loss, so they receive no gradient and training equals that of the unpadded model.

Each block recomputes in backward as its ``recompute`` mode says (``planner.plan.recompute``): nothing,
its attention core (selective) or its whole forward (full) (Korthikanti et al. 2022, sec. 4-5).
"""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from cost_models.flops import padded_vocabulary
from planner.plan.recompute import RecomputeMode, mode_of

__all__ = ["StageModule", "ChunkedStage", "build_stage", "vocabulary_logits", "lm_loss", "compile_stage",
           "compile_split_stage", "SPLIT_BACKWARD_OPTIONS", "INIT_STD"]

INIT_STD = 0.02  # GPT-2's initialisation scale


def make_norm(spec, width: int) -> nn.Module:
    """LayerNorm where the model has biases, else RMSNorm (LLaMA)."""
    return nn.LayerNorm(width) if spec.biases else nn.RMSNorm(width, eps=1e-5)


def _rotary(x: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding on (batch, heads, sequence, head_dim) (Su et al. 2021, eq. 34)."""
    seq, dim = x.shape[-2], x.shape[-1]
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, device=x.device, dtype=torch.float32) / dim))
    angles = torch.outer(torch.arange(seq, device=x.device, dtype=torch.float32), inv)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, spec):
        super().__init__()
        h, f = spec.hidden, spec.ffn_hidden
        self.heads = spec.heads  # this device's heads (``tensor_parallel`` divides them)
        self.head_dim = h // spec.heads
        self.rotary = not spec.learned_positions
        self.gated = spec.gated_mlp
        self.norm1 = make_norm(spec, h)
        self.qkv = nn.Linear(h, 3 * h, bias=spec.biases)
        self.proj = nn.Linear(h, h, bias=spec.biases)
        self.norm2 = make_norm(spec, h)
        self.fc1 = nn.Linear(h, f, bias=spec.biases)
        if self.gated:
            self.gate = nn.Linear(h, f, bias=spec.biases)
        self.fc2 = nn.Linear(f, h, bias=spec.biases)

        # What enters the column-parallel layers (qkv; fc1 and gate): the identity, or a tensor
        # group's ``f`` operator (``planner.runtime.tensor_parallel.shard_stage``).
        self.enter = _identity
        # Full recomputation keeps the block's input and re-runs its forward in backward (Chen et al.
        # 2016; Korthikanti et al. 2022, sec. 4), as the memory model counts. The checkpoint sits
        # inside ``forward``, so a compiled block compiles it too (one graph; the compiler's
        # partitioner places the recomputation in the compiled backward) instead of checkpointing a
        # compiled forward from outside (a second call of the forward graph under saved-tensor
        # hooks; measured 9-11% slower than predicted on 4 GPUs). Selective recomputation keeps
        # everything but the attention core's own tensors and re-runs ``_attend`` alone in backward
        # (Korthikanti et al. 2022, sec. 5); ``_attend`` sits between the column- and row-parallel
        # layers, so under tensor parallelism it re-runs no all-reduce.
        self.recompute = RecomputeMode.NONE

    @property
    def recompute(self) -> RecomputeMode:
        return self._recompute

    @recompute.setter
    def recompute(self, value) -> None:
        self._recompute = mode_of(value)  # a mode, its name, or a bool (True: full, False: none)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute is RecomputeMode.FULL and torch.is_grad_enabled():
            return checkpoint(self.layers, x, use_reentrant=False)
        return self.layers(x)

    def layers(self, x: torch.Tensor) -> torch.Tensor:
        """The block's computation: attention, then the MLP, each with its residual."""
        qkv = self.qkv(self.enter(self.norm1(x)))
        if self.recompute is RecomputeMode.SELECTIVE and torch.is_grad_enabled():
            core = checkpoint(_attend, qkv, self.heads, self.rotary, use_reentrant=False)
        else:
            core = _attend(qkv, self.heads, self.rotary)
        x = x + self.proj(core)
        y = self.enter(self.norm2(x))
        y = _activate(self.fc1(y), self.gate(y) if self.gated else None)
        return x + self.fc2(y)


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def _attend(qkv: torch.Tensor, heads: int, rotary: bool) -> torch.Tensor:
    """Causal self-attention from the fused q, k, v projection, heads merged back."""
    b, s, h3 = qkv.shape
    h = h3 // 3
    q, k, v = qkv.view(b, s, 3, heads, h // heads).permute(2, 0, 3, 1, 4)
    if rotary:
        q, k = _rotary(q), _rotary(k)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, h)


def _activate(up: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
    return F.silu(gate) * up if gate is not None else F.gelu(up)


class StageModule(nn.Module):
    """Layers ``[first, end)`` of the model; the first stage embeds tokens, the last returns logits."""

    def __init__(self, spec, first: int, end: int, *, recompute: bool | str = False, padded_logits: bool = False):
        super().__init__()
        recompute = mode_of(recompute)  # a bool (False: none, True: full) or a mode's name
        self.spec, self.recompute, self.padded_logits = spec, recompute, padded_logits
        self.head_linear = F.linear  # the LM head's product (``planner.runtime.split_backward`` may replace it)
        self.first, self.end = first, end
        self.is_first, self.is_last = first == 0, end == spec.layers
        if self.is_first:
            self.embed = nn.Embedding(padded_vocabulary(spec.vocabulary), spec.hidden)
            if spec.learned_positions:
                self.positions = nn.Embedding(spec.sequence, spec.hidden)
        self.blocks = nn.ModuleDict({str(i): Block(spec) for i in range(first, end)})
        for block in self.blocks.values():
            block.recompute = recompute
        if self.is_last:
            self.norm = make_norm(spec, spec.hidden)
            if not (spec.tied_embeddings and self.is_first):
                self.head = nn.Linear(spec.hidden, head_rows(spec), bias=False)

    @property
    def tied_copy(self) -> bool:
        """True where this stage holds a second copy of the tied embedding (last stage, S > 1)."""
        return self.is_last and not self.is_first and self.spec.tied_embeddings

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.is_first:
            tokens = x
            x = self.embed(tokens)
            if self.spec.learned_positions:
                x = x + self.positions(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks.values():
            x = block(x)
        if self.is_last:
            weight = self.embed.weight if not hasattr(self, "head") else self.head.weight
            if self.spec.head == "classification":  # the last position's hidden state
                x = x[:, -1]
            x = self.head_linear(self.norm(x), weight)
            if not self.padded_logits:  # the caller's loss drops them otherwise (``vocabulary_logits``)
                x = vocabulary_logits(x, self.spec)
        return x


class ChunkedStage(nn.Module):
    """A device's model chunks under interleaved 1F1B (``chunks[c]``: a ``StageModule`` of chunk c's
    layers). Its parameters carry the names a ``StageModule`` gives them (``embed``, ``blocks.<layer>``,
    ``norm``, ``head``), so state dicts and checkpoints stay keyed by layer; ``forward(x, chunk)``
    runs one chunk."""

    def __init__(self, chunks: list):
        super().__init__()
        first, last = chunks[0], chunks[-1]
        self.spec = first.spec
        self.is_first, self.is_last = first.is_first, last.is_last
        object.__setattr__(self, "chunks", list(chunks))  # the modules below own the parameters
        if first.is_first:
            self.embed = first.embed
            if hasattr(first, "positions"):
                self.positions = first.positions
        self.blocks = nn.ModuleDict({k: block for chunk in chunks for k, block in chunk.blocks.items()})
        if last.is_last:
            self.norm = last.norm
            if hasattr(last, "head"):
                self.head = last.head

    @property
    def tied_copy(self) -> bool:
        return self.chunks[-1].tied_copy

    def forward(self, x: torch.Tensor, chunk: int) -> torch.Tensor:
        return self.chunks[chunk](x)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``logits`` (batch, sequence, vocabulary; or batch, classes) against
    ``targets``, taken in fp32 whatever the logits' precision (as Megatron-LM does)."""
    return F.cross_entropy(logits.float().flatten(0, -2), targets.flatten())


def head_rows(spec) -> int:
    """Rows of the head's weight: the padded vocabulary, or a classification head's classes."""
    return spec.classes if spec.head == "classification" else padded_vocabulary(spec.vocabulary)


# Inductor writes a kernel's output over an input it no longer needs, and hands a buffer past its
# last use to a later tensor: a split linear layer's backward (``planner.runtime.split_backward``)
# keeps its input and output gradient for the weight pass, which the compiled graph cannot see, so
# the blocks of a split backward compile without either (a reused buffer changed the deferred
# gradients by up to 0.24 on the tiny model: ``tests/test_zero_bubble.py``).
SPLIT_BACKWARD_OPTIONS = {"inplace_buffers": False, "allow_buffer_reuse": False}


def compile_split_stage(module: "StageModule"):
    """Compile each block of ``module`` whole, as ``compile_stage`` does (identical blocks share one
    graph), for a split backward (ZB-H1): its linear layers are ``split_linear``, whose backward is
    an op the compiler calls as it is, deferring the weights' gradients
    (``planner.runtime.split_backward.defer_weight_gradients`` routes them, before or after this);
    returns the compiled ``lm_loss``. One graph a block: the host issues a block's forward in one
    call instead of five compiled pieces and four eager products."""
    for block in module.blocks.values():
        block.compile(options=SPLIT_BACKWARD_OPTIONS)
    return torch.compile(lm_loss)


def compile_stage(module: "StageModule", *, graphs: bool = False):
    """Compile each block of ``module`` in place with ``torch.compile`` (parameter names and the
    state dict unchanged; identical blocks share one graph) and return the compiled ``lm_loss``,
    whose fp32 cast fuses into the softmax instead of writing fp32 logits. On one H100 a GPT-3 XL
    block's forward + backward at micro-batch 2 takes 2.78 ms instead of 2.96 ms
    (``benchmarks/runtime_parts.py``). With ``graphs`` each block's forward and backward replay as
    CUDA graphs (``mode="reduce-overhead"``: torch's CUDA graph trees, one recording per block and
    micro-batch in flight, all-reduces of a tensor group included), so the host issues one graph
    instead of a block's kernels; the caller marks each iteration's start
    (``torch.compiler.cudagraph_mark_step_begin``), after which the last iteration's graph outputs
    may be overwritten."""
    for block in module.blocks.values():
        block.compile(mode="reduce-overhead" if graphs else None)
    return torch.compile(lm_loss)


def vocabulary_logits(logits: torch.Tensor, spec) -> torch.Tensor:
    """The logits of the real vocabulary (a view): the padded rows' columns dropped (a classification
    head's logits as they are)."""
    return logits if spec.head == "classification" else logits[..., :spec.vocabulary]


def _init(module: nn.Module, seed: int, rows: int | None = None) -> None:
    """Biases 0, norm scales 1, matrices N(0, INIT_STD) drawn from ``seed``; with ``rows`` (a
    padded vocabulary's true size) the rows past it are zero."""
    generator = torch.Generator().manual_seed(seed)
    for name, parameter in module.named_parameters(recurse=True):
        with torch.no_grad():
            if name.endswith("bias"):
                parameter.zero_()
            elif parameter.dim() == 1:
                parameter.fill_(1.0)
            else:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * INIT_STD)
                if rows is not None:
                    parameter[rows:].zero_()


def build_stage(spec, first: int, end: int, *, seed: int = 0, recompute: bool | str = False,
                padded_logits: bool = False) -> StageModule:
    """The stage holding layers ``[first, end)``, initialised deterministically (CPU, fp32);
    ``recompute``: what its blocks recompute in backward, a ``RecomputeMode`` or its name, or a bool
    (True: full, False: none; ``planner.plan.recompute.mode_of``); ``padded_logits``: the last
    stage returns the padded vocabulary's logits (contiguous) for a loss that drops them itself."""
    module = StageModule(spec, first, end, recompute=recompute, padded_logits=padded_logits)
    base = seed * 1_000_003
    if module.is_first:
        _init(module.embed, base, rows=spec.vocabulary)
        if spec.learned_positions:
            # Positions draw after the token embedding from the same stream as in every stage layout.
            generator = torch.Generator().manual_seed(base + spec.layers + 2)
            with torch.no_grad():
                module.positions.weight.copy_(torch.randn(module.positions.weight.shape, generator=generator)
                                              * INIT_STD)
    for i in range(first, end):
        _init(module.blocks[str(i)], base + i + 1)
    if module.is_last:
        _init(module.norm, base + spec.layers + 1)
        if hasattr(module, "head"):
            if spec.tied_embeddings:
                _init(module.head, base, rows=spec.vocabulary)  # the same draw as the first stage's embedding
            else:
                _init(module.head, base + spec.layers + 3, rows=spec.vocabulary)
    return module
