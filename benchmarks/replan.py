"""Re-planning after a device is lost or added, and an emulated elastic run that loses a worker.

    python benchmarks/replan.py [--budget 5] [--seed 0] [--only TOPOLOGY ...] [--no-elastic]

Re-plans (``planner.search.replan``, what ``plan OLD_TOPOLOGY --from OLD_PLAN --lost DEVICE`` or
``--added DEVICES.yaml`` runs): for each topology of ``TOPOLOGIES``, the search's plan (``plan
TOPOLOGY --budget B --seed S``, written and read back as a re-plan reads it), then three changes:

- ``lose most state``: the device holding the most state (weights + optimizer share,
  ``planner.search.replan.held_bytes``) leaves;
- ``lose slowest type``: a device of the slowest type (achieved FLOP/s at the plan's precision)
  leaves, the one of them holding the most state (an idle one where the plan uses none);
- ``add one``: one more device of the type of the device holding the most state joins, on a host of
  its own in that device's region (linked by the topology's levels).

Each change is re-planned twice with the same work budget and seed: the minimal-move re-plan
(``replan``, default ``--move-weight``) and a free re-plan from scratch (``plan CHANGED_TOPOLOGY``:
the topology file's model and training, no old plan), whose state moves are counted by the same
``plan_moves``. Same budget and seed, same numbers (but the wall times), while the clock cuts no
search phase (``--time-limit`` is far above the budget; each record lists ``clock_cut``).

Elastic (``plan launch PLAN --emulate --elastic``): the search's plan for
``topologies/emulated/home-mini.yaml``, emulated (its reduced model: the plan's layers, hidden 32)
at the automatic time scale, 6 iterations, a checkpoint every 2; once the checkpoint of iteration
2 is complete, the rank of the device holding the most state is SIGKILLed (as
``tests/test_checkpoint.py`` does). The launch re-plans without it (its search's work budget:
``--budget``), resumes and finishes; its ``results.json``'s ``elastic`` event is reported, and its
losses next to uninterrupted single-process training of the executed model.

Prints the tables and writes ``benchmarks/results/replan.json``.
"""

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.inputs.job import load_job, topology_from_document  # noqa: E402
from planner.io import read_yaml, write_document  # noqa: E402
from planner.plan.document import plan_to_document, write_plan  # noqa: E402
from planner.search.front import SearchOptions, search  # noqa: E402
from planner.search.replan import (changed_topology, held_bytes, plan_moves, read_old_plan, replan,  # noqa: E402
                                   topology_without)

TOPOLOGIES = ("topologies/hetero/home-consumer-gpus.yaml", "topologies/hetero/lab-mixed-a40-l4.yaml",
              "topologies/hetero/h100-3090-homes.yaml", "topologies/hetero/two-datacenters-a100-v100-t4.yaml",
              "topologies/hetero/a100-t4-small-memory.yaml")
ELASTIC_TOPOLOGY = "topologies/emulated/home-mini.yaml"
LOSE_MOST, LOSE_SLOWEST, ADD_ONE = "lose most state", "lose slowest type", "add one"
TIME_LIMIT_PER_BUDGET = 20.0  # the clock's cap, in budgets: far above the work, so it cuts no phase
GIB = 2.0 ** 30


def _options(budget_s: float, seed: int) -> SearchOptions:
    return SearchOptions(seed=seed, budget_s=budget_s, time_limit_s=TIME_LIMIT_PER_BUDGET * budget_s)


def _most_state(plan, model, training, among=None) -> str | None:
    """The device (of ``among``, default all the plan uses) holding the most state; ties: the first."""
    held = held_bytes(plan, model, training)
    names = [d for d in (among if among is not None else held) if d in held]
    return max(names, key=lambda d: held[d]) if names else None


def changes(old, topology, document: dict, model, training) -> list:
    """[(label, lost device names, added document or None)] of the three changes (module description)."""
    most = _most_state(old, model, training)
    speed = {d.type_name: d.effective_flops(training.precision) for d in topology.devices}
    slowest = min(speed, key=lambda kind: (speed[kind], kind))
    of_type = [d.name for d in topology.devices if d.type_name == slowest]
    victim = _most_state(old, model, training, among=of_type) or of_type[0]
    template = next(e for e in topology_without(document, ())["devices"] if e["name"] == most)
    name = f"added-{template['type'].lower()}"
    added = {"devices": [{**template, "name": name, "host": name}]}
    return [(LOSE_MOST, (most,), None), (LOSE_SLOWEST, (victim,), None), (ADD_ONE, (), added)]


