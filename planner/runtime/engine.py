"""One worker's training iteration: the planner's op list for its (replica, stage), executed.

GPipe, 1F1B (interleaved too) and ZB-H1 are not written here: ``cost_models.schedule.stage_ops`` gives the ordered ops
(the ones the simulator times) and this module runs them with point-to-point sends and receives,
then the stage's gradient all-reduce and the optimizer step. Under interleaved 1F1B the module is a
``ChunkedStage`` and each op names the chunk it runs; its messages go to the stage after (or before)
in the ring of stages (``cost_models.schedule.peer_stage``). The loss of each micro-batch is divided
by the total number of micro-batches of all replicas and gradients are summed, so the update equals
that of the whole global batch whatever each replica's share (Narayanan et al. 2021, sec. 2.2).
"""

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from cost_models.schedule import Schedule, peer_stage, stage_ops
from planner.runtime.compression import decode_int8, encode_int8, int8_wire_shapes
from planner.runtime.data import global_batch_tokens, micro_batch_rows, training_inputs, training_targets
from planner.runtime.emulation import Emulator, now_s, sleep_until
from planner.runtime.gpt import lm_loss
from planner.runtime.gradient_sync import SyncRoute, ring_member_bytes, sum_over_route
from planner.runtime.powersgd import PowerSGD
from planner.runtime.split_backward import defer_weight_gradients
from planner.runtime.tensor_parallel import broadcast_whole

__all__ = ["Layout", "StageGroups", "make_groups", "split_parameters", "StageExecutor", "BUCKET_BYTES"]

BUCKET_BYTES = 64 * 2**20  # gradient all-reduce bucket (Li et al. 2020, PyTorch DDP, sec. 3.2.3)


@dataclass(frozen=True)
class Layout:
    """Logical ranks: ``rank = replica * stages + stage``, so every group is ordered by the plan.

    With tensor groups, stage ``s`` of every replica runs on ``degrees[s]`` ranks (members
    ``0..degrees[s]-1``, member 0 the group's lead): ``rank = replica * width + offset[s] + member``,
    ``width`` the sum of the degrees; without them (``degrees`` empty) this is the rule above."""

    stages: int
    replicas: int
    degrees: tuple = ()  # per stage: its tensor degree (the same for every replica); () = all 1

    @classmethod
    def of_plan(cls, plan) -> "Layout":
        degrees = tuple(plan.tensor_degree(0, s) for s in range(plan.stages))
        return cls(stages=plan.stages, replicas=plan.replicas, degrees=degrees if max(degrees) > 1 else ())

    def degree(self, stage: int) -> int:
        return self.degrees[stage] if self.degrees else 1

    @property
    def width(self) -> int:
        """Ranks per replica."""
        return sum(self.degrees) if self.degrees else self.stages

    def rank(self, replica: int, stage: int, member: int = 0) -> int:
        return replica * self.width + sum(self.degree(s) for s in range(stage)) + member

    def place(self, rank: int) -> tuple:
        """(replica, stage, member) of ``rank``."""
        replica, offset = divmod(rank, self.width)
        for stage in range(self.stages):
            if offset < self.degree(stage):
                return replica, stage, offset
            offset -= self.degree(stage)
        raise ValueError(f"rank {rank} is outside the layout")

    def position(self, rank: int) -> tuple:
        return self.place(rank)[:2]

    def device_ranks(self, plan) -> dict:
        """Plan device name -> its rank (a tensor group's members in the group's order)."""
        return {name: self.rank(r, s, k) for r, row in enumerate(plan.assignment) for s, lead in enumerate(row)
                for k, name in enumerate(plan.members(lead))}

    @property
    def world(self) -> int:
        return self.width * self.replicas


@dataclass(frozen=True)
class StageGroups:
    stage: object  # this stage's replicas (gradient sync); with tensor groups, this member's counterparts
    embedding: object  # first and last stages of every replica when the embedding is tied; else None
    replica_embedding: object = None  # with local steps: this replica's first and last stage only
    tensor: object = None  # this (replica, stage)'s tensor group (its degree > 1); else None
    tensor_lead: int = 0  # the global rank of the tensor group's lead (member 0)
    # Local steps in sync groups (``planner.plan.sync_groups``): this replica's group at this stage
    # (its gradients all-reduced every iteration; None for a group of one), the ranks the outer step
    # sums deltas over (the stage's replicas, or the groups' leads; None on other ranks and with one
    # group) and the group's lead's global rank.
    sync_group: object = None
    outer: object = None
    sync_lead: int = 0


