"""Interleaved 1F1B (Narayanan et al. 2021, sec. 2.2.2): the op lists with model chunks, the
simulator's bubble (one case worked by hand) and the schedule's refusals."""

import numpy as np
import pytest

from cost_models.memory import peak_in_flight
from cost_models.network import Network
from cost_models.schedule import Op, interleaving_problem, peer_stage, piece_of, stage_ops
from cost_models.simulator import PipelineJob, simulate
from tests.op_lists import held_peak

CASES = [(2, 4, 2), (2, 2, 2), (4, 8, 2), (4, 4, 2), (4, 8, 4), (3, 9, 3), (2, 6, 3), (8, 16, 2)]


def _job(stages: int, micro_batches: int, chunks: int, f: float = 1.0, b: float = 2.0, share=None) -> PipelineJob:
    n = stages
    network = Network(link_latency_s=np.zeros((n, n)), link_bandwidth_bytes_per_s=np.full((n, n), 1e30),
                      host=np.arange(n), nic_egress_bytes_per_s=np.full(n, np.inf),
                      nic_ingress_bytes_per_s=np.full(n, np.inf))
    return PipelineJob(schedule="1f1b", device=np.arange(n)[None, :], micro_batches=np.array([micro_batches]),
                       forward_s=np.full((1, n), f), backward_s=np.full((1, n), b),
                       boundary_bytes=np.zeros(n - 1), network=network, sync_s=np.zeros(n), virtual_stages=chunks,
                       chunk_share=share)


def _messages(stages: int, micro_batches: int, chunks: int) -> tuple:
    """Per directed (stage, peer) pair: the messages sent, in the sender's op order, and those
    received, in the receiver's op order, each named by (direction, micro-batch, source piece)."""
    sent, received = {}, {}
    for s in range(stages):
        for kind, mb, chunk in stage_ops("1f1b", s, stages, micro_batches, 0, chunks):
            piece = piece_of(s, stages, chunk)
            if kind in ("send_fwd", "send_bwd"):
                forward = kind == "send_fwd"
                peer = peer_stage(s, stages, forward)
                sent.setdefault((s, peer), []).append((forward, mb, piece))
            elif kind in ("recv_fwd", "recv_bwd"):
                forward = kind == "recv_fwd"
                peer = peer_stage(s, stages, not forward)
                received.setdefault((peer, s), []).append((forward, mb, piece - 1 if forward else piece + 1))
    return sent, received


def test_two_stages_two_chunks_four_micro_batches_by_hand():
    """S = 2, v = 2, M = 4, a stage's forward F = 1 and backward B = 2 (a chunk's 0.5 and 1), free
    messages. Stage 0 runs 4 warm-up chunk forwards (2 (S - 1) + (v - 1) S), stage 1 runs 2; worked
    through op by op, stage 1's first backward starts at 2.0 (after chunk forwards 0-0.5 on stage 0,
    0.5-1 on stage 1, 1-1.5 on stage 0, 1.5-2 on stage 1), and stage 0's last backward (micro-batch 3,
    chunk 0) ends at 13.5: its 12 s of compute plus a 1.5 s bubble, (S - 1)(F + B) / v. Plain 1F1B
    ends at 15 (bubble (S - 1)(F + B) = 3)."""
    assert [(k, mb, c) for k, mb, c in stage_ops("1f1b", 1, 2, 4, 0, 2) if k in ("fwd", "bwd")][:4] == \
        [("fwd", 0, 0), ("fwd", 1, 0), ("fwd", 0, 1), ("bwd", 0, 1)]
    timeline = simulate(_job(2, 4, 2))
    assert timeline.iteration_s == pytest.approx(13.5)
    assert simulate(_job(2, 4, 1)).iteration_s == pytest.approx(15.0)
    first_backward = min(start for r, s, kind, mb, start, end in timeline.records if s == 1 and kind == "bwd")
    assert first_backward == pytest.approx(2.0)


@pytest.mark.parametrize("stages, micro_batches, chunks", CASES)
def test_bubble_shrinks_by_the_chunk_count(stages, micro_batches, chunks):
    """Narayanan et al. 2021, sec. 2.2.2: the bubble (S - 1)(F + B) of 1F1B becomes (S - 1)(F + B) / v."""
    f, b = 1.0, 2.0
    expected = micro_batches * (f + b) + (stages - 1) * (f + b) / chunks
    assert simulate(_job(stages, micro_batches, chunks, f, b)).iteration_s == pytest.approx(expected)


