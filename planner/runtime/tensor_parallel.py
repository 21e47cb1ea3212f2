"""Tensor parallelism in the runtime: a stage's blocks split over its tensor group (Megatron-LM,
Shoeybi et al. 2019, sec. 3), as ``planner.plan.tensor`` and the cost model count it.

Each member keeps, of every block: the rows of the fused QKV projection that belong to its
``heads / t`` heads (q, k and v of the same heads, so the block's ``view`` into heads is unchanged),
the matching columns of the output projection, the rows of fc1 (and of the gate with SwiGLU) and the
columns of fc2; the column-parallel layers' biases are split with their rows, the row-parallel
layers' biases, the norms, the embeddings and the head stay whole on every member (as
``cost_models.flops.tensor_split_parameters`` counts). A block then runs Megatron's two operators
twice: ``f`` (identity forward, all-reduce of the gradient backward) on the output of each norm
(the block's ``enter`` seam, so it holds whether the norms run as modules or compiled),
``g`` (all-reduce forward, identity backward) on the output of the attention projection and of fc2,
before their biases: 2 all-reduces of the ``(b, s, h)`` activation in forward and 2 in backward
(``cost_models.comm.tensor_allreduces``; with full recomputation the forward's two run again in
backward, with selective recomputation none: the attention core it re-runs lies between them).
Every member ends a block with the same activation, so the whole-on-every-member parameters would
get the same gradient on every member: only the lead (member 0) trains them (``follow_lead``: the
other members sync and step nothing of them and receive them from the lead after each step, inside
the host, into a flat buffer their copies are views of; they take no gradient of them, except the
first stage's embeddings, whose output must require one so that every member runs the same
backward and the same all-reduces), so a stage's data-parallel sync moves its split part once
per member and its whole part once, the whole stage as the cost model times it. ``f`` sums the
incoming gradient and ``g`` the row-parallel product in place (as Megatron-LM's ``_reduce``): autograd
reads neither again. Pipeline messages
go between leads (``planner.runtime.engine``).

The two operators are written here (as Megatron-LM's ``copy_to_tensor_model_parallel_region`` and
``reduce_from_tensor_model_parallel_region``) rather than taken from
``torch.distributed.tensor.parallel.parallelize_module``: its ``ColwiseParallel``/``RowwiseParallel``
turn the weights into ``DTensor`` parameters, while everything after the forward in this runtime
acts on plain tensors: ZeRO-1 re-points ``p.data`` and ``p.grad`` into flat buffers
(``planner.runtime.sharded``), the fp32 master weights copy chunks with ``torch._foreach_copy_``
(``precision``), the gradient sync and DiLoCo flatten buckets (``engine``, ``local_steps``), and the
checkpoint saves tensors by name. Each would need a ``to_local`` adapter or private ``_local_tensor``
access; with local shards as ordinary ``nn.Linear`` parameters they run unchanged. The fused QKV
weight would also need its rows permuted before ``Shard(0)`` to keep a head's q, k and v together.
Parameter names and ``state_dict`` keys are the unsplit model's; ``full_state`` gathers the whole
weights back on the lead (every member takes part), and a checkpoint holds whole tensors (``join_entries`` on
saving, ``split_entries`` on resuming), so plans with and without groups resume each other.
The all-reduces are torch's functional collectives, so ``plan launch --compile`` compiles a split
block into one graph, all-reduces included. Eager, a member's block at degree 4 is a quarter of the
GPU work under the same number of kernel launches: on 4x H200 the eager GPT-3 XL run at
micro-batch 2 spent 1.46 s of CPU per 1.06 s of GPU time per iteration (``plan launch --profile``),
the all-reduce kernels waiting on the slowest member's launches.
"""

import functools

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

__all__ = ["shard_stage", "full_state", "whole_parameters", "follow_lead", "broadcast_whole", "join_entries",
           "split_entries", "copy_to_group", "reduce_from_group", "RowParallelLinear"]

_COLUMN = ("fc1", "gate")  # split by output rows (weight and bias)
_ROW = ("proj", "fc2")  # split by input columns (bias whole, added after the all-reduce)
_EMBEDDINGS = ("embed.", "positions.")  # the first stage's token and position embeddings


def _all_reduce(x: torch.Tensor, group_name: str) -> torch.Tensor:
    """The sum of ``x`` over the group, as a new tensor: torch's functional collective (the
    ``_c10d_functional`` ops), which ``torch.compile`` traces into the block's graph instead of
    breaking it, and which leaves ``x`` as it was (no defensive clone)."""
    return torch.ops._c10d_functional.wait_tensor(torch.ops._c10d_functional.all_reduce(x.contiguous(), "sum",
                                                                                          group_name))