def _moved(moves) -> dict:
    return {"move_bytes": moves.bytes, "move_s": moves.seconds, "checkpoint_bytes": moves.checkpoint_bytes,
            "receivers": len(moves.receivers)}


def _shape(plan) -> dict:
    return {"stages": plan.stages, "replicas": plan.replicas, "used": len(plan.used_devices),
            "layer_bounds": list(plan.layer_bounds), "assignment": [list(row) for row in plan.assignment],
            "tensor_groups": [list(g) for g in plan.tensor_groups],
            "clock_cut": list(plan.search.get("clock_cut", []))}


def replan_rows(path, *, budget_s: float, seed: int, folder) -> dict:
    """The old plan of the topology file ``path`` and a row per change (module description)."""
    folder, options = Path(folder), _options(budget_s, seed)
    job = load_job(path)
    found = search(job.topology, job.model, job.training, options)
    old_path = folder / "old.yaml"
    write_plan(plan_to_document(found.plan, model=job.model, training=found.training, topology_source=str(path)),
               old_path)
    old, model, training = read_old_plan(old_path)
    document = read_yaml(path)
    held = held_bytes(old, model, training)
    rows = []
    for label, lost, added in changes(old, job.topology, document, model, training):
        stem = label.replace(" ", "-")
        changed = changed_topology(document, lost=lost, added=added)
        changed_path = folder / f"{stem}.topology.yaml"
        write_document(changed, changed_path)
        topology = topology_from_document(changed, changed_path)
        started = time.perf_counter()
        result = replan(old, topology, model, training, options)
        replan_wall_s = time.perf_counter() - started
        fresh_job = load_job(changed_path)
        started = time.perf_counter()
        fresh = search(fresh_job.topology, fresh_job.model, fresh_job.training, options)
        fresh_wall_s = time.perf_counter() - started
        fresh_moves = plan_moves(old, fresh.plan, topology, model, fresh.training)
        change = ["--lost", *lost]
        if added:
            write_document(added, folder / f"{stem}.devices.yaml")
            change = ["--added", f"{stem}.devices.yaml"]
        rows.append({
            "change": label, "lost": list(lost), "added": (added or {}).get("devices", []),
            "lost_held_bytes": sum(held.get(d, 0.0) for d in lost),
            "replan": {"iteration_s": result.plan.prediction.iteration_s, **_moved(result.moves),
                       "chosen": result.chosen, "why": result.why, "wall_s": replan_wall_s,
                       "evaluations": result.search.evaluations if result.search else 0,
                       "options": [{"label": o.label, "iteration_s": o.iteration_s, "problem": o.problem,
                                    **(_moved(o.moves) if o.moves else {})} for o in result.options],
                       **_shape(result.plan),
                       "clock_cut": list(result.search.plan.search.get("clock_cut", [])) if result.search else []},
            "free": {"iteration_s": fresh.predicted_s, **_moved(fresh_moves), "wall_s": fresh_wall_s,
                     "evaluations": fresh.evaluations, "precision": fresh.training.precision, **_shape(fresh.plan)},
            "commands": {"replan": " ".join(["plan", str(path), "--from", "old.yaml", *change, "--budget",
                                              f"{budget_s:g}", "--seed", str(seed), "-o", f"{stem}.yaml"]),
                         "free": f"plan {stem}.topology.yaml --budget {budget_s:g} --seed {seed}"}})
    return {"topology": str(path), "devices": job.topology.size, "model": model.name, "precision": training.precision,
            "old": {"iteration_s": found.predicted_s, "evaluations": found.evaluations,
                    "wall_s": found.wall_s, **_shape(found.plan),
                    "command": f"plan {path} --budget {budget_s:g} --seed {seed} -o old.yaml"},
            "rows": rows}


