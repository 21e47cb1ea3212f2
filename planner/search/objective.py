"""What the search minimises: an objective is a score of a plan and a lower bound on that score.

``IterationTime`` is the product's objective (the simulator's iteration time of a plan that fits);
``DtfmCost`` is DTFM's own (``COST_DP + 2 COST_PP`` of the plan's stage groups, dtfm.md), kept to
compare with DTFM on its terms. Both go through the one front door, ``planner.search.front.search``,
which asks the objective's ``engine`` for a plan and reports the objective's score, bound and gap.
"""

from typing import Protocol

import numpy as np

from cost_models import comm
from cost_models.dtfm import DTFM_C_DP_BYTES, DTFM_C_PP_BYTES, network_dtfm_cost
from planner.prediction.predict import predict
from planner.search.bounds import lower_bound_s
from planner.search.dtfm_search import dtfm_degrees

__all__ = ["Objective", "IterationTime", "DtfmCost", "OBJECTIVES"]


class Objective(Protocol):
    """``score`` of a plan and a ``lower_bound`` on the score of every plan (seconds, lower is better).

    ``engine`` names the search that proposes plans for it: ``"placement"`` (placement, layer and
    batch split by the estimate, then the simulator) or ``"allocation"`` (DTFM's allocation of
    devices to stage groups).
    """

    name: str
    engine: str

    def score(self, plan, topology, model, training) -> float: ...

    def lower_bound(self, topology, model, training) -> float: ...


class IterationTime:
    """The simulator's iteration time (``planner.prediction.predict``)."""

    name = "time"
    engine = "placement"

    def score(self, plan, topology, model, training) -> float:
        prediction = plan.prediction or predict(plan, topology, model, training)[0]
        return float(prediction.iteration_s)

    def lower_bound(self, topology, model, training) -> float:
        return lower_bound_s(topology, model, training)


class DtfmCost:
    """DTFM's objective of the plan's stage groups, on the network model's links (dtfm.md, sec. 3)."""

    name = "dtfm"
    engine = "allocation"

    def score(self, plan, topology, model, training) -> float:
        groups = [[topology.index(d) for d in plan.stage_devices(s)] for s in range(plan.stages)]
        return float(network_dtfm_cost(topology.network, groups).total_s)

    def lower_bound(self, topology, model, training) -> float:
        """The bound over DTFM's degrees (every device used; stages dividing the layers) of: COST_DP
        at least the cheapest member's exchange with its ``D - 1`` cheapest partners, and the path
        over ``S`` groups at least ``S - 1`` of the cheapest pipeline edges."""
        n = topology.size
        network = topology.network
        edge = network.transfer_matrix_s(DTFM_C_PP_BYTES)
        np.fill_diagonal(edge, np.inf)
        best = np.inf
        for stages, replicas in dtfm_degrees(n, model.layers):
            pair = comm.sharded_exchange_pair_s(DTFM_C_DP_BYTES, network.latency_s, network.bandwidth_bytes_per_s,
                                                replicas)
            np.fill_diagonal(pair, np.inf)
            dp = float(np.sort(pair, axis=1)[:, :replicas - 1].sum(axis=1).min()) if replicas > 1 else 0.0
            best = min(best, dp + 2.0 * (stages - 1) * float(edge.min()))
        return best if np.isfinite(best) else 0.0


OBJECTIVES = {objective.name: objective for objective in (IterationTime(), DtfmCost())}
