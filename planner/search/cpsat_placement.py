"""Exact placement by CP-SAT (OR-Tools) for one shape: S stages x D replicas, a micro-batch size
and a schedule.

The model decides everything the search decides for that shape (which device holds each
(replica, stage), which devices stay idle, the layer split shared by all replicas and each
replica's micro-batch count) and minimises the search's own estimate
(``planner.search.evaluate.score_split``):

- per-micro-batch stage time ``tau[r, s] = (n_s * layer + head) / speed`` of the placed device;
- per replica the flow-shop makespan ``fill_r + (M_r - 1) * period_r`` with the pipeline links
  as extra machines: under 1F1B the slowest stage or link and the loops its in-flight windows allow
  (``evaluate.window_period_s``), under
  GPipe the forward phase's period plus the backward phase's (formulas.md, Pipeline schedules);
- each stage's last backward ``backward_share * tau`` and the gradient's busy time and latency over
  each boundary after its downstream stages' (``evaluate._drain_s``), then its gradient all-reduce over the ring the search would use for that set of devices (one Boolean per
  candidate set, so the ring's cost is exact whatever its order), then each worker's optimizer step;
- memory: state plus in-flight activations (``M_r`` under GPipe, ``min(S - s, M_r)`` under 1F1B)
  on every placed device.

The queueing of messages on hosts' shared NICs is left out (the estimate adds it, so the model's
bound still holds; on such networks its answer is reported as feasible, not optimal).

Only lower bounds on the max terms are stated: the objective grows with each of them, so an
optimum sets them tight and the model's minimum is the estimate's minimum. Times are integers of
``RESOLUTION_S``; memory is in bytes. Small instances (about a dozen devices) solve to proven
optimality in seconds; on larger ones the solver's best bound is a lower bound on the estimate of
every placement of the shape. Built in the shape of OR-Tools' ``line_balancing_sat`` example.
"""

import itertools
import math
import time
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from cost_models import memory
from cost_models.schedule import Schedule
from ortools.sat.python import cp_model

from planner.search.cpsat import RESOLUTION_S, make_solver
from planner.prediction.stage_model import powersgd_pass_s, stage_memory_bytes, stage_parameters, stage_step_bytes
from planner.search.evaluate import (Candidate, backward_share, gradient_bytes, ring_cost, score_split,
                                    stage_costs)

__all__ = ["ExactPlacement", "exact_placement", "model_is_small_enough", "MAX_RING_SETS"]

MAX_RING_SETS = 20_000  # candidate sync groups (stages x device subsets) the model may enumerate


@dataclass(frozen=True, kw_only=True)
class ExactPlacement:
    """What CP-SAT found for one shape. ``status``: optimal (proven), feasible (time limit reached),
    infeasible (no placement of this shape fits in memory) or unknown (nothing found in time)."""

    status: str
    candidate: Candidate | None  # the best placement found, scored by ``score_split``
    objective_s: float  # its estimate (inf when none)
    bound_s: float  # proven lower bound on the estimate of every placement of this shape
    wall_s: float


def model_is_small_enough(devices: int, stages: int, replicas: int) -> bool:
    """Whether the model's candidate sync groups (stages x C(devices, replicas)) can be enumerated."""
    return replicas == 1 or stages * math.comb(devices, replicas) <= MAX_RING_SETS


