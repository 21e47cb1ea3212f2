"""Accuracy of the cost model: plans executed by the runtime, predicted against measured.

    python benchmarks/accuracy.py emulated   # CPU: >= 12 plans over 3 topologies, network and devices emulated
    python benchmarks/accuracy.py emulated --only tensor zb-h1   # just those dimensions (or labels); others kept
    python benchmarks/accuracy.py gpu1       # 1 CUDA GPU: recomputation modes and fp16 (GPU1_CASES)
    python benchmarks/accuracy.py gpu        # 2 CUDA GPUs: calibrate, then every plan dimension and schedule (GPU_CASES)
    python benchmarks/accuracy.py gpu4       # 4 CUDA GPUs: the same on 4 (GPU4_CASES)

Each mode prints a table, writes ``accuracy_<mode>.json`` and keeps every run's ``results.json``
under ``benchmarks/results/accuracy_<mode>/`` (small JSON, so ``plan plot`` redraws the figures
without a GPU). Plans mix the planner's pick, the same with the other schedule, even layers and
batch on contiguous (Megatron's default) and random placements, and DTFM's objective; GPipe and
1F1B; even and uneven splits.
"""

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.report.accuracy import mean_absolute_percentage_error, memory_rows, rank_correlation, run_row  # noqa: E402
from planner.prediction.predict import predict  # noqa: E402
from planner.inputs.job import load_job  # noqa: E402
from planner.plan.document import plan_to_document
from planner.plan.document import write_plan  # noqa: E402
from planner.plan.plan import interleave_plan  # noqa: E402

EMULATED_TOPOLOGIES = ("topologies/emulated/dtfm-case5-mini.yaml", "topologies/emulated/two-datacenters-mini.yaml",
                       "topologies/emulated/home-mini.yaml")
EMULATED_SECONDS = 3.0  # the planner's pick of each topology is emulated at about this many seconds per iteration


def _even_plans(job, seed: int) -> dict:
    """Even layers and batch on all devices: contiguous, random and DTFM-objective placements."""
    from planner.search.dtfm_plan import dtfm_degrees, dtfm_style_plan
    from planner.search.dtfm_search import contiguous_allocation, random_allocation

    topology, model, training = job.topology, job.model, job.training
    total = training.global_batch // training.micro_batch_size
    pairs = [(s, r) for s, r in dtfm_degrees(topology.size, model.layers) if total % r == 0 and 2 <= s <= 4]
    stages, replicas = pairs[0]
    n = topology.size
    rng = np.random.default_rng(seed)
    return {
        f"even-contiguous-{stages}x{replicas}-gpipe": dtfm_style_plan(
            topology, model, training, stages, replicas, contiguous_allocation(n, stages, replicas), schedule="gpipe"),
        f"even-random-{stages}x{replicas}-1f1b": dtfm_style_plan(
            topology, model, training, stages, replicas, random_allocation(n, stages, replicas, rng), schedule="1f1b"),
        f"even-dtfm-objective-{stages}x{replicas}-1f1b": dtfm_style_plan(
            topology, model, training, stages, replicas, seed=seed, schedule="1f1b"),
    }


def _write(plan, job, topology_path: str, path: Path, calibration=None) -> Path:
    if calibration is not None:
        from planner.inputs.calibration import calibration_record

        plan = replace(plan, calibration=calibration_record(calibration))
    plan = plan.with_prediction(predict(plan, job.topology, job.model, job.training)[0])
    path.parent.mkdir(parents=True, exist_ok=True)
    write_plan(plan_to_document(plan, model=job.model, training=job.training, topology_source=topology_path), path)
    return path


# The plan space's dimensions run on each topology where they are legal (``_dimension_plans``).
DIMENSIONS = ("tensor", "zero1-uneven", "rounds", "sync-hierarchical", "sync-parameter-server", "sync-sharded",
              "zb-h1", "interleaved", "int8-messages", "powersgd", "local-steps", "warmup-depth", "recompute-per-worker",
              "recompute-selective")


def _hosts_of_two(topology) -> bool:
    """Whether some host holds two devices of one type (a tensor group of degree 2)."""
    types = {}
    for d in topology.devices:
        types.setdefault((d.host, d.type_name), []).append(d)
    return any(len(v) >= 2 for v in types.values())


