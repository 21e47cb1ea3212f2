"""One worker's training iteration: the planner's op list for its (replica, stage), executed.

GPipe and 1F1B are not written here: ``cost_models.schedule.stage_ops`` gives the ordered ops
(the ones the simulator times) and this module runs them with point-to-point sends and receives,
then the stage's gradient all-reduce and the optimizer step. The loss of each micro-batch is divided
by the total number of micro-batches of all replicas and gradients are summed, so the update equals
that of the whole global batch whatever each replica's share (Narayanan et al. 2021, sec. 2.2).
"""

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from cost_models.schedule import stage_ops
from planner.runtime.compression import decode_int8, encode_int8, int8_wire_shapes
from planner.runtime.data import global_batch_tokens, micro_batch_rows
from planner.runtime.emulation import Emulator, now_s, sleep_until
from planner.runtime.gpt import lm_loss
from planner.runtime.powersgd import PowerSGD

__all__ = ["Layout", "StageGroups", "make_groups", "split_parameters", "StageExecutor", "BUCKET_BYTES"]

BUCKET_BYTES = 64 * 2**20  # gradient all-reduce bucket (Li et al. 2020, PyTorch DDP, sec. 3.2.3)


@dataclass(frozen=True)
class Layout:
    """Logical ranks: ``rank = replica * stages + stage``, so every group is ordered by the plan."""

    stages: int
    replicas: int

    def rank(self, replica: int, stage: int) -> int:
        return replica * self.stages + stage

    def position(self, rank: int) -> tuple:
        return divmod(rank, self.stages)

    @property
    def world(self) -> int:
        return self.stages * self.replicas


@dataclass(frozen=True)
class StageGroups:
    stage: object  # this stage's replicas (gradient sync)
    embedding: object  # first and last stages of every replica when the embedding is tied; else None
    replica_embedding: object = None  # with local steps: this replica's first and last stage only


def make_groups(layout: Layout, stage: int, tied: bool, *, local_steps: bool = False) -> StageGroups:
    """Create every group on every rank in the same order (torch.distributed requires it). With
    ``local_steps`` the tied embedding's two copies also get a group per replica: between syncs a
    replica's copies stay equal without reaching the other replicas."""
    S, R = layout.stages, layout.replicas
    stage_groups = [dist.new_group([layout.rank(r, s) for r in range(R)]) for s in range(S)]
    embedding = replica_embedding = None
    if tied and S > 1:
        embedding = dist.new_group(sorted(layout.rank(r, s) for r in range(R) for s in (0, S - 1)))
        if local_steps:
            pairs = [dist.new_group([layout.rank(r, 0), layout.rank(r, S - 1)]) for r in range(R)]
            replica_embedding = pairs[layout.position(dist.get_rank())[0]]
    return StageGroups(stage=stage_groups[stage], embedding=embedding, replica_embedding=replica_embedding)


