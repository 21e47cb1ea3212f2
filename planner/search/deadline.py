"""The search's budget: deterministic work per phase, sized by the work budget, with the clock as a cap.

Each phase of the placement search gets a share of the work budget ``work_s`` (``--budget``; the
time limit when not given), in seconds of work at rates set below what a 2-core machine does
unloaded (estimates, CP-SAT deterministic time, simulated events), and the same share of the time
limit ``limit_s`` (``--time-limit``) as its deadline. While every phase ends on its work budget,
not on the clock, the same seed and budget give the same plan whatever the load and the time
limit; where the clock ends a phase first (a loaded or slower machine, or a budget larger than
the limit), the plan may differ, and the search record lists the phases the clock cut
(``clock_cut``). Whatever the load, the search ends within the limit plus at
most one unit of work that cannot be split: one degree pair's constructive layouts, one CP-SAT
hint completion, one round of split refinement, or ``SMALL_SIMULATION_S`` of the event simulation
of the first finalist. A simulation is sized before it starts (``simulation_units`` at
``SIMULATION_UNITS_PER_S``): the first finalist's refinement ends early enough to leave it
``SIMULATION_MARGIN`` times that time before the finalists' end, one predicted not to end by then
is not started, and one that runs past it is stopped
(``cost_models.simulator.SimulationCut``); where the first finalist's simulation is cut so, the
plan keeps the search's estimate (``Prediction.cost_model`` ``estimate``) and ``clock_cut`` names
``simulation``.

The phases, in order: ``construct`` ends at ``CONSTRUCT_END`` of the limit; while no plan fits it
goes on to ``CONSTRUCT_UNPLANNED_END`` at most (the work budget and the clock alike), and ends
there without a plan (the search then refuses, naming the budget and the limit) rather than past
the limit; where its first plan that fits came past ``CONSTRUCT_END``, the phases after it share
what is left (``construct_ended``). The finalists' share (refinement and event simulation) is
reserved next, sized by the best constructed plan's
simulation work (``simulation_units``), between ``FINALISTS_MIN`` and ``FINALISTS_MAX`` of the
limit; ``local``, ``genetic`` and ``exact`` split the time between, and ``finalists`` ends at
``FINALISTS_END`` of the limit, leaving the rest for the plan's validation and the lower bound.
"""

import math
import time
from dataclasses import dataclass, field

__all__ = ["Budget", "CONSTRUCT_END", "CONSTRUCT_UNPLANNED_END", "FINALISTS_END", "FINALISTS_MIN", "FINALISTS_MAX",
           "MIDDLE_ENDS",
           "ESTIMATES_PER_S", "CONSTRUCT_UNITS_PER_S", "EXACT_WORK_PER_S", "REFINE_ESTIMATES_PER_S",
           "SIMULATION_UNITS_PER_S", "SMALL_SIMULATION_S", "SIMULATION_MARGIN", "construct_units", "simulation_units",
           "plan_simulation_s", "simulation_s"]

CONSTRUCT_END = 0.25
FINALISTS_END = 0.97
FINALISTS_MIN, FINALISTS_MAX = 0.40, 0.60
# Construction without a plan yet may take the limit up to the finalists' least share: the phases
# between would have nothing to improve, and the finalists keep room to refine and simulate the first plan.
CONSTRUCT_UNPLANNED_END = FINALISTS_END - FINALISTS_MIN
UNPLANNED = "construct without a plan"  # the span construction may take while no plan fits
MIDDLE_ENDS = {"local": 0.40, "genetic": 0.55, "exact": 1.0}  # of the time between construct and finalists

