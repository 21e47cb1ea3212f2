"""Which stages replay their blocks as CUDA graphs (``planner.runtime.graphs``), as ``plan launch``
and ``plan calibrate`` decide it from ``--compile``, the backend and the stage."""

import pytest

from planner.runtime.graphs import Graphed, compiles, graphed_stages, stage_graphed


@pytest.mark.parametrize("choice, backend, expected", [
    ("auto", "nccl", Graphed.TENSOR), ("graphs", "nccl", Graphed.ALL), ("on", "nccl", Graphed.NONE),
    ("off", "nccl", Graphed.NONE), ("auto", "gloo", Graphed.NONE), ("graphs", "gloo", Graphed.NONE)])
def test_compile_choice_names_the_graphed_stages(choice, backend, expected):
    assert graphed_stages(choice, backend) == expected


def test_graphs_compile_wherever_they_run():
    assert compiles("graphs", "gloo") and compiles("graphs", "nccl")  # on CPUs compiled, without graphs


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
