"""Topologies and hand-made plans for the runtime tests (CPU, gloo, the tiny model)."""

from pathlib import Path

import yaml

from planner.inputs.model import model_preset, parse_training
from planner.plan.plan import Plan
from planner.plan.document import plan_to_document, write_plan


def cpu_topology(path: Path, *, cross_host: str = "1Gbps", slow_peak: str | None = None) -> Path:
    """Six CPU 'devices' on two hosts (a*, b*); ``slow_peak`` overrides b2's speed."""
    devices = [{"name": n, "type": "CPU-core", "host": n[0]} for n in ("a0", "a1", "a2", "b0", "b1")]
    last = {"name": "b2", "type": "CPU-core", "host": "b"}
    if slow_peak:
        last["peak_flops"] = slow_peak
    devices.append(last)
    document = {"name": "cpu-six", "devices": devices,
                "network": {"host": {"latency": "0.2ms", "bandwidth": "10Gbps"},
                            "region": {"latency": "2ms", "bandwidth": cross_host}}}
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def write_test_plan(folder: Path, topology_path: Path, *, assignment, layer_bounds, micro_batches, micro_batch_size,
                    schedule, model=None, optimizer="sgd", name="plan.yaml", shard_optimizer=True,
                    recompute=False, micro_batches_per_round=0, tensor_groups=(), sync_every=1, sync="ring",
                    ring_orders=(), virtual_stages=1, compress_gradients="off", powersgd_rank=4,
                    warmup_depth=1, recompute_table=()) -> Path:
    """A plan file of the tiny model (or ``model``) on ``topology_path``'s devices; ``recompute_table``:
    per replica, each stage's recompute mode (``Plan.recompute``; empty: the training's mode)."""
    from planner.io import read_yaml
    from planner.inputs.topology import parse_topology
    from planner.plan.dims import Compression

    model = model or model_preset("tiny")
    topology = parse_topology(read_yaml(topology_path), name="cpu-six")
    training = parse_training({"global_batch": micro_batch_size * sum(micro_batches),
                               "micro_batch_size": micro_batch_size, "precision": "fp32", "optimizer": optimizer,
                               "schedule": schedule, "shard_optimizer": shard_optimizer,
                               "recompute": recompute, "micro_batches_per_round": micro_batches_per_round,
                               "sync_every": sync_every, "sync": sync, "virtual_stages": virtual_stages,
                               "compress_gradients": compress_gradients, "powersgd_rank": powersgd_rank,
                               "warmup_depth": warmup_depth})
    used = {d for row in assignment for d in row} | {m for group in tensor_groups for m in group}
    plan = Plan(layer_bounds=tuple(layer_bounds), assignment=tuple(tuple(r) for r in assignment),
                micro_batches=tuple(micro_batches), micro_batch_size=micro_batch_size, schedule=schedule,
                topology_name=topology.name, topology_sha256=topology.sha256,
                idle=tuple(d.name for d in topology.devices if d.name not in used),
                micro_batches_per_round=micro_batches_per_round,
                tensor_groups=tuple(tuple(group) for group in tensor_groups), sync_every=sync_every,
                ring_orders=tuple(tuple(order) for order in ring_orders), virtual_stages=virtual_stages,
                compression=Compression.of_training(training), warmup_depth=warmup_depth,
                recompute=tuple(tuple(row) for row in recompute_table))
    if sync != "ring":  # the algorithm, and a parameter server per stage where it needs one
        from planner.search.sync_choice import plan_with_sync

        plan = plan_with_sync(plan, topology, sync)
    path = folder / name
    write_plan(plan_to_document(plan, model=model, training=training, topology_source=str(topology_path)), path)
    return path


def rank_reporting_one_failure(rank, world, store_port, results):
    """For the spawn test: rank 1 reports an error, the others their rank squared."""
    results.put((rank, "ValueError: boom" if rank == 1 else rank * rank))


def two_by_two_plan(folder: Path) -> Path:
    """2 replicas x 2 stages of the tiny model on the six CPU devices (a0 b0 / a1 b1), 1F1B."""
    topology = cpu_topology(folder / "topology.yaml")
    return write_test_plan(folder, topology, assignment=[["a0", "b0"], ["a1", "b1"]], layer_bounds=[0, 2, 4],
                           micro_batches=[2, 2], micro_batch_size=2, schedule="1f1b")


def run_cli(argv, capsys) -> tuple:
    """(exit code, stdout, stderr) of ``plan ARGV`` run in this process."""
    from planner.cli import main

    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def without_powersgd_state(checkpoint: Path, folder: Path) -> Path:
    """A copy of ``checkpoint`` at ``folder`` without its PowerSGD state (error memory and Q files,
    and the record of them): resuming from it restarts PowerSGD."""
    import json
    import shutil

    shutil.copytree(checkpoint, folder)
    for stale in folder.glob("powersgd-*.pt"):
        stale.unlink()
    document = json.loads((folder / "checkpoint.json").read_text())
    (folder / "checkpoint.json").write_text(json.dumps({**document, "powersgd": None}))
    return folder
