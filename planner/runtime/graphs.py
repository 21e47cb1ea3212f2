"""Which stages replay their blocks as CUDA graphs (``planner.runtime.gpt.compile_stage``), as
``plan launch`` and ``plan calibrate`` decide it from ``--compile``.

``auto`` on GPUs (NCCL) graphs the stages with a tensor group: a member's share of a block takes the
GPU about as long as, or less than, its host takes to issue the block's kernels, so the host sets
the pace; replayed as a graph, the host issues a block in about 1 ms whatever its kernels. On 4x H200
a GPT-3 XL block of a group of 4 at micro-batch 2 took 3.29 ms forward and backward compiled, issued
in 3.00 ms, and 1.37 ms as a graph (a group of 2: 3.75 -> 1.82 ms; at micro-batch 4, where the
products are larger, 3.31 -> 3.27 ms) with the same gradients (``benchmarks/cuda_graphs.py``). A
whole GPU's block, issued in 36-72% of its GPU time, gained 1.5-3.6% (2.63 -> 2.59 ms at
micro-batch 2), within the host's run-to-run spread, and its graphs' pool took 1-16% more memory,
so ``auto`` leaves it compiled without graphs; ``graphs`` graphs every compiled stage. ZB-H1's split
backward (``planner.runtime.gpt.compile_split_stage``) is never graphed: its weight pass reads
tensors of the input pass's graphs after later micro-batches' graphs have run.

A tensor group is graphed only on the first stage of a plan without virtual stages, whose input is
the stage's own embedding, not a received message: on 4x H100 (``accuracy.py gpu4``, 2 stages x
groups of 2 at micro-batch 4, ``benchmarks/results/accuracy_gpu4_h100_graphs``) the second stage's
non-lead member re-recorded its graphs in every iteration (torch's CUDA graph trees: 120 new
recordings an iteration, none on its lead, no fallback counted), and the iteration took 6.36 s
instead of the 0.43 s predicted, while the first stage's group ran as timed and one stage on a group
of 4 at micro-batch 8 measured 0.508 s against 0.510 s predicted. Such a stage runs compiled
without graphs under every choice.

In a graphed stage each iteration is one graph step (``torch.compiler.cudagraph_mark_step_begin``,
``planner.runtime.engine``): a graph output (an activation, a micro-batch's gradient that autograd
keeps as ``p.grad``) may be overwritten once the next step begins, so nothing of an iteration may be
read after it. The runtime meets this because every optimizer sets the gradients to ``None`` (or
zeroes flat buffers of its own: ZeRO-1) at its step, and the step ends every iteration.
"""

from enum import Enum

__all__ = ["Graphed", "COMPILE_CHOICES", "compiles", "graphed_stages", "stage_graphed", "receives_input",
           "group_ungraphed", "calibration_disagrees", "release_graphs"]

COMPILE_CHOICES = ("auto", "on", "off", "graphs")  # ``--compile`` of plan launch and plan calibrate


class Graphed(str, Enum):
    """The compiled stages that replay their blocks as CUDA graphs."""

    NONE = "none"
    TENSOR = "tensor"  # stages with a tensor group
    ALL = "all"


def compiles(choice: str, backend: str) -> bool:
    """Whether the ranks compile their blocks and loss: ``auto`` compiles on GPUs (NCCL), where it
    pays (``benchmarks/runtime_gpu.py``), and not on CPUs, where tests and emulation run eager. Under
    ZB-H1 the blocks compile with their products split (``planner.runtime.gpt.compile_split_stage``)."""
    _check(choice)
    return choice in ("on", "graphs") or (choice == "auto" and backend == "nccl")


def graphed_stages(choice: str, backend: str) -> Graphed:
    """Which compiled stages replay their blocks as CUDA graphs under ``--compile choice``: graphs
    need GPUs (NCCL)."""
    if backend != "nccl" or not compiles(choice, backend):
        return Graphed.NONE
    return {"graphs": Graphed.ALL, "auto": Graphed.TENSOR}.get(choice, Graphed.NONE)


def receives_input(stage: int, virtual_stages: int) -> bool:
    """Whether ``stage``'s blocks take their input from a received pipeline message rather than the
    stage's own embedding: every stage but the first, and every stage of a plan with virtual stages
    (the first stage's later chunks receive from the last stage). ``stage_graphed``'s ``receives``."""
    return stage > 0 or virtual_stages > 1


