"""The tensor-parallel runtime (``planner.runtime.tensor_parallel``) against single-process training
of the whole model, its rank layout, the shards' split, and what a launch refuses."""

import copy
import dataclasses

import pytest

torch = pytest.importorskip("torch")

from planner.errors import InputError  # noqa: E402
from planner.inputs.model import model_preset  # noqa: E402
from planner.runtime.engine import Layout  # noqa: E402
from planner.runtime.gpt import build_stage  # noqa: E402
from planner.runtime.launch import LaunchOptions, launch  # noqa: E402
from planner.runtime.reference import train_single_process  # noqa: E402
from planner.runtime.tensor_parallel import _is_split, _join, _split, shard_stage  # noqa: E402
from tests.runtime_helpers import cpu_topology, write_test_plan  # noqa: E402

pytestmark = pytest.mark.runtime

# SwiGLU, RMSNorm without biases, rotary positions, a separate head: every other split path.
GATED = dataclasses.replace(model_preset("tiny"), gated_mlp=True, biases=False, learned_positions=False,
                            tied_embeddings=False, ffn_hidden=96)

CASES = {
    # 3 processes: stage 0 on a group of 2 (a0 a1), stage 1 alone; the tied embedding's copies summed
    # by the leads and broadcast to the members.
    "two-stages-degree-2-on-stage-0": dict(
        model=model_preset("tiny"), assignment=[["a0", "b0"]], tensor_groups=[["a0", "a1"]], layer_bounds=[0, 2, 4],
        micro_batches=[4], micro_batch_size=2, schedule="1f1b", shard_optimizer=True, recompute=False),
    # 4 processes: 2 replicas of one stage, each a group of 2, uneven batch; ZeRO-1 over each member's
    # counterparts.
    "one-stage-two-replicas-degree-2-zero1": dict(
        model=model_preset("tiny"), assignment=[["a0"], ["b0"]], tensor_groups=[["a0", "a1"], ["b0", "b1"]],
        layer_bounds=[0, 4], micro_batches=[3, 1], micro_batch_size=2, schedule="1f1b", shard_optimizer=True,
        recompute=False),
    # 4 processes: both stages on groups of 2, the gated model, recompute (the forward's all-reduces
    # run again in backward), GPipe.
    "gated-two-stages-degree-2-recompute": dict(
        model=GATED, assignment=[["a0", "b0"]], tensor_groups=[["a0", "a1"], ["b0", "b1"]], layer_bounds=[0, 1, 4],
        micro_batches=[2], micro_batch_size=2, schedule="gpipe", shard_optimizer=True, recompute=True),
    # 3 processes: ZB-H1 with the split backward on a group of 2 (stage 1), a classification head.
    "zb-h1-classification-degree-2-on-stage-1": dict(
        model=dataclasses.replace(model_preset("tiny"), head="classification", classes=3, tied_embeddings=False),
        assignment=[["a0", "b0"]], tensor_groups=[["b0", "b1"]], layer_bounds=[0, 2, 4], micro_batches=[4],
        micro_batch_size=2, schedule="zb-h1", shard_optimizer=True, recompute=False),
}


@pytest.mark.parametrize("case, compiled", [(case, False) for case in CASES] + [
    pytest.param("gated-two-stages-degree-2-recompute", True, marks=pytest.mark.slow)])