# Work per second of a phase's share, set below what 2 cores do unloaded. Measured: a constructive
# evaluation of a 64-device shape ~3 ms; a local-search or genetic estimate 1.5-2.6 ms on case 5
# (64 devices) but 6-12 ms on a 4-device topology whose batch split dominates; a split
# refinement's estimate ~0.3 ms; an event simulation 35-41 us CPU per ``simulation_units`` (64 to
# 16,384 devices, 2 to 32 stages; 2.5 times that in wall time on the loaded shared machine).
CONSTRUCT_UNITS_PER_S = 225.0  # constructive evaluations of 64 devices (``construct_units``)
ESTIMATES_PER_S = 200.0  # local-search and genetic estimates
REFINE_ESTIMATES_PER_S = 2000.0  # split-refinement estimates
SIMULATION_UNITS_PER_S = 25_000.0  # ``simulation_units`` simulated
# The first finalist's simulation (the plan's own prediction) may take this long past the limit, so
# that a plan small enough to simulate in a blink is never left at its estimate by a tiny limit.
SMALL_SIMULATION_S = 0.5
# The first finalist's refinement leaves its simulation this many times the time its size predicts
# before the limit's end: the rate is an unloaded machine's, one refinement estimate at 4,096
# devices takes up to a second, and making the plan of 16,384 devices 1.3 s.
SIMULATION_MARGIN = 2.0
EXACT_WORK_PER_S = 1.0  # CP-SAT deterministic time (about seconds)


def construct_units(devices_used: int) -> float:
    """Work of one constructive evaluation, in units of a 64-device shape's (its cost grows about
    as the square root of the devices placed: 0.2 ms at 8, 3 ms at 64, 10-17 ms at 1,024)."""
    return max(1.0, math.sqrt(devices_used / 64.0))


def simulation_units(stages: int, replicas: int, micro_batches: int) -> float:
    """Work the simulator does for a plan: each stage's forward and backward of every micro-batch
    with their messages, and each stage's all-reduce, one reservation of its ``R`` replicas' ring
    (``cost_models.simulator``). Measured 35-41 us CPU per unit from 2 x 512 to 32 x 32 on 1,024
    devices, 2 x 8,192 on 16,384 and 32 x 128 on 4,096."""
    return stages * micro_batches + stages * replicas


def simulation_s(stages: int, replicas: int, micro_batches: int, virtual_stages: int = 1) -> float:
    """A simulation of a plan of that shape (``micro_batches`` over all replicas; ``virtual_stages``
    chunks per device), in seconds at ``SIMULATION_UNITS_PER_S`` as its size predicts."""
    return virtual_stages * simulation_units(stages, replicas, micro_batches) / SIMULATION_UNITS_PER_S


def plan_simulation_s(plan) -> float:
    """A simulation of ``plan``, in seconds (``simulation_s``)."""
    return simulation_s(plan.stages, plan.replicas, sum(plan.micro_batches), plan.virtual_stages)


