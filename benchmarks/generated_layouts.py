"""Where the 1,024-device plan's time goes, and what other layouts and a path-aware bound term give:
the evidence behind the 1,024-device gap (``benchmarks/bounds.py --generated 1024``).

    python benchmarks/generated_layouts.py [--devices 1024] [--budget 5] [--seed 0]

On ``benchmarks/scale.py``'s generated topology (GPT-3 6.7B, two sequences a device, recomputation,
``precision: auto``), it prints and writes ``benchmarks/results/generated_layouts_<devices>.json``:
- the search's plan (``--budget``, ``--seed``) and its simulated breakdown, with the regions its
  first replica's stages sit in and their one-way latency, and the same search under
  ``warmup_depth: auto`` (1F1B with more micro-batches in flight);
- that plan re-split (``evaluate_placement``) without its V100 replicas, and without its V100 and
  RTX 4090 ones;
- a region-local layout: a stage per device type (H100, A100-80GB, A100-40GB, RTX 4090, V100), a
  replica's five hosts in one region, three per region and type;
- pipelines inside hosts: a replica per host, its 8 GPUs its 8 stages (no pipeline message
  leaves a host; every stage group spans the regions), and the region-local layout, each synced by
  every algorithm (ring, hierarchical, parameter server, sharded);
- for g = 2 .. regions, the least over paths through g regions of ``2 (sum of latencies) + 2 m
  (slowest hop's message)`` at m = the batch over the plan's replicas: what a bound term pricing a
  replica's path through the regions could add (one sequence's activation a message);
- ``c`` stage groups in each region (c = 1 .. 4, the regions in the plan's order, each region's hosts
  dealt to its groups by speed, as many replicas as the smallest region holds): more stages, each
  replica through the same regions;
- the degree pairs of least bound (the deferred terms included) and the plan's, with each case of
  ``cluster_bound`` at the regions' clustering: which case holds a pair's bound down.
About a minute on a 2-core machine, most of it the search.
"""

import argparse
import collections
import itertools
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from scale import generated_topology  # noqa: E402

from planner.inputs.model import model_preset, parse_training  # noqa: E402
from planner.inputs.topology import parse_topology  # noqa: E402
from planner.prediction.predict import predict  # noqa: E402
from planner.search import bounds  # noqa: E402
from planner.search.cluster_bound import cluster_levels  # noqa: E402
from planner.search.evaluate import evaluate_placement, make_context  # noqa: E402
from planner.search.front import SearchOptions, search  # noqa: E402
from planner.search.plans import candidate_to_plan  # noqa: E402

STAGE_TYPES = ("H100-SXM", "A100-80GB", "A100-40GB", "RTX-4090", "V100-32GB")


def _simulated(ctx, assign, training, topology, model, schedule: str) -> dict:
    """The estimate and the simulation of ``assign`` (R x S device indices) re-split by the search's estimate."""
    candidate = evaluate_placement(ctx, assign, training.micro_batch_size, schedule)
    if candidate is None:
        return {"fits": False}
    prediction = predict(candidate_to_plan(ctx, candidate), topology, model, training)[0]
    return {"replicas": int(assign.shape[0]), "stages": int(assign.shape[1]), "estimate_s": candidate.score_s,
            "simulated_s": prediction.iteration_s, "fits": prediction.fits,
            "breakdown_s": {k: float(v) for k, v in prediction.breakdown_s.items()}}


def _region_local(topology) -> np.ndarray:
    """R x 5: per region, three groups of one host of each ``STAGE_TYPES``, a replica per GPU index."""
    hosts = collections.defaultdict(list)  # (region, type) -> hosts, in order
    for d in topology.devices:
        if d.host not in hosts[(d.region, d.type_name)]:
            hosts[(d.region, d.type_name)].append(d.host)
    members = collections.defaultdict(list)
    for i, d in enumerate(topology.devices):
        members[d.host].append(i)
    rows = []
    for region in topology.regions:
        for j in range(min(len(hosts[(region, t)]) for t in STAGE_TYPES)):
            chosen = [hosts[(region, t)][j] for t in STAGE_TYPES]
            rows += [[members[h][k] for h in chosen] for k in range(min(len(members[h]) for h in chosen))]
    return np.array(rows)


def _in_host(topology) -> np.ndarray:
    """R x 8: a replica per 8-GPU host, its GPUs in order its stages."""
    members = collections.defaultdict(list)
    for i, d in enumerate(topology.devices):
        members[d.host].append(i)
    return np.array([m for m in members.values() if len(m) == 8])