def exact_placement(ctx, stages: int, replicas: int, micro_batch_size: int, schedule: str, *,
                    time_limit_s: float = 60.0, work_limit: float | None = None, hint: Candidate | None = None,
                    workers: int = 1) -> ExactPlacement:
    """Solve the placement of ``stages x replicas`` devices to optimality, or until ``time_limit_s``
    seconds or ``work_limit`` units of CP-SAT's deterministic time (about seconds, the same on every
    machine) have passed.

    ``hint`` seeds the solver with a heuristic placement of the same shape. One worker by default,
    so the same inputs and work limit give the same answer; a proven optimum does not depend on it.
    """
    started = time.perf_counter()
    n, total = ctx.topology.size, ctx.training.global_batch // micro_batch_size
    costs = stage_costs(ctx, micro_batch_size, stages, replicas)
    if stages * replicas > n or stages > costs.layers or total < replicas:
        return ExactPlacement(status="infeasible", candidate=None, objective_s=math.inf, bound_s=math.inf,
                              wall_s=time.perf_counter() - started)
    if not model_is_small_enough(n, stages, replicas):
        raise ValueError(f"{stages} stages x C({n}, {replicas}) sync groups exceed the exact model's "
                         f"{MAX_RING_SETS}: use the heuristic search on this size")
    builder = _PlacementModel(ctx, costs, stages, replicas, total, schedule)
    if hint is not None and hint.assign.shape == (replicas, stages):
        builder.add_hint(hint)
        _complete_hint(builder.model, min(time_limit_s, 5.0))
    solver = make_solver(time_limit_s, workers=workers, work_limit=work_limit)
    status = solver.solve(builder.model)
    wall = time.perf_counter() - started
    if status == cp_model.INFEASIBLE:
        return ExactPlacement(status="infeasible", candidate=None, objective_s=math.inf, bound_s=math.inf, wall_s=wall)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        if status == cp_model.MODEL_INVALID:
            raise RuntimeError(f"invalid CP-SAT placement model: {builder.model.validate()}")
        return ExactPlacement(status="unknown", candidate=None, objective_s=math.inf,
                              bound_s=builder.seconds_below(solver.best_objective_bound), wall_s=wall)
    candidate = builder.decode(solver, micro_batch_size)
    bound = builder.seconds_below(solver.best_objective_bound)
    # Shared NICs: the model leaves out their queueing, which only adds to the estimate, so its
    # bound holds but its optimum is not proven to be the estimate's.
    proven = status == cp_model.OPTIMAL and not ctx.network.has_shared_nics
    return ExactPlacement(status="optimal" if proven else "feasible", candidate=candidate,
                          objective_s=candidate.score_s if candidate else math.inf, bound_s=bound, wall_s=wall)


def _complete_hint(model: cp_model.CpModel, time_limit_s: float):
    """Extend a hint on the decisions to every variable (a solve with the hinted ones fixed), so
    CP-SAT starts from the heuristic's placement instead of having to repair it."""
    fixed = model.clone()
    solver = make_solver(time_limit_s)
    solver.parameters.fix_variables_to_their_hinted_value = True
    solver.parameters.stop_after_first_solution = True
    if solver.solve(fixed) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return  # not completed in time; keep the partial hint
    values = [solver.value(fixed.get_int_var_from_proto_index(i)) for i in range(len(fixed.proto.variables))]
    model.clear_hints()
    for i, value in enumerate(values):
        model.add_hint(model.get_int_var_from_proto_index(i), value)


def _ns(seconds) -> np.ndarray:
    return np.rint(np.asarray(seconds, dtype=float) / RESOLUTION_S).astype(np.int64)


