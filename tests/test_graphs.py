"""Which stages replay their blocks as CUDA graphs (``planner.runtime.graphs``), as ``plan launch``
and ``plan calibrate`` decide it from ``--compile``, the backend and the stage."""

import pytest

from planner.runtime.graphs import Graphed, calibration_disagrees, compiles, graphed_stages, stage_graphed


@pytest.mark.parametrize("choice, backend, expected", [
    ("auto", "nccl", Graphed.TENSOR), ("graphs", "nccl", Graphed.ALL), ("on", "nccl", Graphed.NONE),
    ("off", "nccl", Graphed.NONE), ("auto", "gloo", Graphed.NONE), ("graphs", "gloo", Graphed.NONE)])
def test_compile_choice_names_the_graphed_stages(choice, backend, expected):
    assert graphed_stages(choice, backend) == expected


def test_graphs_compile_wherever_they_run():
    assert compiles("graphs", "gloo") and compiles("graphs", "nccl")  # on CPUs compiled, without graphs
    assert compiles("auto", "nccl") is True and compiles("auto", "gloo") is False  # auto: compiled on GPUs


@pytest.mark.parametrize("graphed, degree, zero_bubble, cuda, expected", [
    (Graphed.TENSOR, 1, False, True, False), (Graphed.TENSOR, 2, False, True, True),
    (Graphed.ALL, 1, False, True, True), (Graphed.NONE, 4, False, True, False),
    (Graphed.ALL, 4, True, True, False),  # ZB-H1's linear layers stay eager: never graphed
    (Graphed.TENSOR, 4, False, False, False), ("tensor", 2, False, True, True)])
def test_a_stage_is_graphed_by_the_choice_its_tensor_degree_its_schedule_and_its_device(graphed, degree, zero_bubble,
                                                                                          cuda, expected):
    assert stage_graphed(graphed, degree, zero_bubble=zero_bubble, cuda=cuda) is expected


@pytest.mark.parametrize("graphed", [Graphed.TENSOR, Graphed.ALL])
def test_a_tensor_group_that_receives_its_input_is_never_graphed(graphed):
    """A later stage's (or a virtual stage's) tensor group runs compiled without graphs: on GPUs its
    member re-recorded its graphs every iteration; a whole GPU's later stage keeps ``graphs``."""
    assert stage_graphed(graphed, 2, receives=False) is True
    assert stage_graphed(graphed, 2, receives=True) is False
    assert stage_graphed(Graphed.ALL, 1, receives=True) is True


def test_an_unknown_compile_choice_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="auto, on, off, graphs"):
        compiles("graph", "nccl")


def _types(**measured) -> dict:
    """A calibration's device types as ``read_calibration`` reads them: H100-SXM timed as ``measured``
    says, T4 with nothing said."""
    return {"H100-SXM": dict(measured), "T4": {}}


USED = {"H100-SXM", "T4"}


def test_a_launch_agrees_with_a_calibration_that_timed_its_blocks_the_same_way():
    graphed = _types(compiled=True, graphs="tensor")
    assert calibration_disagrees(graphed, USED, (2, 1), True, Graphed.TENSOR) is None
    assert calibration_disagrees(graphed, USED, (1, 1), True, Graphed.NONE) is None  # no tensor group: graphs nowhere
    assert calibration_disagrees(_types(compiled=True), USED, (1, 2), True, Graphed.NONE) is None  # before graphs
    assert calibration_disagrees(_types(compiled=False, graphs="tensor"), USED, (2,), False, Graphed.NONE) is None
    assert calibration_disagrees(_types(), USED, (2,), False, Graphed.NONE) is None  # nothing recorded: no claim
    assert calibration_disagrees(graphed, {"T4"}, (2, 1), False, Graphed.NONE) is None  # H100s unused


@pytest.mark.parametrize("measured, degrees, compiled, graphed, said", [
    ({"compiled": True, "graphs": "tensor"}, (2, 1), True, Graphed.NONE,
     "timed H100-SXM's blocks compiled, stage(s) 0 as CUDA graphs; this launch runs them compiled"),
    ({"compiled": True}, (1, 1), True, Graphed.ALL,
     "timed H100-SXM's blocks compiled; this launch runs them compiled, stage(s) 0, 1 as CUDA graphs"),
    ({"compiled": True, "graphs": "none"}, (1,), False, Graphed.NONE,
     "timed H100-SXM's blocks compiled; this launch runs them eager"),
    ({"compiled": False}, (4,), True, Graphed.TENSOR,
     "timed H100-SXM's blocks eager; this launch runs them compiled, stage(s) 0 as CUDA graphs"),
    # calibrate times every group graphed under auto; a launch graphs the first stage's only
    ({"compiled": True, "graphs": "tensor"}, (2, 2), True, Graphed.TENSOR,
     "timed H100-SXM's blocks compiled, stage(s) 0, 1 as CUDA graphs; this launch runs them compiled, stage(s) 0 "
     "as CUDA graphs")])
def test_a_launch_that_runs_the_blocks_otherwise_is_told_how_each_timed_them(measured, degrees, compiled, graphed,
                                                                              said):
    assert calibration_disagrees(_types(**measured), USED, degrees, compiled, graphed) == said


def test_the_launch_side_follows_the_worker_under_zb_h1_and_virtual_stages():
    """ZB-H1 graphs nothing and virtual stages' groups receive their input: as the worker runs them."""
    graphed = _types(compiled=True, graphs="tensor")
    assert calibration_disagrees(graphed, USED, (2,), True, Graphed.TENSOR, zero_bubble=True) == (
        "timed H100-SXM's blocks compiled, stage(s) 0 as CUDA graphs; this launch runs them compiled")
    assert calibration_disagrees(graphed, USED, (2,), True, Graphed.TENSOR, virtual_stages=2) == (
        "timed H100-SXM's blocks compiled, stage(s) 0 as CUDA graphs; this launch runs them compiled")
    assert calibration_disagrees(_types(compiled=True), USED, (2,), True, Graphed.TENSOR, zero_bubble=True) is None


def test_a_calibration_file_knows_exactly_the_graphed_values():
    from planner.inputs.calibration import GRAPHED_VALUES

    assert GRAPHED_VALUES == tuple(g.value for g in Graphed)


def test_a_calibration_that_timed_received_groups_apart_agrees_with_a_launch_of_later_stage_groups():
    """``plan calibrate --compile auto`` now times a group again without graphs, as a later stage's
    group runs (``tensor_block_received_s``): a launch of 2 stages on groups of 2 (the second
    ungraphed) or of virtual stages is then timed as it runs; ``--compile on`` still is not."""
    apart = _types(compiled=True, graphs="tensor", tensor_block_received_s=((2, ((1, 0.003),)),))
    assert calibration_disagrees(apart, USED, (2, 2), True, Graphed.TENSOR) is None
    assert calibration_disagrees(apart, USED, (2,), True, Graphed.TENSOR, virtual_stages=2) is None
    # ZB-H1 never graphs; its first stage's group is priced by the received timings too.
    assert calibration_disagrees(apart, USED, (2, 2), True, Graphed.TENSOR, zero_bubble=True) is None
    assert calibration_disagrees(apart, USED, (2, 2), True, Graphed.NONE) == (
        "timed H100-SXM's blocks compiled, stage(s) 0 as CUDA graphs; this launch runs them compiled")