class _CopyToGroup(torch.autograd.Function):
    """Megatron's ``f``: identity in forward, all-reduce of the gradient in backward."""

    @staticmethod
    def forward(ctx, x, group_name):
        ctx.group_name = group_name
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, ctx.group_name), None


class _ReduceFromGroup(torch.autograd.Function):
    """Megatron's ``g``: all-reduce in forward, identity in backward."""

    @staticmethod
    def forward(ctx, x, group_name):
        return _all_reduce(x, group_name)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def copy_to_group(x: torch.Tensor, group) -> torch.Tensor:
    return _CopyToGroup.apply(x, group.group_name)


def reduce_from_group(x: torch.Tensor, group) -> torch.Tensor:
    return _ReduceFromGroup.apply(x, group.group_name)


class RowParallelLinear(nn.Module):
    """A row-parallel linear layer: this member's input columns of the weight, the output summed
    over the group, then the (whole) bias. Parameters named as ``nn.Linear``'s."""

    def __init__(self, weight: torch.Tensor, bias, group):
        super().__init__()
        self.group = group
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(bias) if bias is not None else None
        self.matmul = F.linear  # ``planner.runtime.split_backward`` may defer its weight gradient

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = reduce_from_group(self.matmul(x, self.weight), self.group)
        return y + self.bias if self.bias is not None else y


def _linear(weight: torch.Tensor, bias) -> nn.Linear:
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")  # no init drawn
    layer.weight = nn.Parameter(weight.clone())
    if bias is not None:
        layer.bias = nn.Parameter(bias.clone())
    return layer


def _qkv_rows(h: int, member: int, degree: int) -> torch.Tensor:
    """Rows of the fused ``(3h, h)`` QKV weight of ``member``'s heads: its q rows, then k, then v."""
    width = h // degree
    own = torch.arange(member * width, (member + 1) * width)
    return torch.cat([own, own + h, own + 2 * h])