def _path_terms(topology, message_bytes: float, sequences: float) -> dict:
    """{g: least over paths through g distinct regions of 2 (latencies) + 2 m (slowest hop's message)}."""
    regions = topology.regions
    first = {r: topology.region_ids.tolist().index(i) for i, r in enumerate(regions)}  # a device of each region
    latency, bandwidth = topology.latency_s, topology.bandwidth_bytes_per_s
    lat = {(a, b): float(latency[first[a], first[b]]) for a in regions for b in regions if a != b}
    msg = {(a, b): message_bytes / float(bandwidth[first[a], first[b]]) for a in regions for b in regions if a != b}
    out = {}
    for g in range(2, len(regions) + 1):
        out[g] = min(2 * sum(lat[h] for h in zip(p, p[1:])) + 2 * sequences * max(msg[h] for h in zip(p, p[1:]))
                     for subset in itertools.combinations(regions, g) for p in itertools.permutations(subset))
    return out


def _regions_stacked(topology, speed: np.ndarray, order: list, per_region: int) -> np.ndarray:
    """R x (c g): ``per_region`` (c) stage groups in each region of ``order``, the region's hosts by
    ``speed`` (the search's) dealt to them in turn, a host's GPUs side by side; R: what the smallest
    region holds."""
    groups = []
    for region in order:
        hosts = collections.defaultdict(list)
        for i, d in enumerate(topology.devices):
            if d.region == region:
                hosts[d.host].append(i)
        ranked = sorted(hosts.values(), key=lambda members: (-speed[members[0]], members[0]))
        groups += [sum(ranked[q::per_region], []) for q in range(per_region)]
    replicas = min(len(g) for g in groups)
    return np.array([g[:replicas] for g in groups]).T