class _Timer:
    """Marks on the host clock, or CUDA events on the compute stream (no synchronisation per op)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return now_s()

    def seconds(self, marks: list) -> list:
        if self.cuda:
            torch.cuda.synchronize()
            return [marks[0].elapsed_time(m) / 1e3 for m in marks]
        return [m - marks[0] for m in marks]


def split_parameters(module, stages: int) -> tuple:
    """(the stage's own parameters, synced over its replicas; the tied embedding's copy on the first
    or last stage, synced over the embedding group and never sharded)."""
    tied = module.spec.tied_embeddings and stages > 1
    shared = []
    if tied and module.is_first:
        shared.append(module.embed.weight)
    if tied and module.tied_copy:
        shared.append(module.head.weight)
    ids = {id(p) for p in shared}
    return [p for p in module.parameters() if id(p) not in ids], shared


class StageExecutor:
    """Runs iterations of one (replica, stage) of ``plan`` on ``module``."""

    def __init__(self, *, module, optimizer, plan, layout: Layout, replica: int, stage: int, device: torch.device,
                 groups: StageGroups, seed: int, dtype=torch.float32,
                 emulator: Emulator | None = None, loss=lm_loss, local_steps=None):
        self.module, self.optimizer, self.plan = module, optimizer, plan
        self.layout, self.replica, self.stage, self.device = layout, replica, stage, device
        self.groups, self.seed, self.emulator = groups, seed, emulator
        self.dtype = dtype  # weights, activations and messages; the loss is taken in fp32
        self.loss = loss  # lm_loss, or its compiled form
        self.ops = stage_ops(plan.schedule, stage, layout.stages, plan.micro_batches[replica],
                             plan.micro_batches_per_round)
        self.total_micro_batches = sum(plan.micro_batches)
        spec = module.spec
        self.boundary_shape = (plan.micro_batch_size, spec.sequence, spec.hidden)
        self.stage_parameters, self.embedding_parameters = split_parameters(module, layout.stages)
        self.timer = _Timer(device)
        self.loss_scale = 1.0
        # Local steps (``planner.runtime.local_steps``): no data-parallel all-reduce; each replica's
        # gradient is the mean over its own micro-batches, as if it trained alone.
        self.local_steps = local_steps
        self.sync_bytes = 0  # message bytes handed to the data-parallel gradient sync, all iterations
        # Messages to the neighbouring stages: block-wise int8 across the boundaries the plan
        # compresses; bytes of the tensors sent (all iterations), counted as they are handed to isend.
        self.int8_to = {peer: plan.compression.compresses(min(stage, peer)) for peer in (stage - 1, stage + 1)}
        self.message_bytes = 0
        # PowerSGD on the stage's gradient sync (its matrices; the rest all-reduced whole).
        self.powersgd = PowerSGD(self.stage_parameters, rank=plan.compression.rank, group=groups.stage,
                                 device=device, seed=seed + stage) \
            if plan.compression.gradients == "powersgd" and layout.replicas > 1 else None
        self.embedding_powersgd = PowerSGD(self.embedding_parameters, rank=plan.compression.rank,
                                           group=groups.embedding, device=device, seed=seed + layout.stages) \
            if self.powersgd is not None and groups.embedding is not None and self.embedding_parameters else None

    @property
    def gradient_divisor(self) -> int:
        """What each micro-batch's loss is divided by before backward: all replicas' micro-batches
        (the gradients are then summed over them), or with local steps this replica's own."""
        return self.plan.micro_batches[self.replica] if self.local_steps is not None else self.total_micro_batches

    # -- one iteration -------------------------------------------------------------------------
    def batch(self, index: int):
        """Iteration ``index``'s tokens on this worker's device (first and last stages; else None), as
        an input pipeline prefetches them: the caller loads them before timing the iteration. One copy
        per iteration: a copy per micro-batch from pageable memory would stall the host until the
        device drains, every micro-batch."""
        m = self.module
        if not (m.is_first or m.is_last):
            return None
        return global_batch_tokens(self.seed, index, self.plan.global_batch, m.spec.sequence,
                                   m.spec.vocabulary).to(self.device)

    def iteration(self, index: int, tokens=None) -> tuple:
        """Run iteration ``index`` (``tokens``: its ``batch``, loaded here when not given); returns
        (this rank's share of the loss, [(kind, mb, start_s, end_s)])."""
        m = self.module
        if tokens is None:
            tokens = self.batch(index)
        inputs, outputs, grads, pending = {}, {}, {}, []
        self.loss_scale = getattr(self.optimizer, "loss_scale", 1.0)  # fp16: fixed for the iteration
        loss_sum = torch.zeros((), device=self.device)
        marks, done = [self.timer.mark()], []
        for kind, mb in self.ops:
            start = now_s()
            if kind == "fwd":
                rows = micro_batch_rows(self.plan.micro_batches, self.plan.micro_batch_size, self.replica, mb)
                x = tokens[rows, :-1] if m.is_first else inputs[mb]
                y = m(x)
                if m.is_last:
                    targets = tokens[rows, 1:]
                    loss = self.loss(y, targets)
                    y = loss / self.total_micro_batches
                    loss_sum += y.detach()
                    if self.gradient_divisor != self.total_micro_batches:
                        y = loss / self.gradient_divisor
                outputs[mb] = y
                self._emulate_compute("fwd", start)
            elif kind == "bwd":
                y = outputs.pop(mb)
                if m.is_last:
                    (y * self.loss_scale if self.loss_scale != 1.0 else y).backward()
                else:
                    torch.autograd.backward(y, grad_tensors=grads.pop(mb))
                self._emulate_compute("bwd", start)
            elif kind == "send_fwd":
                pending += self._send(outputs[mb].detach(), self.stage + 1, start)
            elif kind == "send_bwd":
                pending += self._send(inputs.pop(mb).grad, self.stage - 1, start)
            elif kind == "recv_fwd":
                inputs[mb] = self._recv(self.stage - 1).requires_grad_()
            elif kind == "recv_bwd":
                grads[mb] = self._recv(self.stage + 1)
            elif kind == "sync":
                for work, _ in pending:
                    work.wait()
                pending = []
                self._sync(start)
            elif kind == "step":
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                self._emulate_compute("step", start)
            marks.append(self.timer.mark())
            done.append((kind, mb))
        times = self.timer.seconds(marks)
        trace = [(kind, mb, times[i], times[i + 1]) for i, (kind, mb) in enumerate(done)]
        return float(loss_sum), trace

    # -- pieces --------------------------------------------------------------------------------
    def _emulate_compute(self, kind: str, start_s: float) -> None:
        if self.emulator is not None:
            sleep_until(self.emulator.compute_end_s(kind, start_s))

    def _send(self, tensor: torch.Tensor, peer_stage: int, ready_s: float) -> list:
        peer = self.layout.rank(self.replica, peer_stage)
        wire = encode_int8(tensor) if self.int8_to[peer_stage] else (tensor.contiguous(),)
        works = [(dist.isend(part, peer), part) for part in wire]
        self.message_bytes += sum(part.numel() * part.element_size() for part in wire)
        if self.emulator is not None:
            stamp = torch.tensor([self.emulator.deliver_at_s(peer_stage, ready_s)], dtype=torch.float64)
            works.append((dist.isend(stamp, peer), stamp))
        return works

    def _recv(self, peer_stage: int) -> torch.Tensor:
        peer = self.layout.rank(self.replica, peer_stage)
        if self.int8_to[peer_stage]:
            values, blocks = int8_wire_shapes(math.prod(self.boundary_shape))
            codes = torch.empty(values, dtype=torch.int8, device=self.device)
            scales = torch.empty(blocks, dtype=torch.float32, device=self.device)
            dist.irecv(codes, peer).wait()
            dist.irecv(scales, peer).wait()
            buffer = decode_int8(codes, scales, self.boundary_shape, self.dtype)
        else:
            buffer = torch.empty(self.boundary_shape, dtype=self.dtype, device=self.device)
            dist.irecv(buffer, peer).wait()
        if self.emulator is not None:
            stamp = torch.zeros(1, dtype=torch.float64)
            dist.irecv(stamp, peer).wait()
            sleep_until(float(stamp[0]))
        return buffer

    def _sync(self, ready_s: float) -> None:
        """Sum gradients over the stage's replicas (and the tied embedding's two copies)."""
        end_s = None
        if self.emulator is not None and self.layout.replicas > 1:
            ready = torch.tensor([ready_s], dtype=torch.float64)
            dist.all_reduce(ready, op=dist.ReduceOp.MAX, group=self.groups.stage)
            end = torch.tensor([self.emulator.sync_end_s(float(ready[0])) if self.replica == 0 else 0.0],
                               dtype=torch.float64)
            dist.all_reduce(end, op=dist.ReduceOp.MAX, group=self.groups.stage)
            end_s = float(end[0])
        sharded = getattr(self.optimizer, "sharded", None)
        if sharded is not None:
            self.sync_bytes += sum(p.numel() * p.element_size() for p in self.stage_parameters)
            sharded.reduce_scatter()  # ZeRO stage 1: each replica gets its own shard's sum
        elif self.powersgd is not None and self.local_steps is None:
            self.sync_bytes += self.powersgd.reduce(self.loss_scale)
            self.sync_bytes += _all_reduce_sum(self.powersgd.whole, self.groups.stage)
        elif self.layout.replicas > 1 and self.local_steps is None:
            self.sync_bytes += _all_reduce_sum(self.stage_parameters, self.groups.stage)
        if self.groups.embedding is not None and self.embedding_parameters:
            local = self.local_steps is not None and self.groups.replica_embedding is not None
            group = self.groups.replica_embedding if local else self.groups.embedding
            if self.embedding_powersgd is not None:  # the tied embedding's copies, compressed too
                self.embedding_powersgd.reduce(self.loss_scale)
                _all_reduce_sum(self.embedding_powersgd.whole, group)
            else:
                _all_reduce_sum(self.embedding_parameters, group)
        if end_s is not None:
            sleep_until(end_s)


def _all_reduce_sum(parameters: list, group) -> int:
    """Sum the gradients of ``parameters`` over ``group`` in buckets of at most ``BUCKET_BYTES``;
    returns the bytes handed to the all-reduce."""
    bucket, size, total = [], 0, 0
    for p in parameters:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        bucket.append(p.grad)
        size += p.grad.numel() * p.grad.element_size()
        if size >= BUCKET_BYTES:
            _reduce_bucket(bucket, group)
            bucket, size, total = [], 0, total + size
    if bucket:
        _reduce_bucket(bucket, group)
    return total + size


def _reduce_bucket(grads: list, group) -> None:
    flat = _flatten_dense_tensors(grads)
    dist.all_reduce(flat, group=group)
    for grad, reduced in zip(grads, _unflatten_dense_tensors(flat, grads)):
        grad.copy_(reduced)