def _dimension_plans(pick, job, seed: int) -> dict:
    """label: (plan, job, dimension) of the new dimensions on ``pick`` (or on a search pinned to the
    dimension where the pick's shape cannot carry it): replicas carry the sync algorithms, PowerSGD,
    local steps and ZeRO-1 on uneven batch shares; stages carry accumulation rounds, ZB-H1,
    interleaved 1F1B, int8 messages and recomputation per worker; every pick selective recomputation;
    hosts of two devices carry tensor groups, and hosts of several devices a hierarchical sync over
    every device."""
    from cost_models.network import Sync
    from planner.errors import InputError
    from planner.plan.dims import Compression
    from planner.search.front import SearchOptions, search

    def trained(**fields):
        return replace(job, training=replace(job.training, **fields))

    topology, plans = job.topology, {}
    S, R = pick.stages, pick.replicas
    if R > 1:
        counts = list(pick.micro_batches)
        shift = max(1, min(counts) // 4)
        counts[0], counts[-1] = counts[0] + shift, counts[-1] - shift
        plans[f"zero1-uneven-{'-'.join(map(str, counts))}"] = (
            replace(pick, micro_batches=tuple(counts)), trained(shard_optimizer=True), "zero1-uneven")
        plans["local-steps-4"] = (replace(pick, sync_every=4), trained(sync_every=4, shard_optimizer=False),
                                  "local-steps")
    if R > 1 and S > 1:  # the geo-distributed pick: its replicas sync over slow links
        plans["sync-parameter-server"] = (replace(pick, sync=Sync.PARAMETER_SERVER, sync_servers=(0,) * S),
                                          trained(sync="parameter-server", shard_optimizer=False),
                                          "sync-parameter-server")
        plans["sync-sharded"] = (replace(pick, sync=Sync.SHARDED), trained(sync="sharded"), "sync-sharded")
        plans["powersgd-rank-4"] = (replace(pick, compression=Compression(gradients="powersgd", rank=4)),
                                    trained(compress_gradients="powersgd", powersgd_rank=4, shard_optimizer=False),
                                    "powersgd")
    if S > 1:
        per_replica = min(pick.micro_batches)
        plans["gpipe-rounds-4"] = (replace(pick, schedule="gpipe", micro_batches_per_round=4),
                                   trained(schedule="gpipe", micro_batches_per_round=4), "rounds") \
            if per_replica > 4 else None
        plans["zb-h1"] = (replace(pick, schedule="zb-h1"), trained(schedule="zb-h1"), "zb-h1")
        layers = job.model.layers
        # Interleaving runs micro-batches in groups of S and splits each stage in 2 chunks: where a stage
        # of the pick has one layer, the pick's placement with even layers.
        if all(m % S == 0 for m in pick.micro_batches) and layers % S == 0:
            uneven = min(b - a for a, b in zip(pick.layer_bounds, pick.layer_bounds[1:])) < 2
            base = replace(pick, schedule="1f1b", layer_bounds=tuple(range(0, layers + 1, layers // S))) if uneven \
                else replace(pick, schedule="1f1b")
            plans["interleaved-v2" + ("-even-layers" if uneven else "")] = (
                interleave_plan(base, 2), trained(schedule="1f1b", virtual_stages=2), "interleaved")
        plans["int8-messages"] = (replace(pick, compression=Compression(messages="int8")),
                                  trained(compress_messages="int8"), "int8-messages")
        # Recomputation per worker: full on the first stage (the most micro-batches in flight), none after it
        table = tuple(("full",) + ("none",) * (S - 1) for _ in range(R))
        plans["recompute-per-worker"] = (replace(pick, recompute=table, prediction=None), trained(recompute=True),
                                         "recompute-per-worker")
        # 1F1B and ZB-H1 at the warm-up depth of 2-4 that the simulator gives the shortest iteration
        # that fits
        for schedule in ("1f1b", "zb-h1"):
            deep = {}
            for k in (2, 3, 4):
                run = trained(schedule=schedule, warmup_depth=k)
                plan = replace(pick, schedule=schedule, warmup_depth=k, prediction=None)
                prediction = predict(plan, topology, job.model, run.training)[0]
                if prediction.fits:
                    deep[k] = (prediction.iteration_s, plan, run)
            if deep:  # and the same plan at depth 1, measured beside it
                k = min(deep, key=lambda depth: deep[depth][0])
                plans[f"{schedule}-warmup-depth-{k}"] = (deep[k][1], deep[k][2], "warmup-depth")
                plans[f"{schedule}-warmup-depth-1"] = (replace(pick, schedule=schedule, warmup_depth=1, prediction=None),
                                                       trained(schedule=schedule, warmup_depth=1), "warmup-depth")
    # selective recomputation on every worker
    plans["recompute-selective"] = (replace(pick, recompute=(), prediction=None), trained(recompute="selective"),
                                    "recompute-selective")
    if _hosts_of_two(topology):
        for stages in (1, 2):
            pinned = trained(shard_optimizer="auto")
            plan = search(topology, job.model, pinned.training,
                          SearchOptions(seed=seed, time_limit_s=120, budget_s=10, stages=stages,
                                        tensor_degrees=(2,))).plan
            plans[f"tensor-2-{plan.stages}x{plan.replicas}"] = (plan, pinned, "tensor")
        # One stage on as many devices as fit: its replicas span hosts of several devices each.
        pinned = trained(sync="hierarchical", shard_optimizer=False)
        for replicas in range(topology.size, 1, -1):
            try:
                plan = search(topology, job.model, pinned.training,
                              SearchOptions(seed=seed, time_limit_s=120, budget_s=10, stages=1, replicas=replicas,
                                            tensor_degrees=(1,))).plan
            except InputError:  # no plan of this many replicas fits in memory
                continue
            members = [topology.devices[topology.index(d)].host for d in plan.ring(0)]
            if len(set(members)) > 1 and len(set(members)) < len(members):
                plans[f"sync-hierarchical-1x{plan.replicas}"] = (plan, pinned, "sync-hierarchical")
                break
    return {label: entry for label, entry in plans.items() if entry is not None}


def _wanted(label: str, dimension: str, only: tuple) -> bool:
    """Whether ``only`` (run labels, labels without their topology, or dimension names; empty: all) names the run."""
    return not only or label in only or label.split("--", 1)[1] in only or dimension in only


def emulated(out: Path, iterations: int, warmup: int, seed: int, only: tuple = (),
             seconds: float = EMULATED_SECONDS) -> dict:
    """Run the emulated plans; with ``only``, just those (see ``_wanted``), keeping every other row of an
    earlier run (``out/partial.json``, started from ``accuracy_emulated.json`` when there is none).
    ``seconds``: the pick's emulated iteration (longer leaves a loaded host more room per op)."""
    from planner.runtime.launch import LaunchOptions, launch
    from planner.search.front import SearchOptions, search

    partial, earlier = out / "partial.json", out.parent / "accuracy_emulated.json"
    kept = json.loads(partial.read_text())["rows"] if partial.exists() else \
        json.loads(earlier.read_text())["rows"] if only and earlier.exists() else []
    rows, picks = [], {}
    for topology_path in EMULATED_TOPOLOGIES:
        job = load_job(ROOT / topology_path)
        name = job.topology.name
        # a work budget, not a time limit: the same picks under any load (``--only`` keeps earlier rows)
        result = search(job.topology, job.model, job.training, SearchOptions(seed=seed, time_limit_s=300, budget_s=20))
        # The training the pick runs (precision and recompute resolved); sharding stays per plan.
        pick, job = result.plan, replace(job, training=replace(result.training, shard_optimizer="auto"))
        other = "gpipe" if pick.schedule == "1f1b" else "1f1b"
        plans = {f"planner-{pick.stages}x{pick.replicas}-{pick.schedule}": pick,
                 f"planner-{pick.stages}x{pick.replicas}-{other}": replace(pick, schedule=other)}
        layers, total = job.model.layers, sum(pick.micro_batches)
        if layers % pick.stages == 0 and total % pick.replicas == 0:
            even = replace(pick, layer_bounds=tuple(range(0, layers + 1, layers // pick.stages)),
                           micro_batches=(total // pick.replicas,) * pick.replicas)
            if (tuple(map(int, even.layer_bounds)), tuple(map(int, even.micro_batches))) != \
                    (tuple(map(int, pick.layer_bounds)), tuple(map(int, pick.micro_batches))):
                plans[f"planner-placement-even-split-{pick.schedule}"] = even
        plans.update(_even_plans(job, seed))
        plans = {label: (plan, job) for label, plan in plans.items()}
        # The plan space's dimensions on the pick: recomputation flipped, the optimizer state not sharded.
        flipped = not job.training.recompute
        plans[f"planner-recompute-{'on' if flipped else 'off'}"] = (
            pick, replace(job, training=replace(job.training, recompute=flipped)))
        if pick.replicas > 1:
            plans["planner-unsharded"] = (pick, replace(job, training=replace(job.training, shard_optimizer=False)))
        plans = {label: (plan, run_job, "") for label, (plan, run_job) in plans.items()}
        plans.update(_dimension_plans(pick, job, seed))
        scale = seconds / predict(pick, job.topology, job.model, job.training)[0].iteration_s
        first = next(iter(plans))
        for label, (plan, run_job, dimension) in plans.items():
            if not _wanted(f"{name}--{label}", dimension, only):
                rows.extend(r for r in kept if r["label"] == f"{name}--{label}")
                continue
            path = _write(plan, run_job, topology_path, out / "plans" / f"{name}--{label}.yaml")
            run_dir = out / f"{name}--{label}"
            results = launch(path, LaunchOptions(iterations=iterations, warmup=warmup, out_dir=str(run_dir),
                                                 emulate=True, time_scale=scale, backend="gloo"), log=lambda s: None)
            row = run_row(results, f"{name}--{label}")
            row["planner_pick"] = label == first
            row["fits"] = predict(plan, run_job.topology, run_job.model, run_job.training)[0].fits
            row["dimension"] = dimension
            overrun = results.get("emulation", {}).get("compute_overrun", {})
            row["compute_overrun_share"] = overrun.get("worst_share_of_iteration")
            rows.append(row)
            done = {r["label"] for r in rows}
            partial.write_text(json.dumps({"rows": rows + [r for r in kept if r["label"] not in done]},
                                          indent=1, default=float) + "\n")
            print(f"{row['label']:58} predicted {row['predicted_s']:8.3f} s  measured {row['measured_s']:8.3f} s  "
                  f"{100 * row['error']:+6.1f}%" + (f"  (compute overrun {100 * row['compute_overrun_share']:.1f}%)"
                                                   if overrun.get("warning") else ""), flush=True)
        ours = [r for r in rows if r["topology"] == name]
        if not any(r["planner_pick"] for r in ours):
            continue
        # Against the plans of the topology's own training: the dimensions' rows change what is trained
        # (int8, PowerSGD, local steps) or the job's settings, which the search did not plan with.
        fastest = min(r["measured_s"] for r in ours if r.get("fits", True) and not r.get("dimension"))
        pick_row = next(r for r in ours if r["planner_pick"])
        picks[name] = {"pick": pick_row["label"], "pick_measured_s": pick_row["measured_s"],
                       "fastest_measured_s": fastest, "pick_over_fastest": pick_row["measured_s"] / fastest - 1}
    return {"rows": rows, "picks": picks}


class Case(NamedTuple):
    """A GPU accuracy run: the search pinned to ``stages`` x ``replicas`` (tensor degrees ``tensor``)
    under ``schedule`` and the training ``overrides`` (micro-batch 2 unless they say otherwise); the
    searched plan's layer bounds or micro-batches replaced where given; ``eager`` runs (ZB-H1 split at
    its linear layers, uncompiled) are predicted with a calibration of eager blocks."""

    stages: int
    replicas: int
    schedule: str
    tensor: tuple = (1,)
    overrides: dict = {}
    eager: bool = False
    layer_bounds: tuple = None
    micro_batches: tuple = None


GPU_TOPOLOGY = "topologies/local/h100-x2.yaml"
GPU_CASES = {
    "2x1-mb2-1f1b": Case(2, 1, "1f1b"),
    "2x1-mb1-gpipe": Case(2, 1, "gpipe", overrides={"micro_batch_size": 1}),
    "2x1-mb2-gpipe": Case(2, 1, "gpipe"),
    "2x1-mb2-zb-h1": Case(2, 1, "zb-h1", eager=True),
    "2x1-mb2-zb-h1-compiled": Case(2, 1, "zb-h1"),
    "2x1-mb2-zb-h1-depth-2": Case(2, 1, "zb-h1", overrides={"warmup_depth": 2}),
    "2x1-mb2-1f1b-interleaved-v2": Case(2, 1, "1f1b", overrides={"virtual_stages": 2}),
    "2x1-mb2-1f1b-interleaved-v4": Case(2, 1, "1f1b", overrides={"virtual_stages": 4}),
    "2x1-mb2-1f1b-warmup-depth-3": Case(2, 1, "1f1b", overrides={"warmup_depth": 3}),
    "1x2-mb2-1f1b": Case(1, 2, "1f1b"),  # the topology's training: optimizer state sharded
    "2x1-mb4-1f1b": Case(2, 1, "1f1b", overrides={"micro_batch_size": 4}),
    "1x1-mb2-1f1b": Case(1, 1, "1f1b"),
    "2x1-mb2-1f1b-even-12-12": Case(2, 1, "1f1b", layer_bounds=(0, 12, 24)),
    "1x2-mb2-1f1b-uneven-batch-6-2": Case(1, 2, "1f1b", micro_batches=(6, 2)),
    "1x2-mb2-1f1b-unsharded": Case(1, 2, "1f1b", overrides={"shard_optimizer": False}),
    "1x2-mb2-1f1b-fp16": Case(1, 2, "1f1b", overrides={"precision": "fp16"}),
    "2x1-mb2-1f1b-fp16": Case(2, 1, "1f1b", overrides={"precision": "fp16"}),
    "2x1-mb2-1f1b-recompute": Case(2, 1, "1f1b", overrides={"recompute": True}),
    "1x2-mb2-1f1b-recompute": Case(1, 2, "1f1b", overrides={"recompute": True}),
    # One stage on a tensor group of both GPUs (compiled; under --compile auto its blocks replay as
    # CUDA graphs): at micro-batch 2 the host's launches set the pace, at 4 the products.
    "1x1-mb2-tensor-2": Case(1, 1, "1f1b", tensor=(2,)),
    "1x1-mb4-tensor-2": Case(1, 1, "1f1b", tensor=(2,), overrides={"micro_batch_size": 4}),
    # The group under ZB-H1, which graphs no group: priced by the calibration's ungraphed timing. A
    # first stage: its backwards run whole (ZB-H1 splits those of later stages only).
    "1x1-mb2-tensor-2-zb-h1": Case(1, 1, "zb-h1", tensor=(2,)),
}
# The 2-stage runs as ``plan launch`` runs each schedule by default (compiled; ZB-H1 with its products split).
GPU_SCHEDULE_ROWS = ("2x1-mb2-1f1b", "2x1-mb2-gpipe", "2x1-mb2-zb-h1-compiled", "2x1-mb2-1f1b-interleaved-v2",
                     "2x1-mb2-1f1b-interleaved-v4", "2x1-mb2-zb-h1-depth-2")

GPU1_TOPOLOGY = "topologies/local/h100-x1.yaml"
# One GPU: each recomputation mode at two micro-batch sizes, and fp16 with dynamic loss scaling.
GPU1_CASES = {
    "1x1-mb2-1f1b": Case(1, 1, "1f1b"),
    "1x1-mb2-1f1b-selective": Case(1, 1, "1f1b", overrides={"recompute": "selective"}),
    "1x1-mb2-1f1b-recompute": Case(1, 1, "1f1b", overrides={"recompute": True}),
    "1x1-mb4-1f1b": Case(1, 1, "1f1b", overrides={"micro_batch_size": 4}),
    "1x1-mb4-1f1b-selective": Case(1, 1, "1f1b", overrides={"micro_batch_size": 4, "recompute": "selective"}),
    "1x1-mb4-1f1b-recompute": Case(1, 1, "1f1b", overrides={"micro_batch_size": 4, "recompute": True}),
    "1x1-mb2-1f1b-fp16": Case(1, 1, "1f1b", overrides={"precision": "fp16"}),
    "1x1-mb2-1f1b-fp16-recompute": Case(1, 1, "1f1b", overrides={"precision": "fp16", "recompute": True}),
}
GPU1_SCHEDULE_ROWS = ("1x1-mb2-1f1b",)
GPU4_TOPOLOGY = "topologies/local/h100-x4.yaml"
GPU4_CASES = {
    "4x1-mb2-1f1b": Case(4, 1, "1f1b"),
    "4x1-mb2-gpipe": Case(4, 1, "gpipe"),
    "4x1-mb2-zb-h1": Case(4, 1, "zb-h1", eager=True),
    "4x1-mb2-zb-h1-compiled": Case(4, 1, "zb-h1"),
    "4x1-mb2-zb-h1-depth-2": Case(4, 1, "zb-h1", overrides={"warmup_depth": 2}),
    "2x2-mb2-1f1b": Case(2, 2, "1f1b"),
    "1x4-mb2-1f1b-sharded": Case(1, 4, "1f1b", overrides={"shard_optimizer": True}),
    "1x4-mb2-1f1b-unsharded": Case(1, 4, "1f1b", overrides={"shard_optimizer": False}),
    "4x1-mb2-1f1b-fp16": Case(4, 1, "1f1b", overrides={"precision": "fp16"}),
    "4x1-mb2-1f1b-recompute": Case(4, 1, "1f1b", overrides={"recompute": True}),
    "1x1-mb2-tensor-4": Case(1, 1, "1f1b", tensor=(4,), eager=True),
    "2x1-mb2-tensor-2": Case(2, 1, "1f1b", tensor=(2,), eager=True),
    # A member of a group of t runs 1/t of each matrix product: at micro-batch 2 the launches, not
    # the GPUs, set the pace; at t times the micro-batch each member's products are the plain ones'.
    "1x1-mb8-tensor-4": Case(1, 1, "1f1b", tensor=(4,), overrides={"micro_batch_size": 8}),
    "2x1-mb4-tensor-2": Case(2, 1, "1f1b", tensor=(2,), overrides={"micro_batch_size": 4}),
    "1x1-mb4-tensor-4": Case(1, 1, "1f1b", tensor=(4,), overrides={"micro_batch_size": 4}),
    "1x1-mb2-tensor-4-compiled": Case(1, 1, "1f1b", tensor=(4,)),
    "2x1-mb2-tensor-2-compiled": Case(2, 1, "1f1b", tensor=(2,)),
    "1x2-mb4-tensor-2": Case(1, 2, "1f1b", tensor=(2,), overrides={"micro_batch_size": 4}),
    "4x1-mb2-1f1b-interleaved-v2": Case(4, 1, "1f1b", overrides={"virtual_stages": 2}),
    "4x1-mb2-1f1b-interleaved-v4": Case(4, 1, "1f1b", overrides={"virtual_stages": 4}),
    "4x1-mb2-1f1b-warmup-depth-2": Case(4, 1, "1f1b", overrides={"warmup_depth": 2}),
}

# The 4-stage runs as ``plan launch`` runs each schedule by default (compiled; ZB-H1 with its products split).
GPU4_SCHEDULE_ROWS = ("4x1-mb2-1f1b", "4x1-mb2-gpipe", "4x1-mb2-zb-h1-compiled", "4x1-mb2-1f1b-interleaved-v2",
                      "4x1-mb2-1f1b-interleaved-v4", "4x1-mb2-zb-h1-depth-2")


def _calibrated(topology_path: str, path: Path, compile: str, resume: bool = False):
    """The calibration measured into ``path`` (``resume``: the one a previous run left there, where
    there is one) and the topology's job with it applied."""
    from planner.inputs.calibration import apply_calibration, read_calibration
    from planner.runtime.calibrate import CalibrateOptions, calibrate

    if not (resume and path.exists()):
        calibrate(ROOT / topology_path, CalibrateOptions(out=str(path), compile=compile), log=print)
    calibration = read_calibration(path)
    base = load_job(ROOT / topology_path)
    return calibration, replace(base, topology=apply_calibration(base.topology, calibration))


def gpu(out: Path, iterations: int, warmup: int, seed: int, only: tuple = (), resume: bool = False) -> dict:
    """2 GPUs: ``GPU_CASES`` (``gpu_cases``)."""
    return gpu_cases(out, GPU_TOPOLOGY, GPU_CASES, GPU_SCHEDULE_ROWS, iterations, warmup, seed, only, resume)


def gpu1(out: Path, iterations: int, warmup: int, seed: int, only: tuple = (), resume: bool = False) -> dict:
    """1 GPU: ``GPU1_CASES`` (``gpu_cases``)."""
    return gpu_cases(out, GPU1_TOPOLOGY, GPU1_CASES, GPU1_SCHEDULE_ROWS, iterations, warmup, seed, only, resume)


def gpu4(out: Path, iterations: int, warmup: int, seed: int, only: tuple = (), resume: bool = False) -> dict:
    """4 GPUs: ``GPU4_CASES`` (``gpu_cases``)."""
    return gpu_cases(out, GPU4_TOPOLOGY, GPU4_CASES, GPU4_SCHEDULE_ROWS, iterations, warmup, seed, only, resume)


def gpu_cases(out: Path, topology_path: str, all_cases: dict, schedule_rows: tuple, iterations: int, warmup: int,
              seed: int, only: tuple = (), resume: bool = False) -> dict:
    """Calibrate on this host (compiled blocks, and eager ones if an eager case runs), then run the
    cases (``only``: just those labels); then the schedule ``schedule: auto`` picks for the schedule
    rows' stages against the fastest measured one. ``resume``: the calibration and rows an earlier
    run on this host left in ``out`` are kept (rows unless rerun), so the cases can be split over
    several calls; without it a calibration from another host is never reused."""
    from planner.runtime.launch import LaunchOptions, launch
    from planner.search.front import SearchOptions, search

    out.mkdir(parents=True, exist_ok=True)
    compiled, compiled_job = _calibrated(topology_path, out / "calibration.yaml", "auto", resume)
    cases = {label: all_cases[label] for label in only} if only else dict(all_cases)  # in only's order
    eager, eager_job = _calibrated(topology_path, out / "calibration-eager.yaml", "off", resume) \
        if any(case.eager for case in cases.values()) else (None, None)
    partial = out / "partial.json"
    report = json.loads(partial.read_text()) if resume and partial.exists() else {"rows": [], "memory": []}
    for label, case in cases.items():
        job = eager_job if case.eager else compiled_job
        training = replace(job.training, **{"micro_batch_size": 2, "schedule": case.schedule, **case.overrides})
        pinned = replace(job, training=training)
        # The search plans one chunk per device; an interleaved case splits its stages after.
        plan = search(pinned.topology, pinned.model, replace(training, virtual_stages=1),
                      SearchOptions(seed=seed, time_limit_s=10, stages=case.stages, replicas=case.replicas,
                                    tensor_degrees=case.tensor)).plan
        if case.layer_bounds:
            plan = replace(plan, layer_bounds=case.layer_bounds)
        if case.micro_batches:
            plan = replace(plan, micro_batches=case.micro_batches)
        if training.virtual_stages > 1:
            plan = interleave_plan(plan, training.virtual_stages)
        path = _write(plan, pinned, topology_path, out / "plans" / f"{label}.yaml", eager if case.eager else compiled)
        results = launch(path, LaunchOptions(iterations=iterations, warmup=warmup, out_dir=str(out / label),
                                             compile="off" if case.eager else "auto"), log=lambda s: None)
        row = {**run_row(results, label), "compiled": results["run"].get("compiled"),
               "graphs": results["run"].get("graphs"), "graphed_stages": results["run"].get("graphed_stages")}
        report["rows"] = [r for r in report["rows"] if r["label"] != label] + [row]
        report["memory"] = [m for m in report["memory"] if m["run"] != label] + [
            {"run": label, "device": device, "predicted_bytes": predicted, "measured_bytes": measured,
             "error": (predicted - measured) / measured} for device, predicted, measured in memory_rows(results)]
        report["device"] = results["run"]["device_name"]
        partial.write_text(json.dumps(report, indent=1, default=float) + "\n")
        print(f"{label:34} predicted {row['predicted_s']:.4f} s  measured {row['measured_s']:.4f} s  "
              f"{100 * row['error']:+6.1f}%", flush=True)
    # Which schedule auto picks for these stages on the compiled calibration, against the measurements.
    # Picked with one chunk per device (the default), with interleaving searched too, and with the
    # warm-up depth searched (one chunk).
    stages = all_cases[schedule_rows[0]].stages
    picks = {}
    for name, virtual_stages, depth in (("virtual_stages 1", 1, 1), ("virtual_stages auto", "auto", 1),
                                        ("warmup_depth auto", 1, "auto")):
        training = replace(compiled_job.training, micro_batch_size=2, schedule="auto", virtual_stages=virtual_stages,
                           warmup_depth=depth)
        pick = search(compiled_job.topology, compiled_job.model, training,
                      SearchOptions(seed=seed, time_limit_s=10, stages=stages, replicas=1, tensor_degrees=(1,))).plan
        picks[name] = {"schedule": str(pick.schedule), "virtual_stages": pick.virtual_stages,
                       "warmup_depth": pick.warmup_depth}
    measured = [r for r in report["rows"] if r["label"] in schedule_rows]
    if measured:
        fastest = min(measured, key=lambda r: r["measured_s"])
        report["schedule_pick"] = {"stages": stages, "auto_picks": picks, "fastest_measured": fastest["label"],
                                   "measured_s": {r["label"]: r["measured_s"] for r in measured}}
    report["calibration"] = compiled.document
    if eager is not None:
        report["calibration_eager"] = eager.document
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description="Predicted vs measured iteration time of executed plans.")
    parser.add_argument("mode", choices=["emulated", "gpu1", "gpu", "gpu4"])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=EMULATED_SECONDS,
                        help="emulated: the planner's pick emulated at about this many seconds per iteration "
                             "(raise it when runs warn of compute overrun)")
    parser.add_argument("--only", nargs="+", default=(), metavar="LABEL",
                        help="run only these plans (emulated: also a label without its topology or a dimension, "
                             f"one of {', '.join(DIMENSIONS)}; the other rows of the last run are kept)")
    parser.add_argument("--resume", action="store_true",
                        help="gpu, gpu4: keep the calibration and rows an earlier run on this host left in the "
                             "out folder (split the cases over several calls); without it, calibrate anew")
    args = parser.parse_args()
    cases = {"gpu1": GPU1_CASES, "gpu": GPU_CASES, "gpu4": GPU4_CASES}.get(args.mode)
    unknown = [label for label in args.only if cases is not None and label not in cases]
    if unknown:
        parser.error(f"--only: {', '.join(unknown)} not among the {args.mode} cases ({', '.join(cases)})")
    out = Path(args.out)
    runs = out / f"accuracy_{args.mode}"
    if args.mode == "gpu":
        report = gpu(runs, args.iterations, args.warmup, args.seed, tuple(args.only), args.resume)
    elif args.mode == "gpu1":
        report = gpu1(runs, args.iterations, args.warmup, args.seed, tuple(args.only), args.resume)
    elif args.mode == "gpu4":
        report = gpu4(runs, args.iterations, args.warmup, args.seed, tuple(args.only), args.resume)
    else:
        report = emulated(runs, args.iterations, args.warmup, args.seed, tuple(args.only), args.seconds)
    rows = report["rows"]
    predicted, measured = [r["predicted_s"] for r in rows], [r["measured_s"] for r in rows]
    report["summary"] = {"runs": len(rows), "mape": mean_absolute_percentage_error(predicted, measured),
                         "max_abs_error": max(abs(r["error"]) for r in rows),
                         "spearman": rank_correlation(predicted, measured)}
    if report.get("memory"):
        report["summary"]["memory_max_abs_error"] = max(abs(m["error"]) for m in report["memory"])
    print(f"\n{'run':58} {'predicted s':>11} {'measured s':>10} {'error':>7}  fits in memory")
    for r in rows:
        print(f"{r['label']:58} {r['predicted_s']:11.4f} {r['measured_s']:10.4f} {100 * r['error']:+6.1f}%  "
              f"{'yes' if r.get('fits', True) else 'no'}")
    s = report["summary"]
    print(f"\n{s['runs']} runs: MAPE {100 * s['mape']:.2f}%, max |error| {100 * s['max_abs_error']:.2f}%, "
          f"Spearman {s['spearman']:.3f}")
    for name, p in report.get("picks", {}).items():
        print(f"{name}: planner's pick {p['pick']} measured {100 * p['pick_over_fastest']:+.1f}% vs the fastest "
              "plan that fits in memory")
    if "schedule_pick" in report:
        p = report["schedule_pick"]
        print(f"{p.get('stages', 4)} stages: schedule auto picks {p['auto_picks']}; fastest measured {p['fastest_measured']}")
    for m in report.get("memory", []):
        print(f"memory {m['run']:34} {m['device']:8} predicted {m['predicted_bytes'] / 1e9:6.2f} GB "
              f"measured {m['measured_bytes'] / 1e9:6.2f} GB {100 * m['error']:+6.1f}%")
    (out / f"accuracy_{args.mode}.json").write_text(json.dumps(report, indent=1, default=float) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
