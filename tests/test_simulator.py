import numpy as np
import pytest

from cost_models.network import Network
from cost_models.schedule import Op, stage_ops
from cost_models.simulator import PipelineJob, simulate


def _job(schedule, R=1, S=4, M=8, forward=1.0, backward=2.0, latency=0.0, bandwidth=np.inf, sync=0.0,
         micro_batches=None):
    n = R * S
    return PipelineJob(
        schedule=schedule, device=np.arange(n).reshape(R, S),
        micro_batches=np.array(micro_batches if micro_batches is not None else [M] * R),
        forward_s=np.broadcast_to(np.asarray(forward, float), (R, S)).copy(),
        backward_s=np.broadcast_to(np.asarray(backward, float), (R, S)).copy(),
        boundary_bytes=np.ones(max(S - 1, 0)),
        network=Network(link_latency_s=np.full((n, n), latency), link_bandwidth_bytes_per_s=np.full((n, n), bandwidth),
                        host=np.arange(n), nic_egress_bytes_per_s=np.full(n, np.inf),
                        nic_ingress_bytes_per_s=np.full(n, np.inf)),
        sync_s=np.full(S, sync))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("S, M", [(1, 1), (1, 5), (2, 3), (4, 8), (5, 16), (8, 3)])
def test_uniform_stages_match_closed_form(schedule, S, M):
    # (M + S - 1) * t, t = t_F + t_B (Huang et al. 2019; Narayanan et al. 2019).
    timeline = simulate(_job(schedule, S=S, M=M))
    assert timeline.iteration_s == pytest.approx((M + S - 1) * 3.0)


def test_breakdown_adds_up_to_iteration_time():
    timeline = simulate(_job("1f1b", R=2, S=3, M=6, latency=0.1, bandwidth=2.0, sync=1.5))
    assert sum(timeline.breakdown_s.values()) == pytest.approx(timeline.iteration_s)
    assert timeline.breakdown_s["gradient_sync_s"] == pytest.approx(1.5)


def test_latency_adds_once_per_boundary_and_direction_for_gpipe():
    plain = simulate(_job("gpipe", S=4, M=8)).iteration_s
    delayed = simulate(_job("gpipe", S=4, M=8, latency=0.5)).iteration_s
    assert delayed - plain == pytest.approx(2 * 3 * 0.5)


def test_busy_link_queues_messages():
    # Transfers slower than compute: the link is the bottleneck, M messages of 2 s each in a row.
    timeline = simulate(_job("gpipe", S=2, M=4, forward=0.1, backward=0.1, bandwidth=0.5))
    assert timeline.iteration_s >= 4 * 2.0


def test_uneven_micro_batches_and_sync_after_slowest_replica():
    timeline = simulate(_job("1f1b", R=2, S=2, micro_batches=[2, 6], sync=1.0))
    assert timeline.iteration_s == pytest.approx((6 + 2 - 1) * 3.0 + 1.0)


def test_op_lists_are_complete_and_ordered():
    for schedule in ("gpipe", "1f1b"):
        ops = stage_ops(schedule, 1, 4, 6)
        assert sum(op.kind == "fwd" for op in ops) == 6 and sum(op.kind == "bwd" for op in ops) == 6
        assert ops[-2:] == [Op("sync", -1), Op("step", -1)]
        for mb in range(6):
            assert ops.index(Op("fwd", mb)) < ops.index(Op("bwd", mb))
            assert ops.index(Op("recv_fwd", mb)) < ops.index(Op("fwd", mb)) < ops.index(Op("send_fwd", mb))
    ops = stage_ops("1f1b", 0, 4, 6)
    assert [op.kind for op in ops if op.kind in ("fwd", "bwd")][:5] == ["fwd"] * 4 + ["bwd"]