def test_tensor_parallel_training_equals_single_process(tmp_path, case, compiled):
    """Compiled, a group's blocks are one graph each with the all-reduces inside (functional collectives)."""
    kwargs = CASES[case]
    topology = cpu_topology(tmp_path / "topology.yaml")
    plan = write_test_plan(tmp_path, topology, **kwargs)
    out = tmp_path / "run"
    results = launch(plan, LaunchOptions(backend="gloo", iterations=3, warmup=0, out_dir=str(out), learning_rate=0.05,
                                         save_state=True, compile="on" if compiled else "off"),
                     log=lambda line: None)
    spec = kwargs["model"]
    global_batch = kwargs["micro_batch_size"] * sum(kwargs["micro_batches"])
    losses, reference = train_single_process(spec, global_batch=global_batch, iterations=3, learning_rate=0.05)
    assert results["measured"]["loss"] == pytest.approx(losses, rel=1e-5)
    weights = {}
    for s in range(len(kwargs["layer_bounds"]) - 1):
        weights.update(torch.load(out / "state" / f"stage{s}.pt"))  # gathered whole by each group's lead
    if spec.tied_embeddings and "head.weight" in weights:
        assert torch.allclose(weights.pop("head.weight"), reference["embed.weight"], atol=1e-5)
    assert set(weights) == set(reference)
    for name, value in reference.items():
        assert torch.allclose(weights[name], value, atol=1e-5), name
    world = sum(len(g) for g in kwargs["tensor_groups"]) + sum(
        1 for row in kwargs["assignment"] for d in row if d not in {g[0] for g in kwargs["tensor_groups"]})
    assert results["run"]["world"] == world
    assert results["run"]["compiled"] is compiled
    if len(kwargs["assignment"]) > 1:  # the sync moves the whole stage per replica, as without groups
        whole = sum(p.numel() for p in build_stage(spec, 0, spec.layers).parameters())
        assert results["run"]["data_parallel_bytes_per_iteration"] == [len(kwargs["assignment"]) * 4 * whole] * 3
    devices = set(results["measured"]["peak_memory_bytes"])
    assert devices == {d for g in kwargs["tensor_groups"] for d in g} | {d for row in kwargs["assignment"] for d in row}


def test_layout_places_a_groups_members_after_its_lead():
    layout = Layout(stages=3, replicas=2, degrees=(2, 1, 4))
    assert layout.width == 7 and layout.world == 14
    assert [layout.rank(1, s, 0) for s in range(3)] == [7, 9, 10]
    assert [layout.place(r) for r in range(7, 14)] == [(1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 2, 0), (1, 2, 1),
                                                       (1, 2, 2), (1, 2, 3)]
    plain = Layout(stages=3, replicas=2)  # without groups: replica * stages + stage, as before
    assert [plain.rank(r, s) for r in range(2) for s in range(3)] == list(range(6))
    assert plain.position(4) == (1, 1) and plain.place(4) == (1, 1, 0)