def make_groups(layout: Layout, stage: int, tied: bool, *, local_steps: bool = False,
                sync_groups: tuple = ()) -> StageGroups:
    """Create every group on every rank in the same order (torch.distributed requires it). With
    ``local_steps`` the tied embedding's two copies also get a group per replica: between syncs a
    replica's copies stay equal without reaching the other replicas. With tensor groups the data-
    parallel groups join member k of a stage's replicas, the tied embedding's groups join leads
    (the other members take its weights from their lead), and each (replica, stage) gets its group.
    ``sync_groups`` (local steps' groups of replicas, () for every replica alone): each group's
    ranks at each stage, and the groups' leads at each stage, get a group; the tied embedding's
    group with local steps then joins the copies of the whole sync group."""
    S, R = layout.stages, layout.replicas
    replica, _, member = layout.place(dist.get_rank())
    stage_groups = {(s, k): dist.new_group([layout.rank(r, s, k) for r in range(R)])
                    for s in range(S) for k in range(layout.degree(s))}
    groups = tuple(tuple(g) for g in sync_groups) or tuple((r,) for r in range(R))
    mine = next(g for g in groups if replica in g)
    sync_group, outer = None, stage_groups[(stage, member)]
    if sync_groups:
        for s in range(S):
            for k in range(layout.degree(s)):
                for g in groups:
                    if len(g) > 1:
                        made = dist.new_group([layout.rank(r, s, k) for r in g])
                        if (s, k) == (stage, member) and g == mine:
                            sync_group = made
                made = dist.new_group([layout.rank(g[0], s, k) for g in groups]) if len(groups) > 1 else None
                if (s, k) == (stage, member):
                    outer = made if replica == mine[0] else None
    embedding = replica_embedding = None
    if tied and S > 1:
        embedding = dist.new_group(sorted(layout.rank(r, s) for r in range(R) for s in (0, S - 1)))
        if local_steps:
            pairs = [dist.new_group(sorted(layout.rank(r, s) for r in g for s in (0, S - 1))) for g in groups]
            replica_embedding = pairs[groups.index(mine)]
    tensor = None
    for r in range(R):
        for s in range(S):
            if layout.degree(s) > 1:
                group = dist.new_group([layout.rank(r, s, k) for k in range(layout.degree(s))])
                if (r, s) == (replica, stage):
                    tensor = group
    if member:  # the tied embedding's groups hold leads only
        embedding = replica_embedding = None
    return StageGroups(stage=stage_groups[(stage, member)], embedding=embedding, replica_embedding=replica_embedding,
                       tensor=tensor, tensor_lead=layout.rank(replica, stage), sync_group=sync_group, outer=outer,
                       sync_lead=layout.rank(mine[0], stage, member))


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
    or last stage, synced over the embedding group and never sharded); a tensor group's whole
    parameters on a member other than the lead (``follows_lead``) are left out."""
    tied = module.spec.tied_embeddings and stages > 1
    shared = []
    if tied and module.is_first:
        shared.append(module.embed.weight)
    if tied and module.tied_copy:
        shared.append(module.head.weight)
    ids = {id(p) for p in shared}
    trained = [p for p in module.parameters() if not getattr(p, "follows_lead", False)]
    return [p for p in trained if id(p) not in ids], [p for p in shared if not getattr(p, "follows_lead", False)]


class StageExecutor:
    """Runs iterations of one (replica, stage) of ``plan`` on ``module``."""

    def __init__(self, *, module, optimizer, plan, layout: Layout, replica: int, stage: int, device: torch.device,
                 groups: StageGroups, seed: int, dtype=torch.float32,
                 emulator: Emulator | None = None, loss=lm_loss, local_steps=None, member: int = 0,
                 graphed: bool = False):
        self.module, self.optimizer, self.plan = module, optimizer, plan
        self.layout, self.replica, self.stage, self.device = layout, replica, stage, device
        self.groups, self.seed, self.emulator = groups, seed, emulator
        self.dtype = dtype  # weights, activations and messages; the loss is taken in fp32
        self.loss = loss  # lm_loss, or its compiled form
        self.graphed = graphed  # the blocks replay as CUDA graphs (planner.runtime.gpt.compile_stage)
        self.ops = stage_ops(plan.schedule, stage, layout.stages, plan.micro_batches[replica],
                             plan.micro_batches_per_round, plan.virtual_stages, plan.warmup_depth)
        self.chunks = getattr(module, "chunks", [module])  # interleaved 1F1B: the module's chunks
        self.total_micro_batches = sum(plan.micro_batches)
        spec = module.spec
        self.boundary_shape = (plan.micro_batch_size, spec.sequence, spec.hidden)
        self.stage_parameters, self.embedding_parameters = split_parameters(module, layout.stages)
        self.timer = _Timer(device)
        # Zero-bubble schedules: linear layers whose weight gradients an input pass may defer.
        self.weight_gradients = defer_weight_gradients(module) if plan.schedule == Schedule.ZERO_BUBBLE else None
        self.loss_scale = 1.0
        # Local steps (``planner.runtime.local_steps``): no data-parallel all-reduce; each replica's
        # gradient is the mean over its own micro-batches, as if it trained alone.
        self.local_steps = local_steps
        self.sync_route = None  # the plan's sync route where its order matters (``gradient_sync.route_matters``)
        self.sync_bytes = 0  # message bytes handed to the data-parallel gradient sync, all iterations
        # Tensor groups: every member runs every op; only the lead (member 0) sends and receives
        # pipeline messages (between leads, as the cost model times them) and counts the loss.
        self.lead = member == 0
        # Messages to the neighbouring stages: block-wise int8 across the boundaries the plan
        # compresses; bytes of the tensors sent (all iterations), counted as they are handed to isend.
        self.int8_to = {peer: plan.compression.compresses(min(stage, peer)) for peer in (stage - 1, stage + 1)}
        if plan.virtual_stages > 1:  # messages wrap between the last and first stages; never int8
            self.int8_to = {peer_stage(stage, layout.stages, forward): False for forward in (True, False)}
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
        (the gradients are then summed over them), or with local steps this replica's own (its sync
        group's, summed over the group)."""
        if self.local_steps is None:
            return self.total_micro_batches
        mine = next((g for g in self.plan.sync_groups if self.replica in g), (self.replica,))
        return sum(self.plan.micro_batches[r] for r in mine)  # with sync groups, the group's

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
        (this rank's share of the loss, [(kind, mb, start_s, end_s, chunk, host_s)]): ``start_s`` and
        ``end_s`` on the device's clock (CUDA events on the compute stream) or the host's, ``host_s`` the
        host's seconds issuing the op (on a GPU the call returns before the kernels run, so a stage
        whose ops take the host longer than the device waits for its host)."""
        m = self.module
        if tokens is None:
            tokens = self.batch(index)
        inputs, outputs, grads, pending, weight_work = {}, {}, {}, [], {}
        if self.graphed:  # the last iteration's graph outputs (activations, gradients) are all spent
            torch.compiler.cudagraph_mark_step_begin()
        self.loss_scale = getattr(self.optimizer, "loss_scale", 1.0)  # fp16: fixed for the iteration
        loss_sum = torch.zeros((), device=self.device)
        marks, done, host = [self.timer.mark()], [], []
        for kind, mb, chunk in self.ops:
            start = now_s()
            part, key = self.chunks[chunk], (mb, chunk)  # the chunk run, and its messages' key
            if kind == "fwd":
                rows = micro_batch_rows(self.plan.micro_batches, self.plan.micro_batch_size, self.replica, mb)
                x = training_inputs(tokens[rows]) if part.is_first else inputs[key]
                y = part(x)
                if part.is_last:
                    targets = training_targets(tokens[rows], m.spec)
                    loss = self.loss(y, targets)
                    y = loss / self.total_micro_batches
                    loss_sum += y.detach()
                    if self.gradient_divisor != self.total_micro_batches:
                        y = loss / self.gradient_divisor
                outputs[key] = y
                self._emulate_compute("fwd", start, chunk)
            elif kind in ("bwd", "bwd_input"):  # bwd_input: the weights' gradients wait in ``weight_gradients``
                y = outputs.pop(key)
                split = kind == "bwd_input"
                if split:
                    self.weight_gradients.deferring = True
                if part.is_last:
                    (y * self.loss_scale if self.loss_scale != 1.0 else y).backward()
                else:
                    torch.autograd.backward(y, grad_tensors=grads.pop(key))
                if split:
                    self.weight_gradients.deferring = False
                    weight_work[mb] = self.weight_gradients.take()
                self._emulate_compute(kind, start, chunk)
            elif kind == "bwd_weight":
                self.weight_gradients.apply(weight_work.pop(mb))
                self._emulate_compute("bwd_weight", start)
            elif kind == "send_fwd":
                if self.lead:
                    pending += self._send(outputs[key].detach(), self._peer(True), start)
            elif kind == "send_bwd":
                grad = inputs.pop(key).grad
                if self.lead:
                    pending += self._send(grad, self._peer(False), start)
            elif kind == "recv_fwd":
                inputs[key] = self._received(self._peer(False)).requires_grad_()
            elif kind == "recv_bwd":
                grads[key] = self._received(self._peer(True))
            elif kind == "sync":
                for work, _ in pending:
                    work.wait()
                pending = []
                self._sync(start)
            elif kind == "step":
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                if self.groups.tensor is not None:  # the lead's whole parameters to the other members
                    broadcast_whole(self.module, self.groups.tensor, self.groups.tensor_lead)
                self._emulate_compute("step", start)
            host.append(now_s() - start)
            marks.append(self.timer.mark())
            done.append((kind, mb, chunk))
        times = self.timer.seconds(marks)
        trace = [(kind, mb, times[i], times[i + 1], chunk, host[i]) for i, (kind, mb, chunk) in enumerate(done)]
        return float(loss_sum) if self.lead else 0.0, trace

    # -- pieces --------------------------------------------------------------------------------
    def _emulate_compute(self, kind: str, start_s: float, chunk: int = 0) -> None:
        if self.emulator is not None:
            sleep_until(self.emulator.compute_end_s(kind, start_s, chunk))

    def _peer(self, forward: bool) -> int:
        """The stage downstream (``forward``) or upstream of this one."""
        return peer_stage(self.stage, self.layout.stages, forward)

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
            for work in (dist.irecv(codes, peer), dist.irecv(scales, peer)):  # both posted, then waited on
                work.wait()
            buffer = decode_int8(codes, scales, self.boundary_shape, self.dtype)
        else:
            buffer = torch.empty(self.boundary_shape, dtype=self.dtype, device=self.device)
            dist.irecv(buffer, peer).wait()
        if self.emulator is not None:
            stamp = torch.zeros(1, dtype=torch.float64)
            dist.irecv(stamp, peer).wait()
            sleep_until(float(stamp[0]))
        return buffer

    def _received(self, peer_stage: int) -> torch.Tensor:
        """A pipeline message from ``peer_stage``: the lead receives it; in a tensor group the lead
        then broadcasts it to the members (inside the host)."""
        if self.groups.tensor is None:
            return self._recv(peer_stage)
        if self.lead:
            buffer = self._recv(peer_stage)
        else:
            buffer = torch.empty(self.boundary_shape, dtype=self.dtype, device=self.device)
        dist.broadcast(buffer, self.groups.tensor_lead, group=self.groups.tensor)
        return buffer

    def _sync(self, ready_s: float) -> None:
        """Sum gradients over the stage's replicas (and the tied embedding's two copies)."""
        end_s = None
        if self.emulator is not None and self.layout.replicas > 1:
            ready = torch.tensor([ready_s], dtype=torch.float64)
            dist.all_reduce(ready, op=dist.ReduceOp.MAX, group=self.groups.stage)
            # One reservation of the stage's ring (by replica 0's lead); a tensor group's members end with their lead.
            end = torch.tensor([self.emulator.sync_end_s(float(ready[0])) if self.replica == 0 and self.lead else 0.0],
                               dtype=torch.float64)
            dist.all_reduce(end, op=dist.ReduceOp.MAX, group=self.groups.stage)
            if self.groups.tensor is not None:
                dist.all_reduce(end, op=dist.ReduceOp.MAX, group=self.groups.tensor)
            end_s = float(end[0])
        sharded = getattr(self.optimizer, "sharded", None)
        if sharded is not None:
            self.sync_bytes += sharded.reduce_scatter()  # ZeRO stage 1: each replica gets its own shard's sum
        elif self.powersgd is not None and self.local_steps is None:
            self.sync_bytes += self.powersgd.reduce(self.loss_scale)
            self.sync_bytes += _all_reduce_sum(self.powersgd.whole, self.groups.stage)
        elif self.layout.replicas > 1 and self.local_steps is None:
            # by the plan's algorithm and route (``planner.runtime.gradient_sync``) where the worker gave one
            self.sync_bytes += _all_reduce_sum(self.stage_parameters, self.groups.stage, self.sync_route)
        elif self.groups.sync_group is not None:  # local steps: inside the replica's sync group, every iteration
            self.sync_bytes += _all_reduce_sum(self.stage_parameters, self.groups.sync_group)
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


def _all_reduce_sum(parameters: list, group, route: SyncRoute | None = None) -> int:
    """Sum the gradients of ``parameters`` over ``group`` in buckets of at most ``BUCKET_BYTES``;
    returns the bytes handed to the all-reduce, or with ``route`` (the plan's sync algorithm over
    the group's ranks, ``planner.runtime.gradient_sync``) the bytes this rank sent."""
    bucket, size, total = [], 0, 0
    for p in parameters:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        bucket.append(p.grad)
        size += p.grad.numel() * p.grad.element_size()
        if size >= BUCKET_BYTES:
            total += _reduce_bucket(bucket, group, route)
            bucket, size = [], 0
    if bucket:
        total += _reduce_bucket(bucket, group, route)
    return total


def _reduce_bucket(grads: list, group, route: SyncRoute | None = None) -> int:
    """Sum one bucket over ``group`` (by ``route`` if given); the bytes this rank sent: by ``route``
    as counted, by torch's all-reduce as a ring member sends them, ``2 (k - 1) / k`` of the bucket."""
    flat = _flatten_dense_tensors(grads)
    if route is not None:
        sent = sum_over_route(flat, route)
    else:
        dist.all_reduce(flat, group=group)
        sent = ring_member_bytes(flat, group)
    for grad, reduced in zip(grads, _unflatten_dense_tensors(flat, grads)):
        grad.copy_(reduced)
    return sent
