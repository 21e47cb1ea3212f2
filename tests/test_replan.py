"""Re-planning after devices are lost or added: the state each device must receive, its move time
on the network model, the trade of move time against iteration time, and the plan's moves section."""

from pathlib import Path

import pytest
import yaml

from planner.inputs.model import model_preset, parse_training
from planner.inputs.topology import parse_topology
from planner.plan.document import plan_to_document, write_plan
from planner.plan.plan import Plan
from planner.search.front import SearchOptions
from planner.search.replan import CHECKPOINT, holdings, plan_moves, replan, state_pieces
from tests.runtime_helpers import run_cli

# One device per host (no tensor groups possible), hosts joined at 100 Gbit/s and 1 ms.
_NETWORK = {"host": {"latency": "10us", "bandwidth": "100GB/s"}, "region": {"latency": "1ms", "bandwidth": "100Gbps"}}
_OPTIONS = SearchOptions(time_limit_s=2.0)


def _topology(name: str, devices: list, kind: str = "A100-80GB", **extra) -> dict:
    return {"name": name, "devices": [{"name": d, "type": kind, "host": f"host-{d}", **extra} for d in devices],
            "network": _NETWORK}


def _parsed(document: dict):
    return parse_topology(document, name=document["name"])


def _training(global_batch: int, **changes):
    return parse_training({"global_batch": global_batch, "micro_batch_size": 2, "precision": "bf16",
                           "optimizer": "adam", "schedule": "1f1b", "recompute": False, **changes})


def _two_replicas(topology, idle: tuple) -> Plan:
    return Plan(layer_bounds=(0, 24), assignment=(("g0",), ("g1",)), micro_batches=(1, 1), micro_batch_size=2,
                schedule="1f1b", topology_name=topology.name, topology_sha256=topology.sha256, idle=idle)


def _gpt3_xl_parameters() -> int:
    """gpt3-xl by hand: 24 blocks of 12h^2 + 13h, the embedding (vocabulary padded to 50,304 rows)
    and learned positions, the final LayerNorm; the head is tied."""
    h = 2048
    return 24 * (12 * h * h + 13 * h) + 50_304 * h + 2048 * h + 2 * h


def test_state_pieces_count_weights_and_optimizer_state_by_hand():
    pieces = state_pieces(model_preset("gpt3-xl"), _training(4))
    weights = sum(w for w, _ in pieces.values())
    state = sum(s for _, s in pieces.values())
    assert weights == pytest.approx(2 * _gpt3_xl_parameters())  # bf16 weights
    assert state == pytest.approx(12 * _gpt3_xl_parameters())  # fp32 master, momentum, variance
    fp32_sgd = state_pieces(model_preset("gpt3-xl"), _training(4, precision="fp32", optimizer="sgd"))
    assert sum(w for w, _ in fp32_sgd.values()) == pytest.approx(4 * _gpt3_xl_parameters())
    assert sum(s for _, s in fp32_sgd.values()) == pytest.approx(4 * _gpt3_xl_parameters())  # momentum


def test_holdings_follow_stages_and_shards():
    topology = _parsed(_topology("four", ["g0", "g1", "g2", "g3"]))
    model = model_preset("gpt3-xl")
    plan = Plan(layer_bounds=(0, 10, 24), assignment=(("g0", "g1"), ("g2", "g3")), micro_batches=(2, 2),
                micro_batch_size=2, schedule="1f1b", topology_name=topology.name, topology_sha256=topology.sha256)
    held = holdings(plan, model, _training(8))
    assert set(held["g0"]) == {"embedding"} | {f"block {i}" for i in range(10)}
    assert set(held["g3"]) == {"head", "embedding"} | {f"block {i}" for i in range(10, 24)}  # the tied copy
    assert held["g2"]["block 3"] == (1.0, 0.5)  # whole weights, half the optimizer state (2 shards)
    assert plan_moves(plan, plan, topology, model, _training(8)).moves == ()  # staying moves nothing