class _PlacementModel:
    """The variables (dicts keyed by tuples) and the constraints, added concern by concern."""

    def __init__(self, ctx, costs, stages: int, replicas: int, total: int, schedule: str):
        self.ctx, self.costs, self.S, self.R, self.total, self.schedule = ctx, costs, stages, replicas, total, schedule
        self.n, self.L = ctx.topology.size, costs.layers
        self.model = cp_model.CpModel()
        self._prepare_data()
        self._add_assignment()
        self._add_splits()
        self._add_stage_times()
        self._add_links()
        self._add_pipelines()
        self._add_memory()
        self._add_sync()
        self._add_steps()
        self._add_objective()

    # -- data, in integers -------------------------------------------------------------------
    def _prepare_data(self):
        ctx, c = self.ctx, self.costs
        self.layer_ns = _ns(c.layer_flops * ctx.slowdown(self.schedule) / ctx.speed)  # (n,)
        self.head_ns = _ns(c.head_flops * ctx.head_slowdown / ctx.speed)
        lat = np.asarray(ctx.network.latency_s)  # CP-SAT places a few devices: every pair at once
        one_way = ctx.network.busy_s(slice(None), slice(None), c.boundary_bytes)
        np.fill_diagonal(one_way, 0.0)
        self.round_trip_ns = _ns(one_way + one_way.T + lat + lat.T).ravel().tolist()  # index a * n + b
        self.forward_busy_ns = _ns(one_way).ravel().tolist()  # activation a -> b
        self.backward_busy_ns = _ns(one_way.T).ravel().tolist()  # gradient b -> a
        self.backward_latency_ns = _ns(lat.T).ravel().tolist()  # gradient b -> a
        share = Fraction(backward_share(c)).limit_denominator(12)
        self.share_num, self.share_den = share.numerator, share.denominator
        self.capacity_bytes = np.floor(ctx.capacity).astype(np.int64)
        self.slowest_stage_ns = int(self.L * self.layer_ns.max() + self.head_ns.max())
        self.horizon_ns = int(self.S * self.slowest_stage_ns + self.S * max(self.round_trip_ns)
                              + max(self.forward_busy_ns) + max(self.backward_busy_ns)) + 1

    # -- decisions ---------------------------------------------------------------------------
    def _add_assignment(self):
        m, n, R, S = self.model, self.n, self.R, self.S
        self.x = {(d, r, s): m.new_bool_var(f"device{d}_holds_r{r}_s{s}")
                  for d in range(n) for r in range(R) for s in range(S)}
        self.device = {}
        for r, s in itertools.product(range(R), range(S)):
            m.add_exactly_one(self.x[d, r, s] for d in range(n))
            self.device[r, s] = m.new_int_var(0, n - 1, f"device_of_r{r}_s{s}")
            m.add(self.device[r, s] == sum(d * self.x[d, r, s] for d in range(n)))
        for d in range(n):
            m.add_at_most_one(self.x[d, r, s] for r in range(R) for s in range(S))
        for r in range(R - 1):  # replicas are interchangeable: order them by their first stage's device
            m.add(self.device[r, 0] < self.device[r + 1, 0])

    def _add_splits(self):
        m = self.model
        self.layers = {s: m.new_int_var(1, self.L, f"layers_s{s}") for s in range(self.S)}
        m.add(sum(self.layers.values()) == self.L)
        self.micro = {r: m.new_int_var(1, self.total, f"micro_batches_r{r}") for r in range(self.R)}
        m.add(sum(self.micro.values()) == self.total)

    # -- time --------------------------------------------------------------------------------
    def _add_stage_times(self):
        m = self.model
        self.tau = {}
        for r, s in itertools.product(range(self.R), range(self.S)):
            self.tau[r, s] = m.new_int_var(0, self.slowest_stage_ns, f"tau_r{r}_s{s}")
            for d in range(self.n):
                head = int(self.head_ns[d]) if s == self.S - 1 else 0
                m.add(self.tau[r, s] >= int(self.layer_ns[d]) * self.layers[s] + head).only_enforce_if(self.x[d, r, s])

    def _add_links(self):
        m, n = self.model, self.n
        self.trip, self.forward, self.backward, self.backward_latency = {}, {}, {}, {}
        for r, s in itertools.product(range(self.R), range(self.S - 1)):
            pair = m.new_int_var(0, n * n - 1, f"link_r{r}_s{s}")
            m.add(pair == n * self.device[r, s] + self.device[r, s + 1])
            self.trip[r, s] = m.new_int_var(0, max(self.round_trip_ns), f"round_trip_r{r}_s{s}")
            self.forward[r, s] = m.new_int_var(0, max(self.forward_busy_ns), f"forward_busy_r{r}_s{s}")
            self.backward[r, s] = m.new_int_var(0, max(self.backward_busy_ns), f"backward_busy_r{r}_s{s}")
            m.add_element(pair, self.round_trip_ns, self.trip[r, s])
            m.add_element(pair, self.forward_busy_ns, self.forward[r, s])
            m.add_element(pair, self.backward_busy_ns, self.backward[r, s])
            self.backward_latency[r, s] = m.new_int_var(0, max(self.backward_latency_ns), f"backward_latency_r{r}_s{s}")
            m.add_element(pair, self.backward_latency_ns, self.backward_latency[r, s])

    def _add_pipelines(self):
        m, R, S = self.model, self.R, self.S
        self.pipeline = {}
        for r in range(R):
            fill = sum(self.tau[r, s] for s in range(S)) + sum(self.trip[r, s] for s in range(S - 1))
            period = m.new_int_var(0, self.horizon_ns, f"period_r{r}")
            if self.schedule == Schedule.GPIPE and S > 1:  # a forward phase, then a backward phase
                forward = m.new_int_var(0, self.horizon_ns, f"forward_period_r{r}")
                backward = m.new_int_var(0, self.horizon_ns, f"backward_period_r{r}")
                for s in range(S):
                    m.add(self.share_den * forward >= (self.share_den - self.share_num) * self.tau[r, s])
                    m.add(self.share_den * backward >= self.share_num * self.tau[r, s])
                for s in range(S - 1):
                    m.add(forward >= self.forward[r, s])
                    m.add(backward >= self.backward[r, s])
                m.add(period >= forward + backward)
            for s in range(S):
                m.add(period >= self.tau[r, s])
            for s in range(S - 1):
                m.add(period >= self.forward[r, s])
                m.add(period >= self.backward[r, s])
            if self.schedule == Schedule.ONE_F_ONE_B and S > 1:
                # k (s' - s) + 1 micro-batches per loop from stage s to s' and back (evaluate.window_period_s);
                # a stage holding as many as its replica's micro-batches, or a round's, never alternates:
                # its whole trip only
                depth, per_round = self.costs.warmup_depth, self.costs.micro_batches_per_round
                for s in range(S):
                    held = depth * (S - 1 - s) + 1
                    short = not (per_round > 0 and held >= per_round) and s + 1 < S - 1  # loops short of S - 1
                    if short:
                        alternates = m.new_bool_var(f"alternates_r{r}_s{s}")
                        m.add(self.micro[r] >= held + 1).only_enforce_if(alternates)
                        m.add(self.micro[r] <= held).only_enforce_if(alternates.Not())
                    for last in range(s + 1 if short else S - 1, S):
                        loop = (sum(self.tau[r, i] for i in range(s, last + 1))
                                + sum(self.trip[r, i] for i in range(s, last)))
                        constraint = m.add((depth * (last - s) + 1) * period >= loop)
                        if last < S - 1:
                            constraint.only_enforce_if(alternates)
            steady = m.new_int_var(0, (self.total - 1) * self.horizon_ns, f"steady_r{r}")
            extra = m.new_int_var(0, self.total - 1, f"extra_micro_batches_r{r}")
            m.add(extra == self.micro[r] - 1)
            m.add_multiplication_equality(steady, [extra, period])
            self.pipeline[r] = fill + steady

    def _add_memory(self):
        """``stage_memory_bytes`` is bilinear in (layers n, in-flight micro-batches f):
        ``a + b n + c f + d n f``; its four coefficients come from the function itself, rounded down
        (every split that fits in floats fits here, so the heuristic's hint is always feasible;
        ``decode`` re-checks the answer in floats). The in-flight count is the largest round's
        (``cost_models.memory.peak_in_flight``: GPipe ``min(M, p)``, 1F1B ``min(M, p, k (S - s - 1) + 1)``
        at warm-up depth k, ZB-H1
        ``min(M, p, k (S - 1) + 1)``, ``p`` the round's micro-batches); the messages a stage holds until the sync
        (``cost_models.memory.held_messages``) are linear in M and f, 1F1B's count
        (``memory.one_f_one_b_held``; exact for equal rounds, and at most ZB-H1's and a last smaller
        round's, whose rounds before it sent every gradient); under GPipe the M outputs, the
        gradients of earlier rounds left out (fewer than counted in floats)."""
        m, S = self.model, self.S
        message = math.floor(self.costs.boundary_bytes)
        per_round = self.costs.micro_batches_per_round
        for r, s in itertools.product(range(self.R), range(S)):
            bound = {Schedule.GPIPE: self.total, Schedule.ZERO_BUBBLE: self.costs.warmup_depth * (S - 1) + 1}.get(
                self.schedule, self.costs.warmup_depth * (S - s - 1) + 1)
            bound = min(bound, per_round) if per_round > 0 else bound
            in_flight = m.new_int_var(1, bound, f"in_flight_r{r}_s{s}")
            m.add_min_equality(in_flight, [self.micro[r], bound])
            if self.schedule == Schedule.GPIPE:
                held = self.micro[r] * int(s < S - 1)
            else:
                held = sum(memory.one_f_one_b_held(s, S, self.micro[r], in_flight))
            kept_layers = m.new_int_var(0, self.L * self.total, f"kept_layer_activations_r{r}_s{s}")
            m.add_multiplication_equality(kept_layers, [self.layers[s], in_flight])
            need = self._memory_coefficients(s)
            m.add(need[0] + need[1] * self.layers[s] + need[2] * in_flight + need[3] * kept_layers + message * held
                  <= sum(int(self.capacity_bytes[d]) * self.x[d, r, s] for d in range(self.n)))

    def _memory_coefficients(self, stage: int) -> tuple:
        def at(n, f):
            return float(stage_memory_bytes(self.costs, n, stage, f))
        base = at(0, 0)
        per_layer, per_in_flight = at(1, 0) - base, at(0, 1) - base
        per_both = at(1, 1) - at(1, 0) - at(0, 1) + base
        return tuple(math.floor(v) for v in (base, per_layer, per_in_flight, per_both))

    def _add_sync(self):
        """Stage s's all-reduce over the chosen set of devices: one Boolean per candidate set. Its
        bytes are ``gradient_bytes``: linear in the stage's layer count."""
        m, R, S, n = self.model, self.R, self.S, self.n
        self.sync = {s: 0 for s in range(S)}
        self.sync_horizon_ns = 0
        if R == 1:
            return
        fixed_bytes = gradient_bytes(self.costs, [0] * S)
        layer_bytes = gradient_bytes(self.costs, [1] * S) - fixed_bytes
        groups = list(itertools.combinations(range(n), R))
        rings = [ring_cost(self.ctx, np.array(g)) for g in groups]
        for s in range(S):
            chosen = [m.new_bool_var(f"sync_group{k}_s{s}") for k in range(len(groups))]
            for d in range(n):  # device d is in stage s exactly when the chosen set holds it
                m.add(sum(chosen[k] for k, g in enumerate(groups) if d in g)
                      == sum(self.x[d, r, s] for r in range(R)))
            longest = 0
            bounds = []
            for k, (per_byte, latency) in enumerate(rings):
                per_layer = int(_ns(layer_bytes[s] * per_byte))
                base = int(_ns(fixed_bytes[s] * per_byte + latency))
                bounds.append((chosen[k], per_layer, base))
                longest = max(longest, per_layer * self.L + base)
            self.sync[s] = m.new_int_var(0, longest, f"sync_ns_s{s}")
            self.sync_horizon_ns = max(self.sync_horizon_ns, longest)
            for flag, per_layer, base in bounds:
                m.add(self.sync[s] >= per_layer * self.layers[s] + base).only_enforce_if(flag)

    def _add_steps(self):
        """Each worker's optimizer step after its stage's all-reduce: the stage's parameters
        (``stage_parameters``, linear in its layer count) through the device's memory bandwidth."""
        m, S, c = self.model, self.S, self.costs
        extra = stage_parameters(c, 0.0, np.arange(S))
        fixed = stage_step_bytes(c, extra, np.arange(S))
        per_layer_ns = _ns(c.layer_params * c.optimizer_bytes_per_param / self.ctx.mem_bw
                           + powersgd_pass_s(c, c.layer_params, self.ctx.codec_bw))  # (n,)
        fixed_ns = _ns(fixed[None, :] / self.ctx.mem_bw[:, None]
                       + powersgd_pass_s(c, extra[None, :], self.ctx.codec_bw[:, None]))  # (n, S)
        self.step_horizon_ns = int((per_layer_ns * self.L + fixed_ns.max(axis=1)).max())
        self.step = {}
        for r, s in itertools.product(range(self.R), range(S)):
            self.step[r, s] = m.new_int_var(0, self.step_horizon_ns, f"step_ns_r{r}_s{s}")
            for d in range(self.n):
                m.add(self.step[r, s] >= int(per_layer_ns[d]) * self.layers[s]
                      + int(fixed_ns[d, s])).only_enforce_if(self.x[d, r, s])

    def _add_objective(self):
        m, R, S = self.model, self.R, self.S
        self.iteration = m.new_int_var(0, (self.total + S) * self.horizon_ns + self.sync_horizon_ns
                                       + self.step_horizon_ns, "iteration_ns")
        for s in range(S):
            finish = m.new_int_var(0, (self.total + S) * self.horizon_ns, f"last_backward_end_s{s}")
            for r in range(R):  # stage s ends backward_share of the upstream stages' tau, and the gradient's
                # transfers and latencies over the boundaries upstream, before the replica does
                upstream = sum(self.tau[r, k] for k in range(s))
                links = sum(self.backward[r, k] + self.backward_latency[r, k] for k in range(s))
                m.add(self.share_den * finish >= self.share_den * (self.pipeline[r] - links)
                      - self.share_num * upstream)
            for r in range(R):
                m.add(self.iteration >= finish + self.sync[s] + self.step[r, s])
        m.minimize(self.iteration)

    # -- hint and answer ---------------------------------------------------------------------
    def seconds_below(self, bound_ns: float) -> float:
        """A model bound in seconds, lowered by the most the rounding of its coefficients to whole
        nanoseconds can add along one replica's makespan and one all-reduce, so it bounds the
        unrounded estimate (the optimizer step's rounding included)."""
        allowance_ns = (self.total + self.S + 1) * (self.L + 2 * self.S + 2) + self.L + 2 * self.S + 1
        return max(0.0, (bound_ns - allowance_ns) * RESOLUTION_S)

    def add_hint(self, hint: Candidate):
        m = self.model
        rows = sorted(hint.assign.tolist(), key=lambda row: row[0])
        order = sorted(range(self.R), key=lambda r: hint.assign[r, 0])
        for r, s in itertools.product(range(self.R), range(self.S)):
            for d in range(self.n):
                m.add_hint(self.x[d, r, s], d == rows[r][s])
        for s in range(self.S):
            m.add_hint(self.layers[s], hint.layer_counts[s])
        for r in range(self.R):
            m.add_hint(self.micro[r], hint.micro_batches[order[r]])

    def decode(self, solver, micro_batch_size: int) -> Candidate | None:
        assign = np.array([[solver.value(self.device[r, s]) for s in range(self.S)] for r in range(self.R)])
        counts = tuple(int(solver.value(self.layers[s])) for s in range(self.S))
        micro = tuple(int(solver.value(self.micro[r])) for r in range(self.R))
        score = score_split(self.ctx, assign, counts, micro, micro_batch_size, self.schedule)
        if score is None:  # the rounding to whole bytes let a device overflow by a few bytes
            return None
        return Candidate(assign=assign, layer_counts=counts, micro_batches=micro, micro_batch_size=micro_batch_size,
                         schedule=self.schedule, score_s=score)
