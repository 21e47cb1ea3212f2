"""Tensor groups: devices of one host and one type that run a stage together, Megatron-style.

A group of ``t`` devices splits every block of its stage (Shoeybi et al. 2019): it behaves like one
device with ``t`` times the FLOP/s for the blocks, each member holding its share of the blocks'
parameters and activations (``planner.prediction.stage_model``), plus the block's all-reduces over
the host's links (``cost_models.comm.tensor_allreduces``, timed by the one network model). The
embeddings and the head stay whole on every member.

``TensorGroups`` is the topology seen that way: ``virtual`` is a ``Topology`` whose device ``k``
stands for the group ``members[k]`` and carries its first member's (the lead's) name, links and
host. A plan names each (replica, stage) by its lead (``Plan.assignment``) and lists the groups of
more than one device (``Plan.tensor_groups``). Pipeline messages go between leads; a stage's
gradient all-reduce is timed over its leads' links with the whole stage's gradients (each member
all-reduces its share with the same share of the other replicas; on a host with one shared NIC the
shares add up to the whole, so this never under-counts). With PowerSGD the shares' compressed
messages add up to more than the whole matrix's (each member sends ``P`` and ``Q`` of its shards),
which ``planner.prediction.stage_model.stage_gradient_bytes`` counts by degree.
"""

import math
from dataclasses import dataclass, field, replace

import numpy as np

from cost_models.comm import measured_tensor_block_s
from planner.runtime.graphs import group_ungraphed

__all__ = ["TENSOR_DEGREES", "TensorGroups", "group_devices", "groups_of_plan", "tensor_degree_problem",
           "groupings", "grouping_groups"]

TENSOR_DEGREES = (1, 2, 4, 8)


@dataclass(frozen=True, kw_only=True, eq=False)
class TensorGroups:
    """``topology`` with some devices joined into tensor groups (see the module's description)."""

    topology: object  # the real topology
    virtual: object  # one device per group, named after its lead
    members: tuple  # per virtual device: the names of its members, lead first
    degree: np.ndarray  # per virtual device: its group's size
    allreduce_per_byte_s: np.ndarray  # per virtual device: ring all-reduce seconds per byte among its members
    allreduce_latency_s: np.ndarray  # ... and its fixed seconds (0 for a group of one)
    issue_s: np.ndarray  # per virtual device: its members' block floor (their type's tensor_block_issue; 0 alone)
    # per virtual device: its members' block timed at a few micro-batches for its degree (their
    # type's calibrated tensor_block_s: ((micro-batch, seconds), ...); () alone or not timed)
    timed_blocks: tuple
    # the same two for a group that receives its input (any stage but the first, or virtual stages):
    # the type's tensor_block_received_* where the calibration timed them apart, else as above
    received_issue_s: np.ndarray = None
    received_blocks: tuple = None
    _timed: dict = field(default_factory=dict, repr=False)  # (micro-batch, received) -> timed_block_s's array

    def timed_block_s(self, micro_batch_size: int, received: bool = False) -> np.ndarray:
        """Per virtual device: seconds its group's block takes per micro-batch of
        ``micro_batch_size`` as timed (``cost_models.comm.measured_tensor_block_s``), 0 where its
        degree was not timed (or a group of one); ``received``: as a group that receives its input."""
        key = (micro_batch_size, received)
        if key not in self._timed:
            tables = self.received_blocks if received and self.received_blocks is not None else self.timed_blocks
            self._timed[key] = np.array([measured_tensor_block_s(table, micro_batch_size) for table in tables])
        return self._timed[key]

    def placed(self, assign, micro_batch_size: int, virtual_stages: int = 1, zero_bubble: bool = False) -> tuple:
        """(floor seconds, timed seconds) of each placed group's block, ``assign`` (replicas x
        stages) of virtual devices: a group on the first stage of a plan without virtual stages or
        ZB-H1 takes its input from its own embedding and runs as ``plan calibrate`` timed
        ``timed_blocks`` (CUDA graphs under ``--compile auto``); any other runs without graphs
        (``planner.runtime.graphs.group_ungraphed``: it receives its input, or ZB-H1 splits its
        backward) and is priced by its received timings."""
        assign = np.asarray(assign)
        received = np.array([group_ungraphed(s, virtual_stages, zero_bubble) for s in range(assign.shape[-1])])
        received_issue = self.issue_s if self.received_issue_s is None else self.received_issue_s
        issue = np.where(received, received_issue[assign], self.issue_s[assign])
        timed = np.where(received, self.timed_block_s(micro_batch_size, True)[assign],
                         self.timed_block_s(micro_batch_size)[assign])
        return issue, timed

    @property
    def grouped(self) -> tuple:
        """The groups of more than one device (as ``Plan.tensor_groups`` lists them)."""
        return tuple(m for m in self.members if len(m) > 1)