def test_uneven_chunks_take_their_share_of_the_stage():
    even = simulate(_job(2, 4, 2)).iteration_s
    uneven = simulate(_job(2, 4, 2, share=np.array([[0.75, 0.25], [0.5, 0.5]]))).iteration_s
    assert uneven > even
    records = simulate(_job(2, 4, 2, share=np.array([[0.75, 0.25], [0.5, 0.5]]))).records
    assert {round(end - start, 9) for r, s, kind, mb, start, end in records if s == 0 and kind == "fwd"} == {0.75, 0.25}


@pytest.mark.parametrize("stages, micro_batches, chunks", CASES)
def test_op_lists_run_every_chunk_once_in_order_and_match_their_messages(stages, micro_batches, chunks):
    for s in range(stages):
        ops = stage_ops("1f1b", s, stages, micro_batches, 0, chunks)
        for kind in ("fwd", "bwd"):
            assert sorted((mb, c) for k, mb, c in ops if k == kind) == \
                [(mb, c) for mb in range(micro_batches) for c in range(chunks)]
        for mb in range(micro_batches):
            for c in range(chunks):
                piece = piece_of(s, stages, c)
                assert ops.index(Op("fwd", mb, c)) < ops.index(Op("bwd", mb, c))
                if piece > 0:
                    assert ops.index(Op("recv_fwd", mb, c)) == ops.index(Op("fwd", mb, c)) - 1
                    assert ops.index(Op("send_bwd", mb, c)) == ops.index(Op("bwd", mb, c)) + 1
                if piece < stages * chunks - 1:
                    assert ops.index(Op("send_fwd", mb, c)) == ops.index(Op("fwd", mb, c)) + 1
                    assert ops.index(Op("recv_bwd", mb, c)) == ops.index(Op("bwd", mb, c)) - 1
            # the chunks of a micro-batch run in model order forward and in reverse backward
            forwards = [ops.index(Op("fwd", mb, c)) for c in range(chunks)]
            backwards = [ops.index(Op("bwd", mb, c)) for c in range(chunks)]
            assert forwards == sorted(forwards) and backwards == sorted(backwards, reverse=True)
        assert ops[-2:] == [Op("sync", -1), Op("step", -1)]
    # Point-to-point messages between two ranks are matched in order: each receiver takes the
    # messages from a peer in the order that peer sends them (else same-shaped tensors swap).
    sent, received = _messages(stages, micro_batches, chunks)
    assert sent == received


@pytest.mark.parametrize("stages, micro_batches, chunks", [c for c in CASES if c[1] > c[0]])
def test_first_stage_keeps_s_plus_s_minus_1_over_v_micro_batches(stages, micro_batches, chunks):
    """Stage 0 holds ``2 (S - 1) + (v - 1) S + 1`` chunk forwards at once, each 1/v of its layers:
    ``S + (S - 1) / v`` micro-batches' activations, (1 + (S - 1) / (S v)) x 1F1B's S (sec. 2.2.2)."""
    ops = stage_ops("1f1b", 0, stages, micro_batches, 0, chunks)
    peak = held_peak(ops)
    assert peak == min(2 * (stages - 1) + (chunks - 1) * stages + 1, micro_batches * chunks)
    if peak < micro_batches * chunks:
        assert peak / chunks == pytest.approx(stages * (1 + (stages - 1) / (stages * chunks)))
    assert held_peak(stage_ops("1f1b", 0, stages, micro_batches)) == stages


def test_one_chunk_is_plain_1f1b():
    for s in range(4):
        assert stage_ops("1f1b", s, 4, 7, 0, 1) == stage_ops("1f1b", s, 4, 7)