@dataclass(kw_only=True)
class Budget:
    """The phases' deadlines and work budgets for one search of ``limit_s`` seconds from ``started``."""

    limit_s: float
    started: float
    work_s: float = None  # the work budget, in seconds at the rates above; None: ``limit_s``
    clock: object = None  # seconds, monotonic; None: time.perf_counter, looked up at each reading
    clock_cut: list = field(default_factory=list)  # phases the clock ended before their work budget
    stopped: bool = False  # a progress callback asked to stop: every phase is out of time
    finalists: float = FINALISTS_MIN  # the finalists' fraction, set by ``reserve_finalists``
    spent: dict = field(default_factory=dict)  # work used per phase, seconds at the rates above (``spend``)
    construct_end: float = CONSTRUCT_END  # where construction's share ends, moved on by ``construct_ended``

    def __post_init__(self):
        if self.work_s is None:
            self.work_s = self.limit_s

    def stop(self) -> None:
        self.stopped = True

    def spend(self, phase: str, seconds: float) -> None:
        """Count ``seconds`` of work (at the rates above) as used by ``phase``."""
        self.spent[phase] = self.spent.get(phase, 0.0) + seconds

    @property
    def spent_s(self) -> float:
        """The work used so far, over every phase: a search that ends a phase on its stopping rule
        before its share leaves the rest (``work_s - spent_s``) unused."""
        return sum(self.spent.values())

    def reserve_finalists(self, stages: int, replicas: int, micro_batches: int) -> None:
        """Size the finalists' share by the simulation work of a plan like the best constructed
        one (two simulations and their refinement), within its bounds."""
        needed = 2.0 * simulation_units(stages, replicas, micro_batches) / SIMULATION_UNITS_PER_S
        self.finalists = min(max(needed / self.work_s if self.work_s > 0 else 1.0, FINALISTS_MIN), FINALISTS_MAX,
                             FINALISTS_END - self.construct_end)

    def construct_ended(self, first_plan_units: float) -> None:
        """Construction found its first plan that fits after ``first_plan_units`` constructive units:
        where that is past its share, its share ends there (at most ``CONSTRUCT_UNPLANNED_END``) and
        the phases after it share what is left of the limit and of the work budget."""
        used = first_plan_units / CONSTRUCT_UNITS_PER_S / self.work_s if self.work_s > 0 else CONSTRUCT_UNPLANNED_END
        self.construct_end = min(max(used, CONSTRUCT_END), CONSTRUCT_UNPLANNED_END)

    def _bounds(self, phase: str) -> tuple:
        """(start, end) of ``phase`` as fractions of the limit (and of the work budget)."""
        if phase == "construct":
            return 0.0, self.construct_end
        if phase == UNPLANNED:
            return 0.0, CONSTRUCT_UNPLANNED_END
        finalists_start = FINALISTS_END - self.finalists
        if phase == "finalists":
            return finalists_start, FINALISTS_END
        middle0 = self.construct_end
        span = max(finalists_start - middle0, 0.0)
        names = list(MIDDLE_ENDS)
        before = MIDDLE_ENDS[names[names.index(phase) - 1]] if names.index(phase) else 0.0
        return middle0 + before * span, middle0 + MIDDLE_ENDS[phase] * span

    def end(self, phase: str) -> float:
        """The clock time at which ``phase`` must stop."""
        return self.started if self.stopped else self.started + self._bounds(phase)[1] * self.limit_s

    def share_s(self, phase: str) -> float:
        """Seconds of the limit that ``phase`` gets."""
        start, end = self._bounds(phase)
        return (end - start) * self.limit_s

    def work_share_s(self, phase: str) -> float:
        """Seconds of the work budget that ``phase`` gets."""
        start, end = self._bounds(phase)
        return (end - start) * self.work_s

    def estimates(self, phase: str, cap: int, devices: int = 64) -> int:
        """The deterministic estimate budget of ``local`` or ``genetic`` (at least 1, at most ``cap``)
        for plans of ``devices`` (an estimate's cost grows with them as ``construct_units``)."""
        return max(1, min(cap, int(ESTIMATES_PER_S * self.work_share_s(phase) / construct_units(devices))))

    def construct_units(self, planned: bool = True) -> float:
        """Construction's budget in constructive units; ``planned=False``: while no plan fits yet."""
        return CONSTRUCT_UNITS_PER_S * self.work_share_s("construct" if planned else UNPLANNED)

    def out_of_time_unplanned(self) -> bool:
        """Whether the clock has passed the end of construction without a plan (a cut of ``construct``)."""
        if self.now() < self.end(UNPLANNED):
            return False
        self.note_cut("construct", True)
        return True

    def exact_work(self, shapes: int, cap: float) -> float:
        """CP-SAT deterministic time per shape."""
        return min(cap, EXACT_WORK_PER_S * self.work_share_s("exact") / max(shapes, 1))

    def finalists_work_s(self) -> float:
        """The finalists' deterministic budget, in seconds at the rates above."""
        return self.work_share_s("finalists")

    @property
    def first_simulation_end(self) -> float:
        """The clock time by which the plan's first simulation must end: the finalists' end, also
        where a callback stopped the search (the search still needs a plan)."""
        return self.started + FINALISTS_END * self.limit_s

    def now(self) -> float:
        return time.perf_counter() if self.clock is None else self.clock()

    def remaining_s(self, phase: str) -> float:
        return self.end(phase) - self.now()

    def out_of_time(self, phase: str) -> bool:
        """Whether the clock has passed ``phase``'s end (recorded as a cut)."""
        if self.now() < self.end(phase):
            return False
        self.note_cut(phase, True)
        return True

    def note_cut(self, phase: str, stopped_early: bool) -> None:
        """Record that the clock, not the work budget, ended ``phase``."""
        if stopped_early and phase not in self.clock_cut and not self.stopped:
            self.clock_cut.append(phase)