def test_a_substituted_device_receives_the_lost_state_from_its_peer_by_hand():
    """2 replicas on g0 and g1; g2 takes g1's place: g2 receives the whole model's bf16 weights and
    half its Adam state (2 shards) from g0, in 1 ms + bytes / 100 Gbit/s."""
    topology = _parsed(_topology("four", ["g0", "g1", "g2", "g3"]))
    model, training = model_preset("gpt3-xl"), _training(4)
    old = _two_replicas(topology, idle=("g2", "g3"))
    new = Plan(layer_bounds=(0, 24), assignment=(("g0",), ("g2",)), micro_batches=(1, 1), micro_batch_size=2,
               schedule="1f1b", topology_name=topology.name, topology_sha256=topology.sha256, idle=("g1", "g3"))
    moves = plan_moves(old, new, topology, model, training)
    (move,) = moves.moves
    assert (move.receiver, move.source) == ("g2", "g0")
    assert set(move.pieces) == set(holdings(old, model, training)["g1"])
    expected = _gpt3_xl_parameters() * (2 + 12 / 2)
    assert move.bytes == pytest.approx(expected)
    assert moves.seconds == pytest.approx(1e-3 + expected / 12.5e9)
    unsharded = plan_moves(old, new, topology, model, _training(4, shard_optimizer=False))
    assert unsharded.bytes == pytest.approx(_gpt3_xl_parameters() * (2 + 12))


def test_a_stage_held_by_a_tensor_group_comes_from_all_its_members():
    """Stage 1 on the tensor group g2 g3 (one host) moves to g4 alone: g4 receives the blocks from g2
    and g3 in equal shares, and the head and tied embedding, which each member holds whole, from one."""
    host = {"name": "one-host", "network": _NETWORK,
            "devices": [{"name": f"g{i}", "type": "A100-80GB", "host": "n0"} for i in range(5)]}
    topology = _parsed(host)
    model, training = model_preset("gpt3-xl"), _training(4, shard_optimizer=False)
    old = Plan(layer_bounds=(0, 12, 24), assignment=(("g0", "g2"),), micro_batches=(2,), micro_batch_size=2,
               schedule="1f1b", topology_name=topology.name, topology_sha256=topology.sha256, idle=("g1", "g4"),
               tensor_groups=(("g2", "g3"),))
    new = Plan(layer_bounds=(0, 12, 24), assignment=(("g0", "g4"),), micro_batches=(2,), micro_batch_size=2,
               schedule="1f1b", topology_name=topology.name, topology_sha256=topology.sha256,
               idle=("g1", "g2", "g3"))
    moves = plan_moves(old, new, topology, model, training)
    assert moves.receivers == {"g4"} and moves.checkpoint_bytes == 0
    pieces = state_pieces(model, training)
    for i in range(12, 24):  # each block: half from each member
        senders = [m for m in moves.moves if f"block {i}" in m.pieces]
        assert sorted(m.source for m in senders) == ["g2", "g3"]
    blocks = sum(sum(pieces[f"block {i}"]) for i in range(12, 24))
    whole = {m.source: m.bytes - (blocks / 2 if m.source in ("g2", "g3") else 0.0) for m in moves.moves}
    assert sum(whole.values()) == pytest.approx(sum(pieces["head"]) + sum(pieces["embedding"]))


def test_losing_one_device_moves_only_the_state_it_held():
    """The search's plan for four GPUs of one host; g1 is lost and g9, the same GPU in the same host,
    is added: the old layout with g9 in g1's place is as fast as before, so the re-plan moves the
    state g1 held (weights and optimizer shard, from its peers) to g9, nothing else."""
    from planner.search.front import search

    def host(names):
        return {"name": "gpus", "network": _NETWORK,
                "devices": [{"name": n, "type": "A100-80GB", "host": "n0"} for n in names]}

    old_topology, new_topology = _parsed(host(["g0", "g1", "g2", "g3"])), _parsed(host(["g0", "g9", "g2", "g3"]))
    model, training = model_preset("gpt3-xl"), _training(32)
    found = search(old_topology, model, training, _OPTIONS)
    old = found.plan
    assert "g1" in old.used_devices
    result = replan(old, new_topology, model, found.training, _OPTIONS)
    assert result.lost == ("g1",) and result.added == ("g9",)
    assert result.chosen == "old layout with g9 for g1", result.why
    assert "moves only the state the lost device(s) held" in result.why
    assert result.moves.receivers == {"g9"} and "g1" not in {m.source for m in result.moves.moves}
    pieces = state_pieces(model, found.training)
    held = holdings(old, model, found.training)["g1"]
    assert result.moves.bytes == pytest.approx(sum(pieces[p][0] * w + pieces[p][1] * s for p, (w, s) in held.items()))
    assert result.plan.prediction.iteration_s == pytest.approx(old.prediction.iteration_s, rel=1e-9)