@pytest.mark.parametrize("schedule, stages, micro_batches, per_round, chunks, words", [
    ("gpipe", 2, [4], 0, 2, "1F1B only"),
    ("zb-h1", 2, [4], 0, 2, "1F1B only"),
    ("1f1b", 1, [4], 0, 2, "at least 2 pipeline stages"),
    ("1f1b", 2, [4, 3], 0, 2, "multiple of 2"),
    ("1f1b", 2, [8], 3, 2, "multiple of 2"),
    ("1f1b", 2, [4], 0, 0, "at least 1"),
])
def test_what_interleaving_cannot_run(schedule, stages, micro_batches, per_round, chunks, words):
    assert words in interleaving_problem(schedule, stages, micro_batches, per_round, chunks)
    with pytest.raises(ValueError, match=words):
        stage_ops(schedule, 0, stages, micro_batches[-1], per_round, chunks)


def test_rounds_of_a_multiple_of_s_interleave_each_round():
    ops = stage_ops("1f1b", 0, 2, 8, 4, 2)
    forwards = [mb for kind, mb, _ in ops if kind == "fwd"]
    backwards = [mb for kind, mb, _ in ops if kind == "bwd"]
    assert max(backwards[:8]) < min(forwards[8:])  # round 1's backwards before round 2's forwards
    assert not interleaving_problem("1f1b", 2, [8], 4, 2)


@pytest.mark.parametrize("stages, micro_batches, chunks", CASES)
def test_memory_model_counts_what_the_op_lists_keep(stages, micro_batches, chunks):
    for s in range(stages):
        held = held_peak(stage_ops("1f1b", s, stages, micro_batches, 0, chunks))
        assert peak_in_flight("1f1b", s, stages, micro_batches, 0, chunks) == pytest.approx(held / chunks)


INTERLEAVED_RUNS = {
    "two-stages-two-chunks": dict(assignment=[["a0", "b0"]], layer_bounds=[0, 1, 2, 3, 4], micro_batches=[4],
                                  micro_batch_size=2, schedule="1f1b", virtual_stages=2),
    "two-replicas-uneven-batch": dict(assignment=[["a0", "b0"], ["a1", "b1"]], layer_bounds=[0, 1, 2, 3, 4],
                                      micro_batches=[2, 4], micro_batch_size=1, schedule="1f1b", virtual_stages=2),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(INTERLEAVED_RUNS))
def test_interleaved_training_equals_single_process(tmp_path, case):
    """CPU, gloo, fp32: each rank holds two chunks (layers 0 and 2 on stage 0, 1 and 3 on stage 1),
    the tied embedding on chunk 0 of stage 0 and the head on chunk 1 of stage 1; losses and weights
    match single-process training to 1e-5."""
    from planner.runtime.launch import LaunchOptions, launch
    from tests.runtime_helpers import cpu_topology, write_test_plan
    from tests.test_runtime import _assert_matches_single_process

    kwargs = INTERLEAVED_RUNS[case]
    plan = write_test_plan(tmp_path, cpu_topology(tmp_path / "topology.yaml"), **kwargs)
    out = tmp_path / "run"
    results = launch(plan, LaunchOptions(backend="gloo", iterations=3, warmup=0, out_dir=str(out), learning_rate=0.05,
                                         save_state=True), log=lambda line: None)
    _assert_matches_single_process(results, out, kwargs, iterations=3, lr=0.05)
    chunks = {(op["stage"], op["chunk"]) for op in results["measured"]["trace"] if op["kind"] == "fwd"}
    assert chunks == {(0, 0), (0, 1), (1, 0), (1, 1)}


@pytest.mark.slow
def test_same_loss_as_torch_interleaved_pipelining(tmp_path):
    """The runtime's interleaved 1F1B and ``ScheduleInterleaved1F1B`` on the same four pieces (rank 0
    holds layers 0 and 2, rank 1 layers 1 and 3): the same losses (CPU, gloo, fp32)."""
    import dataclasses

    from planner.inputs.model import model_preset
    from planner.runtime.launch import LaunchOptions, launch
    from planner.runtime.reference import run_pipelining
    from tests.runtime_helpers import cpu_topology, write_test_plan

    spec = dataclasses.replace(model_preset("tiny"), tied_embeddings=False, vocabulary=100)
    plan = write_test_plan(tmp_path, cpu_topology(tmp_path / "topology.yaml"), model=spec,
                           assignment=[["a0", "a1"]], layer_bounds=[0, 1, 2, 3, 4], micro_batches=[4],
                           micro_batch_size=2, schedule="1f1b", virtual_stages=2)
    ours = launch(plan, LaunchOptions(backend="gloo", iterations=2, warmup=0, out_dir=str(tmp_path / "run"),
                                      learning_rate=0.05), log=lambda line: None)["measured"]["loss"]
    theirs, _ = run_pipelining(spec, [0, 1, 2, 3, 4], micro_batch_size=2, micro_batches=4, schedule="1f1b",
                               iterations=2, learning_rate=0.05, virtual_stages=2)
    assert len(theirs) == 2 and ours == pytest.approx(theirs, rel=1e-5)