@pytest.mark.parametrize("spec", [model_preset("tiny"), GATED], ids=["gpt", "gated"])
@pytest.mark.parametrize("degree", [2, 4])
def test_shards_join_back_into_the_whole_stage(spec, degree):
    whole = build_stage(spec, 0, 2)
    shards = [shard_stage(copy.deepcopy(whole), None, k, degree) for k in range(degree)]
    states = [s.state_dict() for s in shards]
    block = shards[0].blocks["0"]
    assert block.heads == spec.heads // degree and block.qkv.weight.shape[0] == 3 * spec.hidden // degree
    for name, value in whole.state_dict().items():
        parts = [state[name] for state in states]
        assert torch.equal(_join(name, parts, degree) if _is_split(name) else parts[-1], value), name
        if _is_split(name):  # the checkpoint's cut (a resumed member's share) is the inverse
            assert torch.equal(_split(name, value, degree - 1, degree), parts[-1]), name
    # Each member's q, k and v are the same heads: member k's rows of q are heads k*a/t..(k+1)*a/t.
    h = spec.hidden
    assert torch.equal(block.qkv.weight[:h // degree], whole.blocks["0"].qkv.weight[:h // degree])
    assert torch.equal(block.qkv.weight[h // degree:2 * h // degree], whole.blocks["0"].qkv.weight[h:h + h // degree])


def test_followers_take_no_gradient_of_whole_parameters_and_receive_them_in_place(group_of_one):
    """A follower's whole parameters take no gradient but the first stage's embeddings (whose output
    must require one for the first block's f); the broadcast goes from and into one flat buffer
    the parameters are views of, kept from call to call; a parameter already inside another buffer
    (ZeRO-1's) stays there and is copied."""
    from planner.runtime.tensor_parallel import broadcast_whole, follow_lead, reduce_from_group, whole_parameters

    spec = dataclasses.replace(model_preset("tiny"), learned_positions=True)
    module = shard_stage(build_stage(spec, 0, spec.layers), group_of_one, 1, 2)
    follow_lead(module)
    taking = {name for name, p in module.named_parameters() if p.requires_grad}
    assert {n for n in taking if not _is_split(n)} == {"embed.weight", "positions.weight"}
    assert all(_is_split(n) for n in taking - {"embed.weight", "positions.weight"})
    whole = whole_parameters(module)
    elsewhere = torch.zeros(whole[-1].numel() + 8)  # as ZeRO-1 keeps a parameter: a view of its flat
    elsewhere[8:].copy_(whole[-1].detach().flatten())
    whole[-1].data = elsewhere[8:].view_as(whole[-1])
    before = [p.detach().clone() for p in whole]
    broadcast_whole(module, group_of_one, 0)  # rank 0 is the lead of a group of one
    flat = module._whole_buffer.flat
    start, end = flat.data_ptr(), flat.data_ptr() + flat.numel() * flat.element_size()
    assert all(start <= p.data_ptr() < end for p in whole[:-1])
    assert elsewhere.data_ptr() < whole[-1].data_ptr() < elsewhere.data_ptr() + elsewhere.numel() * 4
    with torch.no_grad():
        whole[0].add_(1.0)
        whole[-1].add_(1.0)
    broadcast_whole(module, group_of_one, 0)
    assert module._whole_buffer.flat is flat
    assert torch.equal(flat[:whole[0].numel()], (before[0] + 1).flatten())  # the lead's value, sent
    assert torch.equal(flat[-whole[-1].numel():], (before[-1] + 1).flatten())  # copied in before sending
    assert all(torch.equal(p, b + (1 if i in (0, len(whole) - 1) else 0)) for i, (p, b) in enumerate(zip(whole, before)))
    # g sums through torch's functional collective (traceable by torch.compile): a new tensor, the
    # product left as it was, the gradient passed through unchanged
    leaf = torch.randn(2, 3, 4, requires_grad=True)
    product = leaf * 2.0
    kept = product.detach().clone()
    summed = reduce_from_group(product, group_of_one)
    assert torch.equal(summed, kept) and torch.equal(product, kept)
    summed.sum().backward()
    assert torch.equal(leaf.grad, torch.full_like(leaf, 2.0))


def _group_plan(tmp_path, **kwargs):
    topology = cpu_topology(tmp_path / "topology.yaml")
    base = dict(assignment=[["a0", "b0"]], tensor_groups=[["a0", "a1"]], layer_bounds=[0, 2, 4], micro_batches=[2],
                micro_batch_size=2, schedule="1f1b")
    return write_test_plan(tmp_path, topology, **{**base, **kwargs})


CHECKPOINT_PLANS = {
    "2-replicas-groups-of-2-sharded": dict(assignment=[["a0"], ["b0"]], tensor_groups=[["a0", "a1"], ["b0", "b1"]],
                                           layer_bounds=[0, 4], micro_batches=[2, 2], micro_batch_size=2,
                                           schedule="1f1b", shard_optimizer=True),
    "1x3-unsharded": dict(assignment=[["a0", "b0", "a1"]], layer_bounds=[0, 1, 3, 4], micro_batches=[4],
                          micro_batch_size=2, schedule="gpipe", shard_optimizer=False),
    "2-stages-group-on-stage-0": dict(assignment=[["a0", "b0"]], tensor_groups=[["a0", "a1"]], layer_bounds=[0, 2, 4],
                                      micro_batches=[4], micro_batch_size=2, schedule="1f1b"),
}


@pytest.mark.slow
@pytest.mark.parametrize("optimizer, first, second", [("adam", "2-replicas-groups-of-2-sharded", "1x3-unsharded"),
                                                      ("sgd", "1x3-unsharded", "2-stages-group-on-stage-0")])
def test_checkpoints_join_and_split_the_groups_shares(tmp_path, optimizer, first, second):
    """A checkpoint holds whole tensors whatever the groups (the lead joins its members' shares of
    the weights and optimizer state); a plan with other groups or none resumes it and continues the
    same training (as ``tests/test_checkpoint.py`` checks without groups)."""
    from tests.test_checkpoint import _LR, _assert_same_weights, _run, _weights

    topology = cpu_topology(tmp_path / "topology.yaml")
    plan_a = write_test_plan(tmp_path, topology, **CHECKPOINT_PLANS[first], optimizer=optimizer, name="a.yaml")
    plan_b = write_test_plan(tmp_path, topology, **CHECKPOINT_PLANS[second], optimizer=optimizer, name="b.yaml")
    if optimizer == "adam":
        whole = _run(plan_a, tmp_path / "whole", 4)
        losses, expected = whole["measured"]["loss"], _weights(tmp_path / "whole")
    else:
        losses, expected = train_single_process(model_preset("tiny"), global_batch=8, iterations=4,
                                                learning_rate=_LR, optimizer="sgd")
    checkpoints = tmp_path / "checkpoints"
    before = _run(plan_a, tmp_path / "before", 2, checkpoint_every=2, checkpoint_dir=str(checkpoints))
    after = _run(plan_b, tmp_path / "after", 2, resume=str(checkpoints))
    assert before["measured"]["loss"] + after["measured"]["loss"] == pytest.approx(losses, rel=1e-5)
    got = _weights(tmp_path / "after")
    for name in [n for n in expected if n.endswith("qkv.bias")]:
        # The key biases' gradient is rounding only (see _assert_same_weights), which Adam scales up;
        # the groups' all-reduces round in another order than the reference's sums.
        keys = slice(expected[name].numel() // 3, 2 * expected[name].numel() // 3)
        assert torch.allclose(got[name][keys], expected[name][keys], atol=1e-3), name
        got[name][keys] = expected[name][keys]
    _assert_same_weights(got, expected)


def test_replicas_of_one_stage_with_different_degrees_are_refused(tmp_path):
    plan = _group_plan(tmp_path, assignment=[["a0"], ["b0"]], layer_bounds=[0, 4], micro_batches=[1, 1])
    with pytest.raises(InputError, match="one degree per stage") as caught:
        launch(plan, LaunchOptions(backend="gloo", out_dir=str(tmp_path / "run")), log=lambda line: None)
    assert caught.value.field == "tensor_groups"


def test_hostfile_launch_starts_a_process_per_member(tmp_path):
    plan = _group_plan(tmp_path)
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("10.0.0.1 @a\n10.0.0.2 b0\n")
    lines = []
    launch(plan, LaunchOptions(hostfile=str(hosts), dry_run=True, out_dir=str(tmp_path / "run")), log=lines.append)
    assert "--nproc-per-node=2" in lines[1] and "--devices a0,a1" in lines[1]
    assert "--compile" in lines[1]  # a group's blocks compile with their all-reduces (NCCL's default: on)


@pytest.mark.slow
def test_hostfile_launch_of_a_group_trains_like_single_process(tmp_path):
    """Two torchruns on this machine (the group's host, then stage 1's): each worker finds its rank
    from its device, the group's members included."""
    import socket

    plan = _group_plan(tmp_path, micro_batches=[4])
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("127.0.0.1 a0 a1\nlocalhost b0\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = launch(plan, LaunchOptions(hostfile=str(hosts), backend="gloo", iterations=2, warmup=0,
                                         out_dir=str(tmp_path / "run"), learning_rate=0.05, master_port=port),
                     log=lambda line: None)
    losses, _ = train_single_process(model_preset("tiny"), global_batch=8, iterations=2, learning_rate=0.05)
    assert results["measured"]["loss"] == pytest.approx(losses, rel=1e-5)
    assert results["run"]["world"] == 3


@pytest.mark.parametrize("case", ["two-stages", pytest.param("two-replicas", marks=pytest.mark.slow)])
def test_emulated_tensor_groups_follow_the_simulator(tmp_path, case):
    """Emulated (the reduced model with a head per member, sleeping the plan's times): the groups'
    members run with their lead, the stage's sync is reserved once, and the iteration lasts what the
    simulator predicts for the plan."""
    topology = cpu_topology(tmp_path / "topology.yaml")
    shape = (dict(assignment=[["a0", "b0"]], layer_bounds=[0, 2, 4], micro_batches=[4]) if case == "two-stages"
             else dict(assignment=[["a0"], ["b0"]], layer_bounds=[0, 4], micro_batches=[2, 2]))
    plan = write_test_plan(tmp_path, topology, **shape, tensor_groups=[["a0", "a1"], ["b0", "b1"]],
                           micro_batch_size=4, schedule="1f1b")
    results = launch(plan, LaunchOptions(backend="gloo", iterations=3, warmup=1, out_dir=str(tmp_path / "run"),
                                         emulate=True, time_scale=20.0), log=lambda line: None)
    assert results["run"]["world"] == 4 and results["run"]["executed_model"]["heads"] == 2
    assert results["comparison"]["measured_s"] == pytest.approx(results["comparison"]["predicted_s"], rel=0.25)


@pytest.mark.slow
def test_local_steps_of_groups_equal_a_hand_written_diloco(tmp_path):
    """DiLoCo (``sync_every`` 2) over 2 replicas, each a group of 2: the members' outer steps of
    their shares and the lead's of the whole parameters give the hand-written DiLoCo's weights."""
    from tests.test_local_steps import _diloco_reference

    topology = cpu_topology(tmp_path / "topology.yaml")
    plan = write_test_plan(tmp_path, topology, assignment=[["a0"], ["b0"]], tensor_groups=[["a0", "a1"], ["b0", "b1"]],
                           layer_bounds=[0, 4], micro_batches=[3, 1], micro_batch_size=1, schedule="1f1b",
                           shard_optimizer=False, sync_every=2)
    out = tmp_path / "run"
    launch(plan, LaunchOptions(backend="gloo", iterations=4, warmup=0, out_dir=str(out), learning_rate=0.05,
                               save_state=True), log=lambda line: None)
    weights = torch.load(out / "state" / "stage0.pt")
    reference = _diloco_reference(model_preset("tiny"), micro_batches=(3, 1), sync_every=2, iterations=4, lr=0.05)
    assert set(weights) == set(reference)
    for name, value in reference.items():
        assert torch.allclose(weights[name], value, atol=1e-5), name


# -- PowerSGD over tensor groups ------------------------------------------------------------------
# 2 replicas, each a group of 2 (4 processes), one stage of the tiny model, uneven batch.
POWERSGD_PLAN = dict(assignment=[["a0"], ["b0"]], tensor_groups=[["a0", "a1"], ["b0", "b1"]], layer_bounds=[0, 4],
                     micro_batches=[3, 1], micro_batch_size=1, schedule="1f1b", shard_optimizer=False,
                     compress_gradients="powersgd", powersgd_rank=2)
POWERSGD_LR = 0.05


def _shard_index(name: str, whole: torch.Tensor, member: int, degree: int):
    """The index of ``member``'s shard in the whole tensor ``name`` (Megatron's split, written out):
    its heads' rows of q, k and v, its rows of fc1 (weight and bias), its columns of the projection's
    and fc2's weights; None for a tensor every member keeps whole."""
    layer, kind = name.split(".")[-2:]
    if not name.startswith("blocks.") or layer not in ("qkv", "fc1", "gate", "proj", "fc2") or \
            (layer in ("proj", "fc2") and kind == "bias"):
        return None
    if layer == "qkv":
        h = whole.shape[0] // 3
        width = h // degree
        return torch.cat([torch.arange(j * h + member * width, j * h + (member + 1) * width) for j in range(3)])
    if layer in ("fc1", "gate"):
        width = whole.shape[0] // degree
        return slice(member * width, (member + 1) * width)
    width = whole.shape[1] // degree
    return (slice(None), slice(member * width, (member + 1) * width))


def _powersgd_sum(ms: list, q: torch.Tensor) -> tuple:
    """One PowerSGD step over the replicas' ``M = G + E`` (Vogels et al. 2019, Algorithm 1 with error
    feedback, sums for averages): (the decompressed sum, each replica's new error memory, the new Q)."""
    p = torch.linalg.qr(sum(m @ q for m in ms), mode="reduced").Q
    qs = [m.t() @ p for m in ms]
    return p @ sum(qs).t(), [m - p @ qw.t() for m, qw in zip(ms, qs)], sum(qs)


def _per_shard_powersgd_reference(spec, *, micro_batches, degree: int, rank: int, iterations: int, lr: float,
                                  seed: int = 0) -> tuple:
    """(losses, weights) of single-process training with each replica's gradient (its rows of the
    batch, micro-batch size 1) summed by PowerSGD per tensor shard: member ``k`` of every replica
    compresses its shard of each split matrix, the lead the whole matrices, each with its own error
    memory per replica and its own warm-started Q, drawn from ``seed + stage`` in the member's
    parameter order; vectors summed whole. SGD with momentum 0.9 (the runtime's)."""
    from cost_models.compression import powersgd_compresses
    from planner.runtime.data import global_batch_tokens, training_inputs, training_targets

    model = build_stage(spec, 0, spec.layers, seed=seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    R, batch = len(micro_batches), sum(micro_batches)
    states = {}  # (member, name) -> (each replica's error memory, Q)
    for member in range(degree):
        draws = torch.Generator().manual_seed(seed)
        for name, p in model.named_parameters():
            index = _shard_index(name, p, member, degree)
            if index is None and member:
                continue
            shape = p.detach()[index].shape if index is not None else p.shape
            if len(shape) == 2 and powersgd_compresses(shape[0], shape[1], rank):
                states[member, name] = ([torch.zeros(shape) for _ in range(R)],
                                        torch.randn(shape[1], rank, generator=draws))
    losses = []
    for iteration in range(iterations):
        tokens = global_batch_tokens(seed, iteration, batch, spec.sequence, spec.vocabulary)
        grads, total, first = [], 0.0, 0
        for count in micro_batches:
            rows = tokens[first:first + count]
            first += count
            logits = model(training_inputs(rows))
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, -2), training_targets(rows, spec).flatten())
            (loss * count / batch).backward()
            total += float(loss.detach()) * count / batch
            grads.append({name: p.grad.clone() for name, p in model.named_parameters()})
            model.zero_grad(set_to_none=True)
        losses.append(total)
        for name, p in model.named_parameters():
            summed = torch.zeros_like(p)
            for member in range(degree):
                index = _shard_index(name, p, member, degree)
                if index is None and member:
                    continue
                cut = [g[name][index] if index is not None else g[name] for g in grads]
                if (member, name) in states:
                    errors, q = states[member, name]
                    shard, errors, q = _powersgd_sum([c + e for c, e in zip(cut, errors)], q)
                    states[member, name] = (errors, q)
                else:
                    shard = sum(cut)
                if index is None:
                    summed = shard
                else:
                    summed[index] = shard
            p.grad = summed
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.slow
def test_powersgd_over_tensor_groups_equals_per_shard_powersgd_and_sends_the_predicted_bytes(tmp_path):
    """Each member compresses its own shards over its counterparts in the other replica (the lead
    also the whole matrices): the losses and weights of a hand-written single-process per-shard
    PowerSGD, which is not whole-matrix PowerSGD (the low-rank approximation of a shard is not the
    shard of a low-rank approximation); the bytes every rank hands to the sync are the cost model's."""
    from planner.inputs.model import parse_training
    from planner.plan.document import read_plan
    from planner.prediction.predict import communication_bytes
    from planner.prediction.stage_model import layer_costs, stage_gradient_bytes

    spec = model_preset("tiny")
    topology = cpu_topology(tmp_path / "topology.yaml")
    path = write_test_plan(tmp_path, topology, **POWERSGD_PLAN)
    out = tmp_path / "run"
    results = launch(path, LaunchOptions(backend="gloo", iterations=3, warmup=0, out_dir=str(out),
                                         learning_rate=POWERSGD_LR, save_state=True), log=lambda line: None)
    assert results["run"]["world"] == 4 and results["run"]["compression"]["gradients"] == "powersgd"
    losses, reference = _per_shard_powersgd_reference(spec, micro_batches=(3, 1), degree=2, rank=2, iterations=3,
                                                      lr=POWERSGD_LR)
    assert results["measured"]["loss"] == pytest.approx(losses, rel=1e-5)
    weights = torch.load(out / "state" / "stage0.pt")
    assert set(weights) == set(reference)
    for name, value in reference.items():
        assert torch.allclose(weights[name], value, atol=1e-5), name
    # 100 times the bound above away: whole-matrix PowerSGD (another compression) and no compression
    _, whole_matrices = _per_shard_powersgd_reference(spec, micro_batches=(3, 1), degree=1, rank=2, iterations=3,
                                                      lr=POWERSGD_LR)
    _, uncompressed = train_single_process(spec, global_batch=4, iterations=3, learning_rate=POWERSGD_LR)
    for other in (whole_matrices, uncompressed):
        assert max(float((weights[name] - other[name]).abs().max()) for name in other) > 100 * 1e-5
    # every rank's P, Q and vectors: twice (two replicas) each member's shards' messages together
    plan, document = read_plan(path)
    training = parse_training(document["training"])
    costs = layer_costs(spec, training, 1, 1, 2)
    group = stage_gradient_bytes(costs, 4.0, 0, 2)
    assert results["run"]["data_parallel_bytes_per_iteration"] == [2 * group] * 3
    assert communication_bytes(plan, spec, training)["data_parallel_bytes_per_iteration"] == 2 * group
    assert group > stage_gradient_bytes(costs, 4.0, 0, 1)  # a row-cut matrix's Q goes once per member


@pytest.mark.slow
def test_powersgd_over_tensor_groups_resumes_each_members_state_from_a_checkpoint(tmp_path, capfd):
    """4 iterations against 2, a checkpoint and 2 resumed under the same plan: the same losses and
    weights (each member's error memory and Q of its shards came back from its own file). Without
    the state the weights part; resumed without tensor groups the state restarts, said in one line."""
    from tests.runtime_helpers import without_powersgd_state

    topology = cpu_topology(tmp_path / "topology.yaml")
    path = write_test_plan(tmp_path, topology, **POWERSGD_PLAN)

    def run(out, n, plan=path, **more):
        results = launch(plan, LaunchOptions(backend="gloo", iterations=n, warmup=0, out_dir=str(tmp_path / out),
                                             learning_rate=POWERSGD_LR, save_state=True, **more),
                         log=lambda line: None)
        return results["measured"]["loss"], torch.load(tmp_path / out / "state" / "stage0.pt")

    def apart(a, b) -> float:
        return max(float((a[name] - b[name]).abs().max()) for name in a)

    whole, expected = run("whole", 4)
    checkpoints = tmp_path / "checkpoints"
    before, _ = run("before", 2, checkpoint_every=2, checkpoint_dir=str(checkpoints))
    saved = sorted(p.name for p in (checkpoints / "iteration-00000002").glob("powersgd-*.pt"))
    assert saved == [f"powersgd-replica{r}-stage0-member{k}-of2.pt" for r in range(2) for k in range(2)]
    capfd.readouterr()
    after, got = run("after", 2, resume=str(checkpoints))
    assert "PowerSGD" not in capfd.readouterr().out  # every member continued, nothing to say
    assert before + after == pytest.approx(whole, rel=1e-5, abs=0)
    assert apart(got, expected) < 1e-5
    # the same plan without the state (error memory zero, Q from the seed) ends elsewhere
    fresh = without_powersgd_state(checkpoints / "iteration-00000002", tmp_path / "fresh")
    _, restarted = run("restarted", 2, resume=str(fresh))
    assert "PowerSGD starts afresh" in capfd.readouterr().out
    assert apart(restarted, expected) > 100 * 1e-5
    # 2 replicas without groups: the shards' state belongs to another cut
    ungrouped = write_test_plan(tmp_path, topology, **{**POWERSGD_PLAN, "tensor_groups": []}, name="ungrouped.yaml")
    run("ungrouped", 1, plan=ungrouped, resume=str(checkpoints))
    said = [line for line in capfd.readouterr().out.splitlines() if "PowerSGD" in line]
    assert len(said) == 1 and "another tensor degree" in said[0]