def group_ungraphed(stage: int, virtual_stages: int, zero_bubble: bool = False) -> bool:
    """Whether a tensor group on ``stage`` runs without CUDA graphs under every ``--compile``: it
    receives its input (``receives_input``) or ZB-H1 splits its backward (``stage_graphed``). Such a
    group is priced by its calibration's received timings, which ``plan calibrate`` takes without
    graphs (``planner.plan.tensor.TensorGroups.placed``)."""
    return zero_bubble or receives_input(stage, virtual_stages)


def stage_graphed(graphed: Graphed | str, degree: int, *, zero_bubble: bool = False, cuda: bool = True,
                  receives: bool = False) -> bool:
    """Whether a stage whose tensor group has ``degree`` members replays its blocks as CUDA graphs:
    on a CUDA device, not under ZB-H1, as ``graphed`` says; a tensor group only where the stage
    ``receives`` no pipeline message into its blocks (the first stage without virtual stages)."""
    graphed = Graphed(graphed)
    if zero_bubble or not cuda or (receives and degree > 1):
        return False
    return graphed == Graphed.ALL or (graphed == Graphed.TENSOR and degree > 1)


def calibration_disagrees(device_types: dict, used_types, degrees: tuple, compiled: bool, graphed: Graphed | str, *,
                          zero_bubble: bool = False, virtual_stages: int = 1) -> str | None:
    """What a launch that runs the blocks ``compiled`` with ``graphed`` stages does differently from how
    a calibration (its ``device_types``, as ``planner.inputs.calibration.read_calibration`` reads
    them: ``compiled`` and ``graphs`` where the file says) timed those of ``used_types``, for a plan
    whose stages have tensor ``degrees`` (the first stage first) under ZB-H1 or not and with
    ``virtual_stages``: the plan's predicted time describes the calibrated run. A launch graphs only
    a group that receives no message (``stage_graphed``); ``plan calibrate`` times a group's blocks
    graphed wherever its ``--compile`` graphs groups and, where it did, once more without graphs as a
    group that receives its input (``tensor_block_received_s``, which prices the later stages' groups),
    so only a file without those (written before they were timed) is said for a later stage's group
    or a ZB-H1 plan's group (``group_ungraphed``).
    None where they agree (a file written before graphs existed timed none)."""
    def how(is_compiled: bool, stages) -> str:
        if not is_compiled:
            return "eager"
        graphed_ones = [s for s in stages if s[1]]
        return "compiled" + (f", stage(s) {', '.join(str(s[0]) for s in graphed_ones)} as CUDA graphs"
                             if graphed_ones else "")

    for type_name in sorted(set(device_types) & set(used_types)):
        entry = device_types[type_name]
        if "compiled" not in entry:
            continue
        timed_graphs = entry.get("graphs", "none") if entry["compiled"] else "none"
        apart = "tensor_block_received_s" in entry  # received groups timed as a launch runs them
        timed = [(s, stage_graphed(timed_graphs, d, receives=apart and group_ungraphed(s, virtual_stages, zero_bubble)))
                 for s, d in enumerate(degrees)]
        run = [(s, compiled and stage_graphed(graphed, d, zero_bubble=zero_bubble,
                                              receives=receives_input(s, virtual_stages))) for s, d in enumerate(degrees)]
        if entry["compiled"] != compiled or timed != run:
            return f"timed {type_name}'s blocks {how(entry['compiled'], timed)}; this launch runs them {how(compiled, run)}"
    return None


def _check(choice: str) -> None:
    if choice not in COMPILE_CHOICES:
        raise ValueError(f"compile must be one of {', '.join(COMPILE_CHOICES)}, not {choice!r}")


def release_graphs(device) -> None:
    """Free the CUDA graphs torch.compile recorded in this process, before its process group goes:
    NCCL's ``ncclCommDestroy`` waits while a graph that captured one of the communicator's
    collectives is alive, so a tensor group's ranks (their all-reduces inside the graphs) hung at exit
    after training (pytorch/pytorch issue 115388, "destroy_process_group() hangs after CUDA graph
    capture of NCCL operations": freeing the graphs first is the workaround given there)."""
    import gc

    import torch
    from torch._inductor.cudagraph_trees import reset_cudagraph_trees

    torch.cuda.synchronize(device)
    reset_cudagraph_trees()
    gc.collect()