def test_move_weight_trades_moves_against_a_faster_plan():
    """g1 is lost and g5, g6, g7 are added; the optimizer state is not sharded. Dropping g1's replica
    moves nothing, a spare in its place moves g1's state; with 8 micro-batches the search's plan on
    more replicas is faster. Weighed over 1000 iterations the faster plan wins and says why more
    moves; weighed over 0.001 iterations the plan that moves nothing wins."""
    old_topology = _parsed(_topology("two", ["g0", "g1"]))
    new_topology = _parsed(_topology("grown", ["g0", "g5", "g6", "g7"]))
    model, training = model_preset("gpt3-xl"), _training(16, shard_optimizer=False)
    old = Plan(layer_bounds=(0, 24), assignment=(("g0",), ("g1",)), micro_batches=(4, 4), micro_batch_size=2,
               schedule="1f1b", topology_name=old_topology.name, topology_sha256=old_topology.sha256)
    fast = replan(old, new_topology, model, training, _OPTIONS, move_weight=1000)
    assert fast.added == ("g5", "g6", "g7") and fast.lost == ("g1",)
    assert fast.chosen == "the search's plan for the new topology"
    assert fast.why.startswith("the search's plan runs") and "--move-weight" in fast.why
    dropped = next(o for o in fast.options if o.label == "old layout without replica(s) 1")
    assert dropped.moves.moves == () and fast.moves.seconds > 0
    assert fast.plan.prediction.iteration_s < min(o.iteration_s for o in fast.options[:-1])
    assert fast.score_s == pytest.approx(fast.plan.prediction.iteration_s + fast.moves.seconds / 1000)
    least = replan(old, new_topology, model, training, _OPTIONS, move_weight=0.001)
    assert least.chosen == "old layout without replica(s) 1" and least.moves.moves == ()
    assert "moves no state" in least.why or "moves only" in least.why


def test_when_the_old_layout_cannot_run_without_the_device_it_says_why():
    """Two 16 GB V100 stages; v1 is lost, the spares have 10 GB: neither a spare in its place nor
    v0 alone holds the model, so more state moves, and the reason names the memory."""
    memory = {"memory": "10GB"}
    old_topology = _parsed({"name": "v100s", "network": _NETWORK,
                            "devices": [{"name": n, "type": "V100-16GB", "host": f"host-{n}"} for n in ("v0", "v1")]})
    new_topology = _parsed({"name": "with-spares", "network": _NETWORK, "devices": [
        {"name": "v0", "type": "V100-16GB", "host": "host-v0"},
        {"name": "s0", "type": "T4", "host": "host-s0", **memory},
        {"name": "s1", "type": "T4", "host": "host-s1", **memory}]})
    model = model_preset("gpt3-xl")
    training = _training(8, precision="fp16", recompute=True, micro_batch_size=1)
    old = Plan(layer_bounds=(0, 12, 24), assignment=(("v0", "v1"),), micro_batches=(8,), micro_batch_size=1,
               schedule="1f1b", topology_name=old_topology.name, topology_sha256=old_topology.sha256)
    result = replan(old, new_topology, model, training, _OPTIONS)
    assert result.chosen == "the search's plan for the new topology"
    assert result.why.startswith("the old layout cannot run without v1")
    assert "s0 would need" in result.why and "of its 9.31 GiB" in result.why  # the memory table's units
    # stage 1's only holder is lost: its state is read from the checkpoint
    assert any(m.source == CHECKPOINT for m in result.moves.moves) and result.moves.checkpoint_bytes > 0


def _files(tmp_path: Path) -> tuple:
    old_doc = {**_topology("four", ["g0", "g1", "g2", "g3"]), "model": {"preset": "gpt3-xl"},
               "training": {"global_batch": 4, "micro_batch_size": 2, "precision": "bf16"}}
    (tmp_path / "old.yaml").write_text(yaml.safe_dump(old_doc))
    (tmp_path / "new.yaml").write_text(yaml.safe_dump(_topology("three", ["g0", "g2", "g3"])))
    old_topology = _parsed(old_doc)
    plan = _two_replicas(old_topology, idle=("g2", "g3"))
    write_plan(plan_to_document(plan, model=model_preset("gpt3-xl"), training=_training(4),
                                topology_source=str(tmp_path / "old.yaml")), tmp_path / "plan.yaml")
    return tmp_path / "new.yaml", tmp_path / "plan.yaml"