def _share(layer: str, whole: torch.Tensor, member: int, degree: int) -> torch.Tensor:
    """``member``'s share of a split tensor of ``layer`` (``qkv``, a column- or a row-parallel
    layer's weight, or a column-parallel layer's bias), a view where the cut allows: the one place
    the cuts are written (``shard_stage`` and a checkpoint's ``split_entries`` use it)."""
    if layer == "qkv":
        return whole[_qkv_rows(whole.shape[0] // 3, member, degree)]
    axis = 0 if layer in _COLUMN else 1
    width = whole.shape[axis] // degree
    return whole.narrow(axis, member * width, width)


def shard_stage(module, group, member: int, degree: int):
    """Split every block of ``module`` (a ``StageModule``, whole, CPU) in place to ``member``'s
    share of a tensor group ``group`` of ``degree``; returns ``module``."""
    with torch.no_grad():
        for block in module.blocks.values():
            for name in ("qkv",) + _COLUMN:
                if hasattr(block, name):
                    layer = getattr(block, name)
                    bias = _share(name, layer.bias, member, degree) if layer.bias is not None else None
                    setattr(block, name, _linear(_share(name, layer.weight, member, degree), bias))
            for name in _ROW:
                layer = getattr(block, name)
                bias = layer.bias.clone() if layer.bias is not None else None
                setattr(block, name, RowParallelLinear(_share(name, layer.weight, member, degree).clone(), bias,
                                                       group))
            block.heads //= degree
            block.enter = functools.partial(copy_to_group, group=group)
    return module


def _is_split(name: str) -> bool:
    """Whether parameter ``name`` (of a ``StageModule``) is divided among a group's members."""
    if not name.startswith("blocks."):
        return False
    layer, kind = name.split(".")[-2:]
    return layer in ("qkv",) + _COLUMN or (layer in _ROW and kind == "weight")


def whole_parameters(module) -> list:
    """The parameters every member keeps whole (norms, row-parallel biases, embeddings, head), in
    the module's order."""
    return [p for name, p in module.named_parameters() if not _is_split(name)]


def follow_lead(module) -> None:
    """On a member other than the lead: mark its whole parameters ``follows_lead`` (left out of
    the optimizer and the sync; the lead's are broadcast to it after each step, ``broadcast_whole``)
    and take no gradient of them (the broadcast overwrites them), except the first stage's
    embeddings: their output must require a gradient so that the first block's ``f`` runs its
    backward all-reduce on every member, as on the lead."""
    for name, p in module.named_parameters():
        if not _is_split(name):
            p.follows_lead = True
            p.requires_grad_(name.startswith(_EMBEDDINGS) and module.is_first)


class _WholeBuffer:
    """A member's whole parameters as consecutive views of one flat tensor, which the lead
    broadcasts and the others receive into, in place. A parameter that is already a view of
    another buffer (ZeRO-1's flat weights, ``planner.runtime.sharded``) stays there and is copied
    into the flat tensor before the broadcast (on the lead) or out of it after (elsewhere)."""

    def __init__(self, parameters: list):
        self.parameters = parameters
        first = parameters[0]
        assert all(p.dtype == first.dtype and p.device == first.device for p in parameters)
        self.flat = torch.empty(sum(p.numel() for p in parameters), dtype=first.dtype, device=first.device)
        self.copied = []
        start = 0
        for p in parameters:
            view = self.flat[start:start + p.numel()].view_as(p)
            start += p.numel()
            view.copy_(p.detach())
            if p.untyped_storage().nbytes() == p.numel() * p.element_size():  # its own storage: move it
                p.data = view
            else:
                self.copied.append((p, view))

    def holds(self, parameters: list) -> bool:
        return len(parameters) == len(self.parameters) and all(a is b for a, b in zip(parameters, self.parameters))


@torch.no_grad()
def broadcast_whole(module, group, lead_rank: int) -> None:
    """The lead's whole parameters, after its step, to every member of ``group`` (one message of a
    flat buffer the parameters are views of, kept on ``module`` from the first call)."""
    parameters = whole_parameters(module)
    buffer = getattr(module, "_whole_buffer", None)
    if buffer is None or not buffer.holds(parameters):
        buffer = module._whole_buffer = _WholeBuffer(parameters)
    lead = dist.get_rank() == lead_rank
    if lead and buffer.copied:
        torch._foreach_copy_([view for _, view in buffer.copied], [p.detach() for p, _ in buffer.copied])
    dist.broadcast(buffer.flat, lead_rank, group=group)
    if not lead and buffer.copied:
        torch._foreach_copy_([p.detach() for p, _ in buffer.copied], [view for _, view in buffer.copied])
    for p in parameters:
        if getattr(p, "follows_lead", False):
            p.grad = None


def _join(name: str, parts: list, degree: int) -> torch.Tensor:
    """The whole tensor ``name`` (a ``state_dict`` key) from its ``degree`` shards."""
    layer, kind = name.split(".")[-2:]
    if layer == "qkv":  # each shard: (3, h/t, ...) of its heads
        return torch.cat([p.view(3, -1, *p.shape[1:]) for p in parts], dim=1).flatten(0, 1)
    if layer in _COLUMN:
        return torch.cat(parts, dim=0)
    assert layer in _ROW and kind == "weight", name
    return torch.cat(parts, dim=1)


def _split(name: str, whole: torch.Tensor, member: int, degree: int) -> torch.Tensor:
    """``member``'s share of the whole tensor ``name`` (the inverse of ``_join``)."""
    return _share(name.split(".")[-2], whole, member, degree)


def _map_entry(name: str, entries: list, combine) -> dict:
    """A checkpoint entry ({"weight", "state"}) of ``name`` made by ``combine`` from ``entries``'
    weights and per-element state tensors; scalars are the first entry's."""
    state = {k: (combine([e["state"][k] for e in entries]) if torch.is_tensor(v) and v.dim() > 0 else v)
             for k, v in entries[0]["state"].items()}
    return {"weight": combine([e["weight"] for e in entries]), "state": state}


def join_entries(entries: dict, group, degree: int, lead_rank: int, member: int):
    """Checkpoint entries (``planner.runtime.checkpoint``: name -> fp32 weight and optimizer state)
    of a whole tensor group, on its lead (None on the other members, which send their shares):
    the split tensors joined, the whole ones the lead's. Every member calls it."""
    split = {name: entry for name, entry in entries.items() if _is_split(name)}
    gathered = [None] * degree if member == 0 else None
    dist.gather_object(split, gathered, dst=lead_rank, group=group)
    if member:
        return None
    joined = dict(entries)
    for name in split:
        joined[name] = _map_entry(name, [shares[name] for shares in gathered], lambda parts: _join(name, parts, degree))
    return joined


def split_entries(entries: dict, member: int, degree: int) -> dict:
    """Whole checkpoint entries cut to ``member``'s share (the whole-on-every-member ones as they are)."""
    return {name: (_map_entry(name, [entry], lambda parts: _split(name, parts[0], member, degree).clone())
                   if _is_split(name) else entry) for name, entry in entries.items()}


def full_state(module, group, degree: int, lead_rank: int, member: int) -> dict | None:
    """``module``'s ``state_dict`` with the split blocks' tensors gathered whole (CPU) on the lead
    (None on the other members, which send their shares); every member of ``group`` must call it."""
    state = {}
    for name, value in module.state_dict().items():
        value = value.detach()
        if _is_split(name):
            parts = [torch.empty_like(value) for _ in range(degree)] if member == 0 else None
            dist.gather(value.contiguous(), parts, dst=lead_rank, group=group)
            if member:
                continue
            value = _join(name, parts, degree)
        state[name] = value.cpu()
    return state if member == 0 else None