def _least_pairs(topology, model, training, plan_pair: tuple, count: int = 6) -> list:
    """The ``count`` degree pairs of least bound (``bounds._pair_bounds_s`` with its deferred terms)
    and ``plan_pair``, each with ``cluster_bound``'s cases at the clustering with a cluster per region."""
    deferred, cases = {}, {}
    table = bounds._pair_bounds_s(topology, model, training, deferred=deferred, cases=cases)
    for stages, terms in deferred.items():
        for term in terms:
            table[stages] = np.maximum(table[stages], term(floor=np.zeros_like(table[stages]))
                                       if term.func in bounds._FLOORED else term())
    level = [k for k, lv in enumerate(cluster_levels(topology, training))
             if lv.cluster_sizes.size == len(topology.regions)]
    pairs = sorted((float(v), s, d + 1) for s, row in table.items() for d, v in enumerate(row))[:count]
    if plan_pair not in [(s, d) for _, s, d in pairs]:
        pairs.append((float(table[plan_pair[0]][plan_pair[1] - 1]), *plan_pair))
    rows = []
    for bound, stages, replicas in pairs:
        parts = cases.get((stages, level[0]), {}) if level else {}
        rows.append({"stages": stages, "replicas": replicas, "bound_s": bound,
                     "regions_cases_s": {k: (bool(v[replicas - 1]) if v.dtype == bool else float(v[replicas - 1]))
                                         for k, v in parts.items()}})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description="The generated topology's plan, other layouts and a path term.")
    parser.add_argument("--devices", type=int, default=1024)
    parser.add_argument("--budget", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args()
    topology = parse_topology(generated_topology(args.devices), name=f"generated-{args.devices}")
    model = model_preset("gpt3-6.7b")
    training = parse_training({"global_batch": 2 * args.devices, "micro_batch_size": 1, "precision": "auto",
                               "recompute": True, "flash_attention": True})
    result = search(topology, model, training, SearchOptions(seed=args.seed, time_limit_s=600, budget_s=args.budget))
    plan, training = result.plan, result.training
    ctx = make_context(topology, model, training)
    assign = np.array([[topology.index(n) for n in row] for row in plan.assignment])
    path = [topology.devices[i].region for i in assign[0]]
    latency = topology.latency_s
    report = {"command": " ".join(["python", "benchmarks/generated_layouts.py"] + sys.argv[1:]),
              "plan": {"stages": plan.stages, "replicas": plan.replicas, "schedule": str(plan.schedule),
                       "simulated_s": plan.prediction.iteration_s,
                       "breakdown_s": {k: float(v) for k, v in plan.prediction.breakdown_s.items()},
                       "lower_bound_s": result.lower_bound_s, "first_replica_regions": path,
                       "first_replica_latency_s": float(sum(latency[a, b] for a, b in zip(assign[0], assign[0][1:])))}}
    deep = search(topology, model, replace(training, warmup_depth="auto"),
                  SearchOptions(seed=args.seed, time_limit_s=600, budget_s=args.budget))
    report["plan_warmup_depth_auto"] = {
        "stages": deep.plan.stages, "replicas": deep.plan.replicas, "schedule": str(deep.plan.schedule),
        "warmup_depth": deep.plan.warmup_depth, "simulated_s": deep.plan.prediction.iteration_s,
        "breakdown_s": {k: float(v) for k, v in deep.plan.prediction.breakdown_s.items()},
        "lower_bound_s": deep.lower_bound_s}
    types = np.array([topology.devices[i].type_name for i in assign[:, 0]])
    for label, dropped in (("without V100 replicas", ("V100-32GB",)),
                           ("without V100 and RTX 4090 replicas", ("V100-32GB", "RTX-4090"))):
        report[label] = _simulated(ctx, assign[~np.isin(types, dropped)], training, topology, model, plan.schedule)
    report["region-local, a stage per type"] = _simulated(ctx, _region_local(topology), training, topology, model,
                                                          plan.schedule)
    local = (("in host", _in_host(topology)), ("region-local", _region_local(topology)))
    for sync in ("ring", "hierarchical", "parameter-server", "sharded"):
        synced = replace(training, sync=sync, shard_optimizer="auto")  # sharded where the algorithm allows
        synced_ctx = make_context(topology, model, synced)  # one a sync, for both layouts
        for name, layout in local:
            report[f"{name}, {sync}"] = _simulated(synced_ctx, layout, synced, topology, model, plan.schedule)
    message = model.sequence * model.hidden * training.activation_bytes
    sequences = training.global_batch / plan.replicas
    report["path_term_s"] = {"sequences_per_replica": sequences,
                             "by_regions": _path_terms(topology, message, math.ceil(sequences))}
    for per_region in (1, 2, 3, 4):
        stacked = _regions_stacked(topology, ctx.speed, list(dict.fromkeys(path)), per_region)
        report[f"{per_region} stage groups a region"] = _simulated(ctx, stacked, training, topology, model,
                                                                   plan.schedule)
    report["least pairs"] = _least_pairs(topology, model, training, (plan.stages, plan.replicas))
    print(f"plan {plan.stages} x {plan.replicas} {plan.schedule}: {plan.prediction.iteration_s:.3f} s "
          f"(bubble {plan.prediction.breakdown_s['bubble_s']:.3f} s), bound {result.lower_bound_s:.3f} s; "
          f"first replica through {path}, {report['plan']['first_replica_latency_s'] * 1e3:.1f} ms one way")
    row = report["plan_warmup_depth_auto"]
    print(f"warmup_depth auto: {row['stages']} x {row['replicas']} {row['schedule']} (depth {row['warmup_depth']}): "
          f"{row['simulated_s']:.3f} s, bound {row['lower_bound_s']:.3f} s")
    for label in ("without V100 replicas", "without V100 and RTX 4090 replicas", "region-local, a stage per type"):
        row = report[label]
        print(f"{label:36} " + (f"{row['stages']} x {row['replicas']}: {row['simulated_s']:.3f} s, sync "
                                f"{row['breakdown_s']['gradient_sync_s']:.3f} s, bubble {row['breakdown_s']['bubble_s']:.3f} s"
                                if row.get("fits") else "does not fit"))
    for name in ("in host", "region-local"):
        print(f"{name:12} by sync: " + ", ".join(
            f"{sync} {row['simulated_s']:.3f} s (sync {row['breakdown_s']['gradient_sync_s']:.3f}, bubble "
            f"{row['breakdown_s']['bubble_s']:.3f})" if row.get("fits") else f"{sync} does not fit"
            for sync in ("ring", "hierarchical", "parameter-server", "sharded")
            for row in [report[f"{name}, {sync}"]]))
    print("path term by regions crossed: " + ", ".join(f"{g}: {s:.3f} s" for g, s in
                                                          report["path_term_s"]["by_regions"].items()))
    for per_region in (1, 2, 3, 4):
        row = report[f"{per_region} stage groups a region"]
        print(f"{per_region} stage groups a region      " + (
            f"{row['stages']} x {row['replicas']}: {row['simulated_s']:.3f} s, sync "
            f"{row['breakdown_s']['gradient_sync_s']:.3f} s, bubble {row['breakdown_s']['bubble_s']:.3f} s"
            if row.get("fits") else "does not fit"))
    print("pairs of least bound; cluster_bound's cases at the regions' clustering (s):")
    for row in report["least pairs"]:
        cases = row["regions_cases_s"]
        print(f"  {row['stages']:3d} x {row['replicas']:<4d} bound {row['bound_s']:.3f}: " + ", ".join(
            f"{k} {v:.3f}" for k, v in cases.items() if not isinstance(v, bool)) + "".join(
            f", {k}" for k, v in cases.items() if v is True))
    path_out = Path(args.out) / f"generated_layouts_{args.devices}.json"
    path_out.write_text(json.dumps(report, indent=1, default=float) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