def test_cli_prints_the_moves_and_writes_them_with_the_plan(tmp_path, capsys):
    new, old = _files(tmp_path)
    code, out, err = run_cli([new, "--from", old, "--time-limit", "2", "-o", tmp_path / "replanned.yaml"], capsys)
    assert code == 0, err
    assert "Moves from" in out and "lost g1; added none" in out
    assert "Options weighed:" in out and "old layout without replica(s) 1" in out and "old layout with g2 for g1" in out
    record = yaml.safe_load((tmp_path / "replanned.yaml").read_text())["search"]["replan"]
    assert record["lost"] == ["g1"] and record["move_weight"] == 1000 and record["moves"]
    table = out.split("Moves from", 1)[1]
    for move in record["moves"]:  # each move printed as "to  from  state  bytes  time"
        assert any(line.split()[:2] == [move["to"], move["from"]] for line in table.splitlines() if line.strip())


@pytest.mark.parametrize("extra, field", [(["--move-weight", "0"], "--move-weight"),
                                          (["--move-weight", "nan"], "--move-weight"),
                                          (["--model", "tiny"], "--model"),
                                          (["--objective", "dtfm"], "--objective")])
def test_cli_refuses_bad_replan_options_in_one_line(tmp_path, capsys, extra, field):
    new, old = _files(tmp_path)
    code, out, err = run_cli([new, "--from", old] + extra, capsys)
    assert code == 2 and err.count("\n") == 1 and f"field '{field}'" in err, err


def test_move_weight_without_from_is_refused(tmp_path, capsys):
    new, _ = _files(tmp_path)
    code, out, err = run_cli([tmp_path / "old.yaml", "--move-weight", "10"], capsys)
    assert code == 2 and "field '--move-weight'" in err and "--from" in err


def _shipped_topologies(fewest_devices: int) -> list:
    """The shipped topology files of at least ``fewest_devices`` devices."""
    paths = []
    for path in sorted(Path(__file__).parent.parent.glob("topologies/*/*.yaml")):
        document = yaml.safe_load(path.read_text())
        if "devices" in document and sum(d.get("count", 1) for d in document["devices"]) >= fewest_devices:
            paths.append(str(path))
    return paths


def test_a_topology_without_its_only_device_is_refused_in_one_line():
    from planner.errors import InputError
    from planner.io import read_yaml
    from planner.search.replan import topology_without

    (path,) = [p for p in _shipped_topologies(1) if p not in _shipped_topologies(2)]
    document = read_yaml(path)
    with pytest.raises(InputError, match="non-empty list of devices"):
        _parsed(topology_without(document, [_parsed(document).names[0]]))