def _emulated(tmp_path, name: str, **kwargs) -> dict:
    from planner.runtime.launch import LaunchOptions, launch
    from tests.runtime_helpers import cpu_topology, write_test_plan

    folder = tmp_path / name
    folder.mkdir()
    plan = write_test_plan(folder, cpu_topology(folder / "topology.yaml"), assignment=[["a0", "b2"]],
                           micro_batches=[4], micro_batch_size=4, schedule="1f1b", **kwargs)
    return launch(plan, LaunchOptions(backend="gloo", iterations=3, warmup=1, out_dir=str(folder / "run"),
                                      emulate=True, time_scale=20.0), log=lambda line: None)


@pytest.mark.slow
def test_emulated_interleaved_run_agrees_with_the_simulator(tmp_path):
    """Each chunk sleeps its share of the stage's compute and its messages wrap from the last stage to
    the first: the emulated iteration is the simulated one, as for the other schedules
    (``tests/test_runtime.py``), and so is the gain over plain 1F1B on the same devices."""
    interleaved = _emulated(tmp_path, "interleaved", layer_bounds=[0, 1, 2, 3, 4], virtual_stages=2)
    plain = _emulated(tmp_path, "plain", layer_bounds=[0, 2, 4])
    for run in (interleaved, plain):
        assert run["comparison"]["measured_s"] == pytest.approx(run["comparison"]["predicted_s"], rel=0.25)
    predicted = interleaved["comparison"]["predicted_s"] / plain["comparison"]["predicted_s"]
    measured = interleaved["comparison"]["measured_s"] / plain["comparison"]["measured_s"]
    # Here the messages cross hosts at 1 Gbps: three piece boundaries each way cost more than the bubble
    # saved (predicted 0.873 s against 0.756 s; measured 0.978 s and 0.767 s, each op's host overhead
    # counting twice as often when interleaved).
    assert predicted > 1.0 and measured == pytest.approx(predicted, rel=0.2)
    assert {(op["stage"], op["chunk"]) for op in interleaved["measured"]["trace"] if op["kind"] == "bwd"} == \
        {(0, 0), (0, 1), (1, 0), (1, 1)}


# -- plan file --------------------------------------------------------------------------------------

def _plan_document(tmp_path, **kwargs) -> dict:
    from planner.io import read_yaml
    from tests.runtime_helpers import cpu_topology, write_test_plan

    base = dict(assignment=[["a0", "b0"]], layer_bounds=[0, 1, 2, 3, 4], micro_batches=[4], micro_batch_size=2,
                schedule="1f1b", virtual_stages=2)
    path = write_test_plan(tmp_path, cpu_topology(tmp_path / "topology.yaml"), **{**base, **kwargs})
    return read_yaml(path)


def test_plan_file_names_each_stages_chunks_and_reads_back(tmp_path):
    import jsonschema

    from planner.plan.document import plan_from_document
    from tests.test_tensor_parallel import PLAN_SCHEMA

    document = _plan_document(tmp_path)
    assert document["virtual_stages"] == 2 and "layers" not in document["stages"][0]
    assert document["stages"][0]["chunks"] == [{"chunk": 0, "layers": [0, 1]}, {"chunk": 1, "layers": [2, 3]}]
    assert document["stages"][1]["chunks"] == [{"chunk": 0, "layers": [1, 2]}, {"chunk": 1, "layers": [3, 4]}]
    jsonschema.validate(document, PLAN_SCHEMA)
    plan = plan_from_document(document)
    assert plan.virtual_stages == 2 and plan.stages == 2 and plan.layer_bounds == (0, 1, 2, 3, 4)
    assert plan.chunk_layers(1) == [(1, 2), (3, 4)] and plan.stage_bounds == (0, 2, 4)
    with pytest.raises(jsonschema.ValidationError):  # a stage needs its layers or its chunks
        jsonschema.validate({**document, "stages": [{"devices": ["a0"]}] * 2}, PLAN_SCHEMA)