def group_devices(topology, groups) -> TensorGroups:
    """``topology`` seen with ``groups`` (tuples of device names, lead first) joined; every other
    device is a group of one. The groups are assumed valid (``tensor_degree_problem``)."""
    if not groups:  # the topology itself: no copy of its link matrices
        n = topology.size
        return TensorGroups(topology=topology, virtual=topology, members=tuple((name,) for name in topology.names),
                            degree=np.ones(n, dtype=np.int64), allreduce_per_byte_s=np.zeros(n),
                            allreduce_latency_s=np.zeros(n), issue_s=np.zeros(n), timed_blocks=((),) * n)
    joined = {g[0]: tuple(g) for g in groups}
    inside = {name for g in groups for name in g[1:]}
    members = tuple(joined.get(name, (name,)) for name in topology.names if name not in inside)
    leads = np.array([topology.index(m[0]) for m in members], dtype=np.int64)
    degree = np.array([len(m) for m in members], dtype=np.int64)
    devices = []
    for m, lead in zip(members, leads):
        d = topology.devices[lead]
        t = len(m)
        # t times the blocks' FLOP/s; the head runs whole on every member, at one device's speed.
        devices.append(replace(d, peak_flops={p: v * t for p, v in d.peak_flops.items()},
                               head_efficiency=d.efficiency / (t * d.head_slowdown)) if t > 1 else d)
    virtual = topology.on_devices(leads, devices)
    per_byte, latency, issue = np.zeros(len(members)), np.zeros(len(members)), np.zeros(len(members))
    received_issue = np.zeros(len(members))
    timed, received = [()] * len(members), [()] * len(members)
    network = topology.network
    for k, m in enumerate(members):
        if len(m) > 1:
            order = [topology.index(name) for name in m]
            per_byte[k], latency[k] = network.ring_cost(order)
            lead = topology.devices[order[0]]  # one type: the same floor and timings on every member
            issue[k] = lead.tensor_block_issue_s
            timed[k] = dict(lead.tensor_block_s).get(len(m), ())
            received_issue[k] = (lead.tensor_block_issue_s if lead.tensor_block_received_issue_s is None
                                 else lead.tensor_block_received_issue_s)
            received[k] = timed[k] if lead.tensor_block_received_s is None else \
                dict(lead.tensor_block_received_s).get(len(m), ())
    return TensorGroups(topology=topology, virtual=virtual, members=members, degree=degree,
                        allreduce_per_byte_s=per_byte, allreduce_latency_s=latency, issue_s=issue,
                        timed_blocks=tuple(timed), received_issue_s=received_issue, received_blocks=tuple(received))


def groups_of_plan(topology, plan) -> TensorGroups:
    """The topology as ``plan`` groups it."""
    return group_devices(topology, plan.tensor_groups)


def tensor_degree_problem(topology, model, group) -> str | None:
    """Why ``group`` (device names, lead first) cannot be a tensor group, or None: one host, one
    device type, a degree in ``TENSOR_DEGREES`` that divides the heads and the MLP width."""
    t = len(group)
    if t not in TENSOR_DEGREES:
        return f"has {t} devices ({', '.join(group)}); a tensor group has 1, 2, 4 or 8"
    devices = [topology.devices[topology.index(name)] for name in group]
    hosts = sorted({d.host for d in devices})
    if len(hosts) > 1:
        return (f"spans hosts {', '.join(hosts)} ({', '.join(group)}): a tensor group's devices must share one "
                "host (its all-reduces run every block)")
    types = sorted({d.type_name for d in devices})
    if len(types) > 1:
        return f"mixes device types {', '.join(types)} ({', '.join(group)}): a tensor group needs one type"
    if model.heads % t or model.ffn_hidden % t:
        return (f"has degree {t}, which does not divide the model's {model.heads} heads and {model.ffn_hidden} "
                "MLP width: use a degree that does")
    return None


def groupings(topology, model, degrees=TENSOR_DEGREES) -> tuple:
    """The tensor groupings the search tries, as ``{device type: degree}``: (first, fallback).

    ``first``: no tensor parallelism, and, where types differ in memory, the smaller-memory types in
    groups whose summed memory reaches the largest type's (weak devices join as groups that hold
    what a strong device holds). ``fallback``, tried only when no plan fits without it: every type
    in groups of 2, 4, 8. A type's degree is the largest of ``degrees`` within that, its largest
    host, and dividing the heads and the MLP width. Within a host, devices of a type form groups in
    topology order; those left over stay single. ``degrees`` without 1 asks for groups: ``first``
    is then every type at its largest degree (a type that allows none stays single), no fallback."""
    count: dict = {}
    memory: dict = {}
    for d in topology.devices:
        count[(d.host, d.type_name)] = count.get((d.host, d.type_name), 0) + 1
        memory[d.type_name] = max(memory.get(d.type_name, 0.0), d.memory_bytes)
    most = {}
    for (_, type_name), n in count.items():
        most[type_name] = max(most.get(type_name, 1), n)

    def degree(type_name, wanted):
        usable = [t for t in degrees if t <= min(wanted, most[type_name]) and not model.heads % t
                  and not model.ffn_hidden % t]
        return max(usable, default=1)

    if 1 not in degrees:
        return [{t: degree(t, max(degrees)) for t in memory}], []
    largest = max(memory.values())
    first = [{t: 1 for t in memory}]
    equal = {t: degree(t, 1 << max(0, math.ceil(math.log2(largest / memory[t])))) for t in memory}
    if equal not in first:
        first.append(equal)
    fallback = []
    for g in (2, 4, 8):
        mapping = {t: degree(t, g) for t in memory}
        if mapping not in first and mapping not in fallback:
            fallback.append(mapping)
    return first, fallback


def grouping_groups(topology, mapping: dict) -> tuple:
    """The groups (device names, lead first) of ``{device type: degree}`` on ``topology``."""
    pending: dict = {}
    groups = []
    for d in topology.devices:
        t = mapping.get(d.type_name, 1)
        if t <= 1:
            continue
        bucket = pending.setdefault((d.host, d.type_name), [])
        bucket.append(d.name)
        if len(bucket) == t:
            groups.append(tuple(bucket))
            pending[(d.host, d.type_name)] = []
    return tuple(groups)