def _kill_after(checkpoint: Path, rank: int, runner: threading.Thread, timeout_s: float) -> float:
    """SIGKILL the local rank ``rank`` (a child of this process) once ``checkpoint`` is complete;
    the time it was killed (``time.time()``). The launch running in ``runner`` must still run."""
    import multiprocessing
    import signal

    deadline = time.monotonic() + timeout_s
    while not (checkpoint / "checkpoint.json").exists():
        if not runner.is_alive():
            raise RuntimeError(f"the launch ended before {checkpoint} was written")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no checkpoint at {checkpoint} within {timeout_s:g} s")
        time.sleep(0.05)
    (victim,) = [p for p in multiprocessing.active_children() if p.name == f"rank{rank}"]
    os.kill(victim.pid, signal.SIGKILL)
    return time.time()


def elastic_run(folder, *, budget_s: float, seed: int, iterations: int = 6, checkpoint_every: int = 2) -> dict:
    """The emulated elastic run of the module description: its event and timings from ``results.json``."""
    from planner.runtime.engine import Layout
    from planner.runtime.inputs import emulated_model, load_run_inputs
    from planner.runtime.launch import LaunchOptions, auto_time_scale, launch
    from planner.runtime.reference import train_single_process

    folder = Path(folder)
    path = ROOT / ELASTIC_TOPOLOGY
    job = load_job(path)
    found = search(job.topology, job.model, job.training, _options(budget_s, seed))
    plan_path = folder / "plan.yaml"
    write_plan(plan_to_document(found.plan, model=job.model, training=found.training, topology_source=str(path)),
               plan_path)
    inputs = load_run_inputs(plan_path)
    device = _most_state(inputs.plan, inputs.model, inputs.training)
    rank = Layout.of_plan(inputs.plan).device_ranks(inputs.plan)[device]
    scale = auto_time_scale(inputs)
    checkpoints, out = folder / "checkpoints", folder / "run"
    options = LaunchOptions(emulate=True, time_scale=scale, iterations=iterations, warmup=0, out_dir=str(out),
                            seed=seed, checkpoint_every=checkpoint_every, checkpoint_dir=str(checkpoints),
                            elastic=True, replan_budget_s=budget_s)
    finished = {}
    runner = threading.Thread(target=lambda: finished.update(results=launch(plan_path, options, log=print)))
    started = time.time()
    runner.start()
    killed = _kill_after(checkpoints / f"iteration-{checkpoint_every:08d}", rank, runner, timeout_s=600.0)
    runner.join(timeout=1200)
    results = finished["results"]
    (event,) = results["elastic"]["events"]
    first = results["run"]["first_iteration"]
    reference, _ = train_single_process(emulated_model(inputs.model), global_batch=inputs.training.global_batch,
                                        iterations=iterations, seed=seed, learning_rate=options.learning_rate,
                                        optimizer=inputs.training.optimizer)
    loss = results["measured"]["loss"]
    return {"topology": ELASTIC_TOPOLOGY, "model": inputs.model.name, "iterations": iterations,
            "checkpoint_every": checkpoint_every, "time_scale": scale, "killed_rank": rank, "killed_device": device,
            "killed_after_s": killed - started, "wall_s": time.time() - started,
            "old_plan": {**_shape(inputs.plan), "predicted_iteration_s": found.predicted_s,
                         "assignment": [list(r) for r in inputs.plan.assignment]},
            "event": {k: v for k, v in event.items() if k not in ("topology", "plan", "checkpoint")},
            "measured_median_s": results["measured"]["median_s"],
            "predicted_s": results["comparison"]["predicted_s"], "first_iteration": first, "loss": loss,
            "uninterrupted_loss": reference[first:],
            "loss_max_relative_difference": max(abs(a / b - 1.0) for a, b in zip(loss, reference[first:])),
            "command": (f"plan {ELASTIC_TOPOLOGY} --budget {budget_s:g} --seed {seed} -o plan.yaml; plan launch "
                        f"plan.yaml --emulate --elastic --time-scale {scale:.4g} --iterations {iterations} --warmup 0 "
                        f"--checkpoint-every {checkpoint_every} --checkpoint-dir ck --out run; SIGKILL rank {rank} "
                        f"({device}) once ck/iteration-{checkpoint_every:08d} is complete")}


