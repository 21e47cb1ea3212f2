"""The search's estimate against the event simulator when pipelines share a host's NIC.

Two hosts; every pipeline has its first stage on host A and its second on host B, so every
activation and gradient crosses both hosts' shared NICs. For each NIC speed and schedule the
table gives the simulator's iteration time, the estimate (which charges each NIC's load per
period, the fill's queue and queued all-reduces) and the estimate with the NIC as a fixed cap on
each link and no queueing (how the estimate worked before the one network model). Prints a table
and writes ``benchmarks/results/nic_sharing.json``.
"""

import argparse
import json
import platform
from pathlib import Path

import numpy as np

from cost_models.network import Network
from planner.inputs.model import model_preset, parse_training
from planner.inputs.topology import parse_topology
from planner.plan.plan import Plan
from planner.prediction.predict import predict
from planner.search.evaluate import make_context, score_split

ROOT = Path(__file__).resolve().parent.parent

CASES = (  # (name, device type, pipelines, model, global batch, micro-batch size, layer split, NIC speeds)
    ("cpu-tiny", "CPU-core", 3, "tiny", 48, 4, (2, 2), ("10Mbps", "20Mbps", "50Mbps", "100Mbps", "1Gbps")),
    ("a100-gpt3-xl", "A100-80GB", 4, "gpt3-xl", 64, 1, (12, 12), ("10Gbps", "25Gbps", "50Gbps", "100Gbps", "400Gbps")),
)


def _topology(kind: str, pipelines: int, nic: str):
    document = {"devices": [{"name": "a", "count": pipelines, "type": kind, "host": "ha"},
                            {"name": "b", "count": pipelines, "type": kind, "host": "hb"}],
                "network": {"host": {"latency": "0.01ms", "bandwidth": "600Gbps"},
                            "region": {"latency": "0.5ms", "bandwidth": "400Gbps"}, "nic": nic}}
    return parse_topology(document, name=f"{kind}-{pipelines}x2-nic-{nic}")


def _row(name, kind, pipelines, preset, batch, micro, split, nic, schedule) -> dict:
    topology = _topology(kind, pipelines, nic)
    model = model_preset(preset)
    gpu = kind != "CPU-core"
    training = parse_training({"global_batch": batch, "micro_batch_size": micro, "precision": "bf16" if gpu else "fp32",
                               "optimizer": "adam", "schedule": schedule, "recompute": gpu})
    assignment = tuple((f"a-{r}", f"b-{r}") for r in range(pipelines))
    micro_batches = (batch // micro // pipelines,) * pipelines
    plan = Plan(layer_bounds=(0, split[0], sum(split)), assignment=assignment, micro_batches=micro_batches,
                micro_batch_size=micro, schedule=schedule)
    simulated = predict(plan, topology, model, training)[0].iteration_s
    assign = np.array([[topology.index(d) for d in row] for row in assignment])
    estimate = score_split(make_context(topology, model, training), assign, split, micro_batches, micro, schedule)
    if estimate is None:
        raise SystemExit(f"{name} {schedule}: the plan does not fit in memory; change the case")
    shared = Network.has_shared_nics
    Network.has_shared_nics = property(lambda self: False)  # the NIC as a fixed cap, no queueing
    try:
        capped = score_split(make_context(topology, model, training), assign, split, micro_batches, micro, schedule)
    finally:
        Network.has_shared_nics = shared
    return {"case": name, "nic": nic, "schedule": schedule, "simulated_s": simulated, "estimate_s": estimate,
            "estimate_error": estimate / simulated - 1, "fixed_cap_estimate_s": capped,
            "fixed_cap_error": capped / simulated - 1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "nic_sharing.json"))
    args = parser.parse_args()
    rows = [_row(name, kind, pipelines, preset, batch, micro, split, nic, schedule)
            for name, kind, pipelines, preset, batch, micro, split, nics in CASES
            for nic in nics for schedule in ("1f1b", "gpipe")]
    print(f"{'case':<14}{'NIC':>9}{'schedule':>9}{'simulated':>12}{'estimate':>12}{'error':>8}"
          f"{'fixed cap':>12}{'error':>8}")
    for r in rows:
        print(f"{r['case']:<14}{r['nic']:>9}{r['schedule']:>9}{r['simulated_s']:>12.4f}{r['estimate_s']:>12.4f}"
              f"{100 * r['estimate_error']:>7.1f}%{r['fixed_cap_estimate_s']:>12.4f}{100 * r['fixed_cap_error']:>7.1f}%")
    errors = np.abs([r["estimate_error"] for r in rows])
    capped = np.abs([r["fixed_cap_error"] for r in rows])
    summary = {"estimate_max_abs_error": float(errors.max()), "estimate_mean_abs_error": float(errors.mean()),
               "fixed_cap_max_abs_error": float(capped.max()), "fixed_cap_mean_abs_error": float(capped.mean())}
    print(f"estimate: mean |error| {100 * summary['estimate_mean_abs_error']:.1f}%, max "
          f"{100 * summary['estimate_max_abs_error']:.1f}%; fixed cap: mean {100 * summary['fixed_cap_mean_abs_error']:.1f}%, "
          f"max {100 * summary['fixed_cap_max_abs_error']:.1f}%")
    Path(args.out).write_text(json.dumps({"machine": platform.platform(), "rows": rows, "summary": summary}, indent=2)
                              + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