@pytest.mark.parametrize("path", _shipped_topologies(2))
def test_topology_without_a_device_keeps_every_other_device_and_link(path):
    """The elastic launch writes the topology without a lost device: the rest parse to the same
    devices, hosts and links (counts written out one device each)."""
    import numpy as np

    from planner.io import read_yaml
    from planner.search.replan import topology_without

    document = read_yaml(path)
    whole = _parsed(document)
    lost = whole.names[len(whole.names) // 2]
    rest = _parsed(topology_without(document, [lost]))
    keep = [i for i, name in enumerate(whole.names) if name != lost]
    assert rest.names == [whole.names[i] for i in keep]
    assert [d.host for d in rest.devices] == [whole.devices[i].host for i in keep]
    assert [d.memory_bytes for d in rest.devices] == [whole.devices[i].memory_bytes for i in keep]
    assert np.array_equal(rest.latency_s, whole.latency_s[np.ix_(keep, keep)])
    assert np.array_equal(rest.bandwidth_bytes_per_s, whole.bandwidth_bytes_per_s[np.ix_(keep, keep)])


def test_a_bf16_plan_replanned_onto_a_device_without_bf16_is_one_line(tmp_path, capsys):
    _, old = _files(tmp_path)
    document = _topology("with-t4", ["g0", "g2", "g3"])
    document["devices"].append({"name": "t4", "type": "T4", "host": "host-t4"})
    (tmp_path / "with-t4.yaml").write_text(yaml.safe_dump(document))
    code, out, err = run_cli([tmp_path / "with-t4.yaml", "--from", old, "--time-limit", "1"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert "field 'devices'" in err and "t4" in err and "trains in bf16" in err and "with-t4.yaml" in err


def test_lost_devices_named_on_the_old_cluster_equal_a_replan_onto_the_changed_file(tmp_path, capsys):
    """``--lost g1`` on the old cluster's file plans as the changed cluster's own file does, and
    writes that cluster beside the plan, so ``plan launch`` finds it (same sha256)."""
    from planner.inputs.job import load_topology

    new, old = _files(tmp_path)
    code, out, err = run_cli([tmp_path / "old.yaml", "--from", old, "--lost", "g1", "--budget", "1",
                              "-o", tmp_path / "lost.yaml"], capsys)
    assert code == 0, err
    assert "lost g1; added none" in out and "lost.topology.yaml" in out
    lost = yaml.safe_load((tmp_path / "lost.yaml").read_text())
    written = load_topology(tmp_path / "lost.topology.yaml")
    assert written.names == ["g0", "g2", "g3"]
    assert lost["topology"]["sha256"] == written.sha256
    assert lost["topology"]["path"] == str(tmp_path / "lost.topology.yaml")
    (tmp_path / "three.yaml").write_text(yaml.safe_dump(written_document := yaml.safe_load(
        (tmp_path / "lost.topology.yaml").read_text())))
    assert written_document["devices"] == [d for d in _topology("x", ["g0", "g2", "g3"])["devices"]]
    code, out, err = run_cli([tmp_path / "three.yaml", "--from", old, "--budget", "1", "-o", tmp_path / "file.yaml"],
                             capsys)
    assert code == 0, err
    by_file = yaml.safe_load((tmp_path / "file.yaml").read_text())
    assert by_file["stages"] == lost["stages"] and by_file["replicas"] == lost["replicas"]


def test_added_devices_join_the_changed_cluster(tmp_path, capsys):
    """Lose g1 and add a spare of the same type on its own host: the changed cluster written beside
    the plan holds the spare (linked by the topology's levels) and the re-plan reports both."""
    from planner.inputs.job import load_topology

    _, old = _files(tmp_path)
    (tmp_path / "spare.yaml").write_text(yaml.safe_dump(
        {"devices": [{"name": "spare", "type": "A100-80GB", "host": "host-spare"}]}))
    code, out, err = run_cli([tmp_path / "old.yaml", "--from", old, "--lost", "g1", "--added", tmp_path / "spare.yaml",
                              "--budget", "1", "-o", tmp_path / "new.yaml"], capsys)
    assert code == 0, err
    assert "lost g1; added spare" in out
    record = yaml.safe_load((tmp_path / "new.yaml").read_text())["search"]["replan"]
    assert record["added"] == ["spare"] and record["lost"] == ["g1"]
    cluster = load_topology(tmp_path / "new.topology.yaml")
    assert cluster.names == ["g0", "g2", "g3", "spare"]
    assert cluster.bandwidth_bytes_per_s[0, 3] == cluster.bandwidth_bytes_per_s[0, 1]  # hosts linked alike


@pytest.mark.parametrize("args, field, words", [
    (["--lost", "g9"], "--lost", "g9, not a device"),
    (["--added", "{spare}"], "devices", "'devices' list"),
    (["--lost", "g1", "--topology-is-new"], "--lost", "is another"),
])
def test_lost_and_added_mistakes_are_one_line(tmp_path, capsys, args, field, words):
    new, old = _files(tmp_path)
    (tmp_path / "spare.yaml").write_text(yaml.safe_dump({"device": [{"name": "spare"}]}))
    topology = new if "--topology-is-new" in args else tmp_path / "old.yaml"
    args = [str(tmp_path / "spare.yaml") if a == "{spare}" else a for a in args if a != "--topology-is-new"]
    code, out, err = run_cli([topology, "--from", old, *args, "-o", tmp_path / "p.yaml"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert f"field '{field}'" in err and words in err, err
    assert not (tmp_path / "p.yaml").exists() and not (tmp_path / "p.topology.yaml").exists()


def test_lost_without_from_is_refused(tmp_path, capsys):
    _files(tmp_path)
    code, out, err = run_cli([tmp_path / "old.yaml", "--lost", "g1"], capsys)
    assert code == 2 and "field '--lost'" in err and "--from" in err


def test_lost_needs_an_output_and_never_writes_over_its_inputs(tmp_path, capsys):
    """Without -o the plan could not name the changed cluster: one line. An -o whose
    ``.topology.yaml`` is TOPOLOGY itself is refused and TOPOLOGY keeps its bytes."""
    _, old = _files(tmp_path)
    code, out, err = run_cli([tmp_path / "old.yaml", "--from", old, "--lost", "g1"], capsys)
    assert code == 2 and err.count("\n") == 1 and "field '--lost'" in err and "-o FILE" in err, err
    (tmp_path / "lab.topology.yaml").write_bytes((tmp_path / "old.yaml").read_bytes())
    plan_path = tmp_path / "lab-plan.yaml"
    assert run_cli([tmp_path / "lab.topology.yaml", "-o", plan_path, "--budget", "1"], capsys)[0] == 0
    before = (tmp_path / "lab.topology.yaml").read_bytes()
    code, out, err = run_cli([tmp_path / "lab.topology.yaml", "--from", plan_path, "--lost", "g1",
                              "-o", tmp_path / "lab.yaml"], capsys)
    assert code == 2 and err.count("\n") == 1 and "one of this command's inputs" in err, err
    assert (tmp_path / "lab.topology.yaml").read_bytes() == before and not (tmp_path / "lab.yaml").exists()


def test_a_relative_calibration_file_stays_the_same_file_in_the_changed_cluster(tmp_path, capsys):
    """TOPOLOGY's network names its calibration relative to TOPOLOGY's folder; the changed cluster,
    written into another folder, still reads that file."""
    from planner.inputs.job import load_topology

    root = Path(__file__).resolve().parent.parent
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "in" / "cal.yaml").write_bytes(
        (root / "benchmarks" / "results" / "accuracy_gpu4" / "calibration.yaml").read_bytes())
    document = yaml.safe_load((root / "topologies" / "local" / "h100-x4.yaml").read_text())
    document["network"] = {"calibration": "cal.yaml", **document["network"]}
    (tmp_path / "in" / "x4.yaml").write_text(yaml.safe_dump(document))
    assert run_cli([tmp_path / "in" / "x4.yaml", "-o", tmp_path / "in" / "old.yaml", "--budget", "1"], capsys)[0] == 0
    code, out, err = run_cli([tmp_path / "in" / "x4.yaml", "--from", tmp_path / "in" / "old.yaml", "--lost", "gpu-3",
                              "--budget", "1", "-o", tmp_path / "out" / "new.yaml"], capsys)
    assert code == 0, err
    cluster = load_topology(tmp_path / "out" / "new.topology.yaml")
    assert cluster.names == ["gpu-0", "gpu-1", "gpu-2"]
    whole = load_topology(tmp_path / "in" / "x4.yaml")
    assert cluster.bandwidth_bytes_per_s[0, 1] == whole.bandwidth_bytes_per_s[0, 1]  # the measured link


def test_a_replan_refuses_virtual_stages_in_one_line(tmp_path, capsys):
    new, old = _files(tmp_path)
    code, out, err = run_cli([new, "--from", old, "--virtual-stages", "2"], capsys)
    assert code == 2 and err.count("\n") == 1 and "field '--virtual-stages'" in err, err


def test_a_replan_takes_a_calibration_or_the_old_plans(tmp_path, capsys):
    """``--calibration`` on a re-plan applies the measurements and records them; without it the old
    plan's calibration (the same file by hash) is applied; a changed file is one line."""
    from planner.inputs.calibration import calibration_record, read_calibration
    from tests.test_calibration import _calibration

    new, old = _files(tmp_path)
    cal = _calibration(tmp_path / "cal.yaml", efficiency=0.05, kind="A100-80GB", names=("g0", "g2"))
    predicted = {}
    for name, extra in (("plain", []), ("calibrated", ["--calibration", cal])):
        code, out, err = run_cli([new, "--from", old, "--budget", "1", "-o", tmp_path / f"{name}.yaml", *extra], capsys)
        assert code == 0, err
        document = yaml.safe_load((tmp_path / f"{name}.yaml").read_text())
        predicted[name] = document["prediction"]["iteration_s"]
        assert ("calibration" in document) == (name == "calibrated")
    assert f"Calibration: {cal}" in out
    assert document["calibration"]["sha256"] == read_calibration(cal).sha256
    # the A100s measured at 5% of peak: the re-plan is predicted on them
    assert predicted["calibrated"] > 2 * predicted["plain"]
    # an old plan made with the calibration: the re-plan applies it without being told
    document = yaml.safe_load(old.read_text())
    assert "calibration" not in document
    document["calibration"] = calibration_record(read_calibration(cal))
    (tmp_path / "old-calibrated.yaml").write_text(yaml.safe_dump(document))
    code, out, err = run_cli([new, "--from", tmp_path / "old-calibrated.yaml", "--budget", "1",
                              "-o", tmp_path / "inherited.yaml"], capsys)
    assert code == 0, err
    inherited = yaml.safe_load((tmp_path / "inherited.yaml").read_text())
    assert inherited["calibration"]["sha256"] == read_calibration(cal).sha256
    assert inherited["prediction"]["iteration_s"] == pytest.approx(predicted["calibrated"], rel=1e-9)
    # plan launch --elastic's re-plan after a lost rank applies the old plan's calibration too
    from planner.runtime.inputs import load_run_inputs
    from planner.prediction.predict import predict
    from planner.runtime.launch import LaunchOptions, _replan_without

    elastic = {}
    for name in ("old-calibrated.yaml", "plan.yaml"):
        inputs, result, files = _replan_without(load_run_inputs(tmp_path / name), "g1", 1,
                                                LaunchOptions(out_dir=str(tmp_path / f"elastic-{name}"),
                                                              replan_budget_s=2))
        elastic[name] = result.plan.prediction.iteration_s
        assert ("calibration" in yaml.safe_load(Path(files["plan"]).read_text())) == (name != "plan.yaml")
        # the launcher loads the written plan on the same calibrated devices
        assert predict(inputs.plan, inputs.topology, inputs.model, inputs.training)[0].iteration_s == \
            pytest.approx(elastic[name], rel=1e-9)
    assert elastic["old-calibrated.yaml"] > 2 * elastic["plan.yaml"]
    _calibration(cal, efficiency=0.06, kind="A100-80GB", names=("g0", "g2"))  # measured again since
    code, out, err = run_cli([new, "--from", tmp_path / "old-calibrated.yaml", "--budget", "1"], capsys)
    assert code == 2 and err.count("\n") == 1 and "field 'calibration.sha256'" in err and "--calibration" in err, err


def test_a_plan_whose_workers_recompute_differently_is_replanned_at_the_trainings_mode(tmp_path):
    """Per-worker recomputation (``Plan.recompute``) belongs to the old cells: a kept layout runs
    every worker at the training's mode (the heaviest the old plan ran, which fits wherever the
    lighter modes did); a plan file of a selective training re-plans."""
    from dataclasses import replace

    from planner.search.replan import _with_topology, read_old_plan

    def host(names):
        return {"name": "gpus", "network": _NETWORK,
                "devices": [{"name": n, "type": "A100-80GB", "host": "n0"} for n in names]}

    old_topology, new_topology = _parsed(host(["g0", "g1", "g2", "g3"])), _parsed(host(["g0", "g9", "g2", "g3"]))
    old = Plan(layer_bounds=(0, 12, 24), assignment=(("g0", "g1"), ("g2", "g3")), micro_batches=(8, 8),
               micro_batch_size=2, schedule="1f1b", topology_name=old_topology.name,
               topology_sha256=old_topology.sha256, recompute=(("full", "none"), ("selective", "none")))
    kept = _with_topology(old, new_topology, assignment=(("g0", "g9"), ("g2", "g3")))
    assert kept.recompute == () and kept.assignment == (("g0", "g9"), ("g2", "g3"))
    model, training = model_preset("gpt3-xl"), _training(32, recompute="selective")
    path = tmp_path / "old.yaml"
    write_plan(plan_to_document(replace(old, recompute=()), model=model, training=training), path)
    plan, _, read = read_old_plan(path)
    assert read.recompute == "selective"
    result = replan(plan, new_topology, model, read, _OPTIONS)
    assert result.plan.prediction.fits