def test_interleave_plan_splits_each_stage_into_chunks_keeping_its_layers():
    from planner.plan.plan import Plan, interleave_plan

    plan = Plan(layer_bounds=(0, 13, 24), assignment=(("g0", "g1"),), micro_batches=(8,), micro_batch_size=2,
                schedule="1f1b")
    interleaved = interleave_plan(plan, 2)
    assert interleaved.chunk_layers(0) == [(0, 7), (13, 19)] and interleaved.chunk_layers(1) == [(7, 13), (19, 24)]
    assert interleaved.stage_bounds == plan.layer_bounds


@pytest.mark.parametrize("edit, field, words", [
    (lambda d: d["stages"][1]["chunks"].pop(), "stages[1].chunks", "lists 1 chunks, but virtual_stages is 2"),
    (lambda d: d["stages"][1]["chunks"][0].update(layers=[2, 3]), "stages[1].chunks[0].layers",
     r"the piece before it \(chunk 0 of stage 0\) ends at 1"),
    (lambda d: d["stages"][0]["chunks"][1].update(chunk=0), "stages[0].chunks[1].chunk", "must be 1"),
])
def test_an_edited_chunk_list_is_refused_in_one_line(tmp_path, edit, field, words):
    from planner.errors import InputError
    from planner.plan.document import plan_from_document

    document = _plan_document(tmp_path)
    edit(document)
    with pytest.raises(InputError, match=words) as caught:
        plan_from_document(document, source="p.yaml")
    assert caught.value.field == field and "\n" not in str(caught.value)


@pytest.mark.parametrize("kwargs, field, words", [
    (dict(micro_batches=[3], micro_batch_size=2), "virtual_stages", "multiple of 2"),
    (dict(layer_bounds=[0, 1, 1, 3, 4]), "stages", "every chunk needs at least one layer"),
])
def test_plans_interleaving_cannot_run_are_refused_at_launch(tmp_path, capsys, kwargs, field, words):
    from tests.runtime_helpers import cpu_topology, run_cli, write_test_plan

    base = dict(assignment=[["a0", "b0"]], layer_bounds=[0, 1, 2, 3, 4], micro_batches=[4], micro_batch_size=2,
                schedule="1f1b", virtual_stages=2)
    path = write_test_plan(tmp_path, cpu_topology(tmp_path / "topology.yaml"), **{**base, **kwargs})
    code, out, err = run_cli(["launch", path, "--backend", "gloo", "--out", tmp_path / "run"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert field in err and words in err


@pytest.mark.parametrize("training, words", [
    ({"schedule": "gpipe", "virtual_stages": 2}, "set schedule 1f1b or virtual_stages 1"),
    ({"schedule": "1f1b", "virtual_stages": 2, "compress_messages": "int8"}, "set compress_messages off"),
    ({"schedule": "1f1b", "virtual_stages": 0}, "from 1 to 16"),
])
def test_training_that_cannot_interleave_is_refused(training, words):
    from planner.errors import InputError
    from planner.inputs.model import parse_training

    with pytest.raises(InputError, match=words) as caught:
        parse_training({"global_batch": 8, **training})
    assert caught.value.field == "training.virtual_stages" or words == "set compress_messages off"


def test_report_names_the_interleaving_and_each_stages_chunks():
    from planner.inputs.job import load_job
    from planner.inputs.model import parse_model, parse_training
    from planner.io import read_yaml
    from planner.plan.document import plan_from_document
    from planner.report.text import render_plan
    from tests.conftest import ROOT

    document = read_yaml(ROOT / "benchmarks" / "plans" / "h100x2-interleaved.yaml")
    job = load_job(ROOT / document["topology"]["path"])
    text = render_plan(plan_from_document(document), job.topology, parse_model(document["model"]),
                       parse_training(document["training"]))
    assert "interleaved over 2 virtual stages per device" in text
    assert "stage 0 [0, 7)+[13, 19)" in text and "stage 1 [7, 13)+[19, 24)" in text