def _print_replans(topologies: list) -> None:
    header = (f"{'topology':30s} {'change':18s} {'old s':>8s} {'new s':>8s} {'moved':>9s} {'move s':>8s} "
              f"{'free s':>8s} {'free moved':>10s} {'free mv s':>9s} {'wall s':>7s} {'evals':>6s}  chosen")
    print(header)
    print("-" * len(header))
    for t in topologies:
        name = Path(t["topology"]).stem
        for row in t["rows"]:
            r, f = row["replan"], row["free"]
            print(f"{name:30s} {row['change']:18s} {t['old']['iteration_s']:8.3f} {r['iteration_s']:8.3f} "
                  f"{r['move_bytes'] / GIB:7.2f}Gi {r['move_s']:8.2f} {f['iteration_s']:8.3f} "
                  f"{f['move_bytes'] / GIB:8.2f}Gi {f['move_s']:9.2f} {r['wall_s']:7.2f} {r['evaluations']:6d}  "
                  f"{r['chosen']}")
    print("\nLosing one device moves only the state it held (or says why more must move):")
    header = f"{'topology':30s} {'lost':16s} {'held':>9s} {'moved':>9s} {'checkpt':>9s}  re-plan says"
    print(header)
    print("-" * len(header))
    for t in topologies:
        for row in (r for r in t["rows"] if r["lost"]):
            r = row["replan"]
            print(f"{Path(t['topology']).stem:30s} {row['lost'][0]:16s} {row['lost_held_bytes'] / GIB:7.2f}Gi "
                  f"{r['move_bytes'] / GIB:7.2f}Gi {r['checkpoint_bytes'] / GIB:7.2f}Gi  {r['why']}")


def _print_elastic(run: dict) -> None:
    e = run["event"]
    print(f"\nElastic ({run['topology']}, {run['model']} emulated at time scale {run['time_scale']:.4g}): "
          f"rank {e['failed_rank']} ({e['device']}) killed {run['killed_after_s']:.1f} s into the run")
    print(f"  failure: {e['failure']}")
    print(f"  resumed from iteration {e['checkpoint_iteration']}; lost {e['lost_s']:.2f} s (checkpoint to failure), "
          f"detected {e['detected_after_s']:.2f} s after start, re-plan {e['replan_s']:.2f} s, restarted "
          f"{e['restarted_after_s']:.2f} s after detection")
    print(f"  old plan {run['old_plan']['predicted_iteration_s']:.3f} s/iteration ({run['old_plan']['assignment']}); "
          f"new plan {e['new_plan']['predicted_iteration_s']:.3f} s ({e['new_plan']['assignment']}): {e['chosen']}; "
          f"moves {e['moves']['bytes'] / GIB:.2f} GiB in {e['moves']['seconds']:.2f} s")
    print(f"  after the restart: measured median {run['measured_median_s']:.3f} s of this host, predicted "
          f"{run['predicted_s']:.3f} s; losses {', '.join(f'{x:.4f}' for x in run['loss'])}, uninterrupted training's "
          f"within {run['loss_max_relative_difference']:.1e} (relative); whole run {run['wall_s']:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=5.0, help="each search's work budget (plan --budget)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", nargs="*", default=[], help="topology paths (default: TOPOLOGIES)")
    parser.add_argument("--no-elastic", action="store_true", help="skip the emulated elastic run")
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "replan.json"))
    args = parser.parse_args()
    started, load = time.perf_counter(), os.getloadavg()
    topologies = []
    with tempfile.TemporaryDirectory() as scratch:
        for k, path in enumerate(args.only or TOPOLOGIES):
            folder = Path(scratch) / str(k)
            folder.mkdir()
            topologies.append(replan_rows(path, budget_s=args.budget, seed=args.seed, folder=folder))
        _print_replans(topologies)
        elastic = None
        if not args.no_elastic:
            (Path(scratch) / "elastic").mkdir()
            elastic = elastic_run(Path(scratch) / "elastic", budget_s=args.budget, seed=args.seed)
            _print_elastic(elastic)
    wall_s = time.perf_counter() - started
    print(f"\n{wall_s:.0f} s in all")
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    with open(args.output, "w") as handle:
        json.dump({"command": " ".join(["python", "benchmarks/replan.py"] + sys.argv[1:]), "budget_s": args.budget,
                   "seed": args.seed, "cpus": os.cpu_count(), "load_average_at_start": load, "wall_s": wall_s,
                   "topologies": topologies, "elastic": elastic}, handle, indent=1)


if __name__ == "__main__":
    main()
