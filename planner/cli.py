"""``plan``: a thin dispatcher over library functions. Bad input: one line, exit code 2."""

import argparse
import dataclasses
import json
import math
import os
import re
import sys
import tempfile
import time
from pathlib import Path

from planner.errors import InputError
from planner.runtime.graphs import COMPILE_CHOICES

__all__ = ["main"]

EXIT_INPUT = 2
EXIT_FAILED = 1
WHY_SHARE = 0.1  # of --time-limit, at most about, for the report's why-idle and what-binds re-evaluations
OUTPUT_SHARE = 0.02  # of --time-limit, kept for rendering the report and writing the plan


def _plan_parser(sub) -> None:
    p = sub.add_parser("make", help="plan a topology (the default command)")
    p.add_argument("topology", help="topology YAML file")
    p.add_argument("--model", help="model preset name (overrides the file's model section)")
    p.add_argument("--model-file", help="model YAML file")
    p.add_argument("--global-batch", type=int, help="global batch in sequences")
    p.add_argument("--micro-batch-size", type=int, help="micro-batch size in sequences (default: searched)")
    p.add_argument("--schedule", choices=["1f1b", "gpipe", "zb-h1", "auto"],
                   help="pipeline schedule (auto: 1f1b or gpipe, and zb-h1 where a calibration measured every device's split backward)")
    p.add_argument("--sync-every", type=int, metavar="H",
                   help="local steps (DiLoCo): replicas sync parameter deltas every H iterations (default: the "
                        "file's training.sync_every, else 1); H > 1 changes the optimisation")
    p.add_argument("--sync-groups", metavar="auto|replica|cluster|one",
                   help="with --sync-every H > 1, which replicas all-reduce gradients every iteration as one worker: "
                        "replica (each alone), cluster (replicas whose devices sit stage by stage in the same "
                        "regions), one (all), or auto: the fastest of these (default: the file's "
                        "training.sync_groups, else auto)")
    p.add_argument("--virtual-stages", metavar="N|auto",
                   help="interleaved 1F1B: model chunks per device; auto: the search picks v per plan among 1, 2, "
                        "4, ... (default: the file's training.virtual_stages, else 1)")
    p.add_argument("--warmup-depth", metavar="K|auto",
                   help="1F1B's or ZB-H1's warm-up forwards per stage downstream: stage s runs min(K (S - s - 1), M) "
                        "forwards before its first backward (under ZB-H1 it also holds K s weight gradients back), "
                        "so messages over slow links and the first backward's wait overlap compute (K - 1 more "
                        "micro-batches' activations per stage downstream); auto: the search picks K per 1F1B or "
                        "ZB-H1 plan (default: the file's training.warmup_depth, else 1)")
    p.add_argument("--micro-batches-per-round", type=int, metavar="K",
                   help="accumulation rounds: each replica's micro-batches run K at a time, each round its own "
                        "pipeline fill and drain (default: the file's training.micro_batches_per_round, else 0 = one round)")
    p.add_argument("--compress-messages", metavar="off|int8|auto",
                   help="messages between pipeline stages in block-wise int8 (lossy); auto: where the cost model "
                        "says it is faster (default: the file's training.compress_messages, else off)")
    p.add_argument("--compress-gradients", metavar="off|powersgd|auto",
                   help="data-parallel gradient sync by PowerSGD (lossy); auto: where the cost model says it is "
                        "faster (default: the file's training.compress_gradients, else off)")
    p.add_argument("--powersgd-rank", type=int, metavar="R",
                   help="PowerSGD's rank (default: the file's training.powersgd_rank, else 4)")
    p.add_argument("--sync", metavar="ring|hierarchical|parameter-server|sharded|auto",
                   help="data-parallel gradient sync: ring all-reduce in the plan's ring order, hierarchical (reduce "
                        "in each host, ring among hosts, broadcast back), parameter-server (reduce to one device per "
                        "stage, broadcast back), sharded (DTFM's all-to-all of shards), or auto: the fastest for the "
                        "plan (default: the file's training.sync, else ring)")
    p.add_argument("--stages", type=int, help="pin the number of pipeline stages")
    p.add_argument("--replicas", type=int, help="pin the number of data-parallel replicas")
    p.add_argument("--calibration", help="calibration file from 'plan calibrate' (measured efficiency, links); "
                   "with --from: the one the re-plan uses (default: the old plan's)")
    p.add_argument("--seed", type=int, default=0, help="random seed, 0 or more (same seed, same plan)")
    p.add_argument("--time-limit", type=float, default=30.0,
                   help="time limit in seconds of the whole command: reading, search, report and writing end "
                        "within it (default 30)")
    p.add_argument("--budget", type=float, metavar="SECONDS",
                   help="the search's work budget, in seconds of work at fixed rates: the same seed and budget "
                        "give the same plan whatever the machine's load while --time-limit leaves it time "
                        "(default: the search's share of --time-limit)")
    p.add_argument("--objective", choices=["time", "cost", "time-under-budget", "dtfm"], default="time",
                   help="time: the simulated iteration time (default); cost: US dollars per iteration (device-hours "
                        "of the used devices plus egress between regions); time-under-budget: the fastest plan "
                        "costing at most --budget-usd-per-iteration; dtfm: DTFM's objective (all devices, "
                        "even splits), for comparison")
    p.add_argument("--budget-usd-per-iteration", type=float, metavar="USD",
                   help="with --objective time-under-budget: the most one iteration may cost, in US dollars")
    p.add_argument("--charge-idle", action="store_true",
                   help="charge every device of the topology, used or idle (a rented whole cluster); "
                        "by default idle devices cost nothing")
    p.add_argument("--pareto", action="store_true",
                   help="print the time / $ front of distinct plans and write each to PLAN-pareto-K.yaml "
                        "(PLAN: the -o file's name, else 'plan')")
    p.add_argument("--top", type=int, metavar="K", help="list the K best distinct plans (degrees or device sets differ)")
    p.add_argument("--no-exact", action="store_true",
                   help="skip the CP-SAT exact placement of the leading shapes (topologies of up to 12 devices)")
    p.add_argument("-o", "--output", help="write the plan to FILE (.yaml or .json)")
    p.add_argument("--format", choices=["text", "json"], default="text", help="what to print")
    p.add_argument("--from", dest="from_plan", metavar="OLD_PLAN",
                   help="re-plan: OLD_PLAN's cluster changed into TOPOLOGY (devices lost or added); keep state where "
                        "it is unless moving it pays, and report what moves")
    p.add_argument("--move-weight", type=float, metavar="ITERATIONS",
                   help="with --from: minimise iteration time + move time / ITERATIONS (default 1000)")
    p.add_argument("--lost", nargs="+", metavar="DEVICE",
                   help="with --from: TOPOLOGY is OLD_PLAN's cluster and these devices left it; the changed "
                        "topology is written next to --output as NAME.topology.yaml")
    p.add_argument("--added", metavar="FILE",
                   help="with --from: TOPOLOGY is OLD_PLAN's cluster and FILE's 'devices' (topology format; "
                        "their links in 'network: pairs:' where levels do not give them) joined it")
    p.add_argument("--tensor-degrees", type=int, nargs="+", choices=[1, 2, 4, 8], default=[1, 2, 4, 8], metavar="T",
                   help="tensor-parallel degrees tried inside a host, from 1 2 4 8 (default all; 1: none; "
                        "without 1: groups only, e.g. '--tensor-degrees 2')")


def _launch_parser(sub) -> None:
    p = sub.add_parser("launch", help="run a plan file with the bundled torch.distributed runtime and measure it")
    p.add_argument("plan", help="plan file written by 'plan TOPOLOGY -o FILE'")
    p.add_argument("--iterations", type=int, default=10, help="measured iterations (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="warm-up iterations, not measured (default 2)")
    p.add_argument("--out", default="runs/latest", help="folder for results.json and trace.json")
    p.add_argument("--emulate", action="store_true",
                   help="emulate the plan's devices and network on this host (CPU, reduced model)")
    p.add_argument("--time-scale", type=float,
                   help="emulated seconds per plan second (default: about 2 s per iteration)")
    p.add_argument("--slow", default="", metavar="DEVICE:FACTOR[@ITERATION]",
                   help="emulated straggler: DEVICE computes FACTOR times slower from ITERATION (1-based) on")
    p.add_argument("--topology", help="topology file (default: the one the plan names)")
    p.add_argument("--hostfile", help="hosts and their plan devices: one torchrun per host")
    p.add_argument("--dry-run", action="store_true", help="with --hostfile: print the torchrun commands only")
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto", help="communication backend")
    p.add_argument("--master-port", type=int, default=29500, help="rendezvous port of the first host")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and synthetic data")
    p.add_argument("--lr", type=float, default=1e-3, help="learning rate")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds before a stuck collective fails")
    p.add_argument("--save-state", action="store_true", help="write replica 0's weights to OUT/state/")
    p.add_argument("--compile", choices=COMPILE_CHOICES, default="auto",
                   help="torch.compile each block and the loss (auto: on GPUs, tensor-group stages replayed as "
                        "CUDA graphs; off on CPUs; graphs: compiled, every stage but ZB-H1's replayed as CUDA "
                        "graphs on GPUs)")
    p.add_argument("--profile", action="store_true",
                   help="write each rank's torch.profiler operator table of the last measured iteration "
                        "to OUT/profile-rank-R.txt")
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="N",
                   help="save weights, optimizer state and data position every N iterations (with --checkpoint-dir)")
    p.add_argument("--checkpoint-dir", metavar="DIR", help="folder for the checkpoints (the last 2 are kept)")
    p.add_argument("--resume", metavar="DIR",
                   help="continue from the newest checkpoint in DIR, under this plan (any split and degrees)")
    p.add_argument("--elastic", action="store_true",
                   help="when a rank dies, re-plan without its device and resume from the last checkpoint "
                        "(with --checkpoint-every and --checkpoint-dir)")


def _calibrate_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="measure device efficiency and links here; write a calibration file")
    p.add_argument("topology", help="topology YAML file (its model and training give the shapes)")
    p.add_argument("-o", "--output", default="calibration.yaml", help="calibration file to write (.yaml or .json)")
    p.add_argument("--device-type", help="catalog type of this host's devices (default: the topology's only type)")
    p.add_argument("--processes", type=int, help="processes for the link probe (default: GPUs here, else 2)")
    p.add_argument("--names", help="comma-separated topology device names of those processes")
    p.add_argument("--model", help="model preset (overrides the topology's model)")
    p.add_argument("--micro-batch-size", type=int, help="micro-batch size to measure at")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per measurement")
    p.add_argument("--compile", choices=COMPILE_CHOICES, default="auto",
                   help="time compiled blocks and loss, as 'plan launch --compile' runs them (auto: on GPUs, "
                        "tensor groups' blocks as CUDA graphs)")
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto")


def _plot_parser(sub) -> None:
    p = sub.add_parser("plot", help="figures of predicted vs measured from run folders (PNG and SVG)")
    p.add_argument("runs", nargs="+", help="run folders written by 'plan launch --out'")
    p.add_argument("--out", default="figures", help="folder for the figures (default: figures)")
    p.add_argument("--title", default="Predicted vs measured iteration time", help="title of the accuracy figure")
    p.add_argument("--figures", default="accuracy,timeline,memory",
                   help="comma-separated subset of accuracy, timeline, memory (default: all), or loss: every "
                        "run's measured loss per iteration on one axis")


COMMANDS = ("make", "launch", "calibrate", "plot")


class _Parser(argparse.ArgumentParser):
    """argparse's parser whose refusals (a bad option value, an unknown option) are one line, not the
    usage block; ``-h`` still prints it all. Subcommands' parsers are of this class too."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} ('{self.prog} -h' lists the options)\n")


def _parse(argv: list) -> argparse.Namespace:
    """Parse ``argv``; anything that does not start with a command is ``plan make``'s, options first
    or not (``plan -o plan.yaml topo.yaml`` is ``plan make -o plan.yaml topo.yaml``)."""
    from planner import __version__

    parser = _Parser(prog="plan", description="Plan training on heterogeneous devices.")
    parser.add_argument("--version", action="version", version=f"plan (hetplan) {__version__}")
    sub = parser.add_subparsers(dest="command")
    _plan_parser(sub)
    _launch_parser(sub)
    _calibrate_parser(sub)
    _plot_parser(sub)
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        print("\n  plan TOPOLOGY [options]   (same as 'plan make'; 'plan make -h' lists the options)")
        raise SystemExit(0)
    if argv[0] not in COMMANDS and argv[0] != "--version":
        argv = ["make"] + list(argv)
    return parser.parse_args(argv)


class _Progress:
    """A progress bar on stderr for searches that last over a second (only on a terminal)."""

    def __init__(self, limit_s: float):
        import time

        self.clock, self.started, self.limit_s, self.shown = time.monotonic, time.monotonic(), limit_s, False

    def __call__(self, info: dict) -> bool:
        elapsed = self.clock() - self.started
        if elapsed > 1.0 and sys.stderr.isatty():
            done = min(elapsed / self.limit_s, 1.0)
            bar = "#" * int(20 * done) + "-" * (20 - int(20 * done))
            best = info.get("best_s", float("inf"))
            text = f"best {best:.3f} s" if best < float("inf") else "no plan yet"
            print(f"\r[{bar}] {elapsed:5.1f} s  {info.get('phase', '')}: {info.get('evaluations', 0)} candidates, "
                  f"{text}", end="", file=sys.stderr, flush=True)
            self.shown = True
        return False

    def close(self) -> None:
        if self.shown:
            print(file=sys.stderr)


def _positive(name: str, value):
    if value is not None and value < 1:
        raise InputError(f"must be at least 1, got {value}", field=name)
    return value


def _sync_every(value):
    from planner.inputs.model import MAX_SYNC_EVERY

    if value is not None and not 1 <= value <= MAX_SYNC_EVERY:
        raise InputError(f"must be from 1 to {MAX_SYNC_EVERY:,} iterations between syncs, got {value}",
                         field="--sync-every")
    return value


def _sync_groups(value):
    from planner.plan.sync_groups import SYNC_GROUPINGS

    if value is not None and value not in SYNC_GROUPINGS:
        raise InputError(f"{value!r} is not one of {', '.join(SYNC_GROUPINGS)}", field="--sync-groups")
    return value


def _whole_or_auto(flag: str, value, most: int):
    """``flag``'s value: a whole number from 1 to ``most``, or auto (None: the file's)."""
    if value is None or value == "auto":
        return value
    if not value.isdigit() or not 1 <= int(value) <= most:
        raise InputError(f"must be a whole number from 1 to {most} or auto, got {value!r}", field=flag)
    return int(value)


def _compression_overrides(args) -> dict:
    """The compression options as training overrides (None: the file's), each bad value one line."""
    from cost_models.compression import MAX_POWERSGD_RANK, GradientCompression, MessageCompression

    for flag, value, kind in (("--compress-messages", args.compress_messages, MessageCompression),
                              ("--compress-gradients", args.compress_gradients, GradientCompression)):
        if value is not None and value not in tuple(kind) + ("auto",):
            raise InputError(f"{value!r} is not one of {', '.join(kind)}, auto", field=flag)
    if args.powersgd_rank is not None and not 1 <= args.powersgd_rank <= MAX_POWERSGD_RANK:
        raise InputError(f"must be from 1 to {MAX_POWERSGD_RANK}, got {args.powersgd_rank}", field="--powersgd-rank")
    from planner.plan.sync import SYNC_CHOICES

    if args.sync is not None and args.sync not in SYNC_CHOICES:
        raise InputError(f"{args.sync!r} is not one of {', '.join(SYNC_CHOICES)}", field="--sync")
    return {"compress_messages": args.compress_messages, "compress_gradients": args.compress_gradients,
            "powersgd_rank": args.powersgd_rank, "sync": args.sync}


def _non_negative_or_none(name: str, value):
    if value is not None and value < 0:
        raise InputError(f"must be at least 0 (0: one round), got {value}", field=name)
    return value


def _non_negative(name: str, value: int) -> int:
    if value < 0:
        raise InputError(f"must be 0 or more, got {value}: pass a non-negative seed such as 0", field=name)
    return value


def _finite_positive(name: str, value, *, unit: str = "seconds"):
    """``value`` when it is a finite number above zero (``nan`` and ``inf`` parse as floats)."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise InputError(f"must be a finite number of {unit} above 0, got {value}", field=name)
    return value


PLAN_SUFFIXES = (".yaml", ".yml", ".json")


def _inputs(args) -> list:
    """The files this command reads (topology, old plan, added devices, calibration), resolved."""
    names = (getattr(args, key, None) for key in ("topology", "from_plan", "added", "calibration"))
    return [Path(name).resolve() for name in names if name]


def _check_writable(path: str, field: str, inputs: list = ()) -> None:
    """Refuse an output path that cannot be written, before the work that fills it: one of the
    command's ``inputs`` (the plan would replace it), a folder, a missing or read-only folder, a name
    without .yaml/.json. A probe file is created and removed."""
    target = Path(path)
    if target.resolve() in inputs:
        raise InputError("is one of this command's inputs, which the plan would replace: name another file; "
                         "nothing was written", source=path, field=field)
    if target.is_dir():
        raise InputError(f"is a folder: name a file in it, e.g. {target / 'plan.yaml'}", source=path, field=field)
    if target.suffix.lower() not in PLAN_SUFFIXES:
        raise InputError(f"unknown extension {target.suffix or '(none)'}: name the file .yaml or .json",
                         source=path, field=field)
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise InputError(f"its folder {folder} does not exist: create it first", source=path, field=field)
    try:
        handle, probe = tempfile.mkstemp(dir=folder, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as error:
        raise InputError(f"cannot write in {folder} ({error.strerror or error.__class__.__name__}): "
                         "choose a writable folder", source=path, field=field) from None
    os.close(handle)
    os.unlink(probe)


def _write_output(document: dict, path: str, field: str) -> None:
    """Write the plan; a failure (full disk, folder made read-only meanwhile) is one line, and the
    atomic writer leaves neither a half file nor its temporary behind."""
    from planner.plan.document import write_plan

    try:
        write_plan(document, path)
    except OSError as error:
        raise InputError(f"cannot write it ({error.strerror or error.__class__.__name__}): free space or "
                         "choose another path; nothing was written", source=path, field=field) from None


def _make(args) -> int:
    started = time.perf_counter()  # --time-limit counts from here: imports, reading, search, report, output
    if args.from_plan:
        return _replan(args)
    for flag, value in (("--move-weight", args.move_weight), ("--lost", args.lost), ("--added", args.added)):
        if value is not None:
            raise InputError("belongs to a re-plan: add --from OLD_PLAN or drop it", field=flag)
    from planner.inputs.job import load_job
    from planner.inputs.model import MAX_VIRTUAL_STAGES, MAX_WARMUP_DEPTH
    from planner.plan.document import plan_to_document
    from planner.report.text import render_plan
    from planner.search.front import SearchOptions, search
    from planner.search.no_plan import BudgetKnob

    overrides = {"global_batch": _positive("--global-batch", args.global_batch),
                 "micro_batch_size": _positive("--micro-batch-size", args.micro_batch_size), "schedule": args.schedule,
                 "sync_every": _sync_every(args.sync_every), "sync_groups": _sync_groups(args.sync_groups),
                 "virtual_stages": _whole_or_auto("--virtual-stages", args.virtual_stages, MAX_VIRTUAL_STAGES),
                 "warmup_depth": _whole_or_auto("--warmup-depth", args.warmup_depth, MAX_WARMUP_DEPTH),
                 "micro_batches_per_round": _non_negative_or_none("--micro-batches-per-round",
                                                                   args.micro_batches_per_round),
                 **_compression_overrides(args)}
    _finite_positive("--time-limit", args.time_limit)
    _non_negative("--seed", args.seed)
    if args.output:
        _check_writable(args.output, "--output", _inputs(args))
    objective = _objective(args)
    pareto_files = _pareto_files(args) if args.pareto else []
    job = load_job(args.topology, model=args.model, model_file=args.model_file, training_overrides=overrides)
    record = {}
    if args.calibration:
        from planner.inputs.calibration import apply_calibration, calibration_record, read_calibration

        calibration = read_calibration(args.calibration)
        types = sorted({d.type_name for d in job.topology.devices})
        if calibration.device_types and not set(calibration.device_types) & set(types):
            raise InputError(f"measured {', '.join(sorted(calibration.device_types))}, which {args.topology} does not "
                             f"have (its types: {', '.join(types)}): run 'plan calibrate {args.topology}' on that "
                             "cluster, or leave --calibration out", source=args.calibration, field="device_types")
        job = dataclasses.replace(job, topology=apply_calibration(job.topology, calibration))
        record = calibration_record(calibration)
    if args.budget is not None and args.objective == "dtfm":
        raise InputError("sizes the placement search's work; DTFM's allocation search is sized by --time-limit: "
                         "drop --budget or use another --objective", field="--budget")
    search_s = args.time_limit * (1.0 - WHY_SHARE - OUTPUT_SHARE)  # the report and the output get the rest
    options = SearchOptions(seed=args.seed, budget_s=_finite_positive("--budget", args.budget) or search_s,
                            budget_knob=BudgetKnob.TIME_LIMIT if args.budget is None else BudgetKnob.BUDGET,
                            time_limit_s=max(search_s - (time.perf_counter() - started), 0.0),
                            stages=_positive("--stages", args.stages), replicas=_positive("--replicas", args.replicas),
                            exact=not args.no_exact, tensor_degrees=tuple(args.tensor_degrees))
    args.report_deadline = started + args.time_limit * (1.0 - OUTPUT_SHARE)
    progress = _Progress(args.time_limit)
    try:
        result = search(job.topology, job.model, job.training, options, objective=objective, callback=progress)
    except InputError as error:  # no plan for this file's devices and these options: name the file
        raise error.located(source=args.topology) from None
    finally:
        progress.close()
    plan = result.plan
    if record:
        plan = dataclasses.replace(plan, calibration=record)
        result = dataclasses.replace(result, plan=plan)
    job = dataclasses.replace(job, training=result.training)  # the precision the plan runs in
    document = plan_to_document(plan, model=job.model, training=job.training, topology_source=args.topology)
    if args.output:
        _write_output(document, args.output, "--output")
    if args.format == "json":
        print(json.dumps(document, indent=2))
    else:
        print(render_plan(plan, job.topology, job.model, job.training, result=result))
        if args.objective == "dtfm":
            s = plan.search
            print(f"DTFM objective: {s['dtfm_cost_s']:.3f} s (COST_DP {s['dtfm_dp_s']:.3f} s + 2 x COST_PP "
                  f"{s['dtfm_pp_s']:.3f} s), {s['dtfm_evaluations']} allocations in {s['dtfm_wall_s']:.2f} s")
        if args.output:
            print(f"\nPlan written to {args.output}")
    _print_choices(args, result, job, objective, pareto_files)
    return 0


def _objective(args):
    """The objective the flags ask for, or the one-line error of a flag that does not fit it."""
    from planner.search.objective import make_objective

    _finite_positive("--budget-usd-per-iteration", args.budget_usd_per_iteration, unit="US dollars")
    _positive("--top", args.top)
    compares = args.pareto or args.top
    if compares and args.objective == "dtfm":
        raise InputError("compares plans in time and dollars: use --objective time, cost or time-under-budget",
                         field="--pareto" if args.pareto else "--top")
    return make_objective(args.objective, budget_usd_per_iteration=args.budget_usd_per_iteration,
                          charge_idle=args.charge_idle, pooled=bool(compares))


def _pareto_files(args) -> list:
    """The name pattern of the front's plan files, ``PLAN-pareto-K.yaml``, checked writable up front."""
    base = Path(args.output) if args.output else Path("plan.yaml")
    pattern = str(base.with_name(f"{base.stem}-pareto-{{}}{base.suffix or '.yaml'}"))
    _check_writable(pattern.format(1), "--pareto")
    front = re.compile(re.escape(str(Path(pattern).resolve())).replace(re.escape("{}"), "[0-9]+"))
    taken = next((p for p in _inputs(args) if front.fullmatch(str(p))), None)
    if taken:  # the front's K-th file would replace an input
        raise InputError(f"would write the front's plans as {pattern.format('K')}, and {taken} is one of this "
                         "command's inputs: name the plan file otherwise with -o; nothing was written",
                         source=str(taken), field="--pareto")
    return [pattern]


def _print_choices(args, result, job, objective, pareto_files) -> None:
    """Why devices are idle and what binds, the plan's price, the time / $ front (written to files)
    and the K best, where asked."""
    from planner.plan.document import plan_to_document
    from planner.report.choices import render_dollars, render_entries
    from planner.search.dollars import plan_dollars
    from planner.search.front import _resolved_training
    from planner.search.pareto import pareto_front, top_plans

    charge_idle = args.charge_idle
    text = args.format == "text"
    if text:
        from planner.report.why import render_why

        price = None
        if args.objective in ("cost", "time-under-budget"):  # an idle device may be idle for its price
            price = lambda plan: plan_dollars(plan, job.topology, job.model, job.training,
                                              charge_idle=charge_idle).usd_per_iteration
        print("\n" + render_why(result.plan, job.topology, job.model, job.training, dollars=price,
                                 budget_s=max(args.report_deadline - time.perf_counter(), 0.0),
                                 pinned=(args.stages, args.replicas)))
    priced = all(d.price_per_hour_usd is not None for d in job.topology.devices)
    if text and priced and args.objective != "dtfm":
        dollars = plan_dollars(result.plan, job.topology, job.model, job.training, charge_idle=charge_idle)
        print("\n" + render_dollars(dollars, job.topology, charge_idle=charge_idle))
    if args.pareto:
        front = pareto_front(result.pool)
        files = []
        for k, entry in enumerate(front, 1):
            training, plan = _resolved_training(entry.plan, job.topology, job.model, entry.training)
            d = entry.dollars
            plan = dataclasses.replace(plan, search={
                "front": {"rank": k, "of": len(front), "charge_idle": charge_idle},
                "usd_per_iteration": d.usd_per_iteration, "usd_per_million_tokens": d.usd_per_million_tokens,
                "device_usd": d.device_usd, "egress_usd": d.egress_usd, "egress_bytes": d.egress_bytes})
            path = pareto_files[0].format(k)
            _write_output(plan_to_document(plan, model=job.model, training=training, topology_source=args.topology),
                          path, "--pareto")
            files.append(path)
        out = sys.stdout if text else sys.stderr
        print("\n" + render_entries(front, job.topology, f"Time / $ front: {len(front)} of {len(result.pool)} distinct "
                                    "plans that no other plan beats in both", files=files), file=out)
    if args.top:
        best = top_plans(result.pool, args.top, objective)
        print("\n" + render_entries(best, job.topology, f"The {len(best)} best of {len(result.pool)} distinct plans by "
                                    f"{objective.name} (distinct: other degrees or another device set)"),
              file=sys.stdout if text else sys.stderr)


def _replan(args) -> int:
    """``plan TOPOLOGY --from OLD_PLAN``: a plan for the changed cluster and the state it moves."""
    from planner.inputs.job import load_topology, topology_from_document
    from planner.plan.document import plan_to_document
    from planner.plan.precision import check_replan_precision
    from planner.report.text import render_moves, render_plan
    from planner.search.front import SearchOptions
    from planner.search.replan import DEFAULT_MOVE_WEIGHT, read_old_plan, replan

    for flag, value in (("--model", args.model), ("--model-file", args.model_file),
                        ("--global-batch", args.global_batch), ("--sync-every", args.sync_every),
                        ("--sync-groups", args.sync_groups),
                        ("--virtual-stages", args.virtual_stages), ("--warmup-depth", args.warmup_depth),
                        ("--micro-batches-per-round", args.micro_batches_per_round),
                        ("--compress-messages", args.compress_messages),
                        ("--compress-gradients", args.compress_gradients), ("--powersgd-rank", args.powersgd_rank),
                        ("--sync", args.sync)):
        if value is not None:
            raise InputError("a re-plan keeps the old plan's model and training: drop it", field=flag)
    if args.objective != "time":
        raise InputError("a re-plan minimises iteration time plus the move's: drop --objective", field="--objective")
    _finite_positive("--time-limit", args.time_limit)
    _finite_positive("--move-weight", args.move_weight, unit="iterations")
    _non_negative("--seed", args.seed)
    if args.output:
        _check_writable(args.output, "--output", _inputs(args))
    old, model, training = read_old_plan(args.from_plan)
    topology = load_topology(args.topology)
    changed, topology_source = None, args.topology
    if args.lost or args.added:
        changed, topology_source = _changed_cluster(args, old, topology)
        topology = topology_from_document(changed, topology_source)
    topology, record = _replan_calibration(args, old, topology)
    try:
        check_replan_precision(topology, training, args.from_plan)
    except InputError as error:
        raise error.located(source=args.topology) from None
    options = SearchOptions(seed=args.seed, time_limit_s=args.time_limit, exact=not args.no_exact,
                            budget_s=_finite_positive("--budget", args.budget),
                            stages=_positive("--stages", args.stages), replicas=_positive("--replicas", args.replicas))
    progress = _Progress(args.time_limit)
    try:
        result = replan(old, topology, model, training, options, callback=progress,
                        move_weight=DEFAULT_MOVE_WEIGHT if args.move_weight is None else args.move_weight)
    except InputError as error:
        raise error.located(source=args.topology) from None
    finally:
        progress.close()
    result = dataclasses.replace(result, plan=dataclasses.replace(result.plan, calibration=record))
    document = plan_to_document(result.plan, model=model, training=result.training, topology_source=topology_source)
    if args.output:
        if changed is not None:
            _write_output(changed, topology_source, "--output")
        _write_output(document, args.output, "--output")
    if args.format == "json":
        print(json.dumps(document, indent=2))
    else:
        print(render_plan(result.plan, topology, model, result.training))
        print("\n" + render_moves(result, args.from_plan))
        if changed is not None:
            print(f"\nThe changed cluster: {topology_source}")
        if args.output:
            print(f"\nPlan written to {args.output}")
    return 0


def _replan_calibration(args, old, topology) -> tuple:
    """(topology, the new plan's calibration record) of a re-plan (``replan_calibration``): a changed
    or missing old calibration says ``--calibration`` may name the one to use."""
    from planner.inputs.calibration import replan_calibration

    try:
        return replan_calibration(topology, old.calibration, args.from_plan, args.calibration)
    except InputError as error:
        if args.calibration or error.field not in ("calibration.path", "calibration.sha256"):
            raise
        raise InputError(f"{error.detail}; or pass the calibration to use with --calibration",
                         source=error.source, field=error.field) from None


def _changed_cluster(args, old, topology) -> tuple:
    """(topology document, path to write it to) of OLD_PLAN's cluster (TOPOLOGY) after ``--lost`` and
    ``--added``: ``--output``'s path with ``.topology.yaml``, which the plan names so that ``plan
    launch`` finds the cluster; a relative calibration file the network names stays the same file."""
    from planner.io import read_yaml
    from planner.search.replan import changed_topology

    field = "--lost" if args.lost else "--added"
    if not args.output:
        raise InputError("writes the changed cluster beside the plan, which the plan names: add -o FILE",
                         field=field)
    if topology.sha256 != old.topology_sha256:
        raise InputError(f"with --lost or --added, TOPOLOGY is the cluster {args.from_plan} was planned on, but "
                         f"{args.topology} is another ({topology.name}): give that file, or give the changed cluster "
                         "as TOPOLOGY without --lost/--added", field=field)
    output = Path(args.output)
    path = output.with_name(output.stem + ".topology.yaml")
    if path.resolve() in _inputs(args):
        raise InputError(f"would write the changed cluster to {path}, one of this command's inputs: name the "
                         "plan file otherwise", source=args.output, field="--output")
    _check_writable(str(path), "--output")
    added = read_yaml(args.added) if args.added else None
    if added is not None and not isinstance(added, dict):
        raise InputError("expected a mapping with a 'devices' list", source=args.added, field="devices")
    document = changed_topology(read_yaml(args.topology), lost=tuple(args.lost or ()), added=added,
                                source=args.added or "--added")
    network = document.get("network")
    if isinstance(network, dict) and isinstance(network.get("calibration"), str) \
            and not Path(network["calibration"]).is_absolute():
        calibration = Path(args.topology).resolve().parent / network["calibration"]
        document = {**document, "network": {**network, "calibration": str(calibration)}}
    return document, str(path)


def _refuse_checkpoints_with_local_steps(args) -> None:
    """A checkpoint holds no outer snapshot or momentum of local steps: resuming would change the run."""
    flag = next((f for f, v in (("--checkpoint-every", args.checkpoint_every), ("--resume", args.resume),
                                ("--elastic", args.elastic)) if v), None)
    if flag is None:
        return
    from planner.plan.document import read_plan

    plan, _ = read_plan(args.plan)
    if plan.sync_every > 1:
        raise InputError(f"is {plan.sync_every} (local steps), whose outer snapshot and momentum checkpoints do not "
                         f"hold yet: drop {flag} or plan with --sync-every 1", source=args.plan, field="sync_every")


def _launch(args) -> int:
    from planner.runtime.launch import LaunchFailure, LaunchOptions, launch

    _non_negative("--seed", args.seed)
    _finite_positive("--timeout", args.timeout)
    _finite_positive("--time-scale", args.time_scale, unit="emulated seconds per plan second")
    _refuse_checkpoints_with_local_steps(args)
    options = LaunchOptions(iterations=args.iterations, warmup=args.warmup, out_dir=args.out, emulate=args.emulate,
                            time_scale=args.time_scale, seed=args.seed, learning_rate=args.lr,
                            timeout_s=args.timeout, backend=args.backend, topology=args.topology,
                            hostfile=args.hostfile, dry_run=args.dry_run, master_port=args.master_port,
                            save_state=args.save_state, compile=args.compile, checkpoint_every=args.checkpoint_every,
                            checkpoint_dir=args.checkpoint_dir, resume=args.resume, elastic=args.elastic,
                            slow=args.slow, profile=args.profile)
    try:
        results = launch(args.plan, options, log=lambda line: print(line, flush=True))
    except LaunchFailure as failure:
        print(f"plan: launch failed: {failure}", file=sys.stderr)
        return EXIT_FAILED
    if results is not None:
        print(_run_summary(results, args.out))
    return 0


def _run_summary(results: dict, folder: str) -> str:
    from planner.report.accuracy import prediction_error

    m, c, run = results["measured"], results["comparison"], results["run"]
    scale = (f" (emulated seconds: plan seconds x time scale {run['time_scale']:.4g})" if run["emulated"] else "")
    error = prediction_error(c["predicted_s"], c["measured_s"])
    lines = [f"measured: median {m['median_s']:.4f} s per iteration (p10 {m['p10_s']:.4f}, p90 {m['p90_s']:.4f}, "
             f"{len(m['iteration_s'])} iterations){scale}",
             f"predicted: {c['predicted_s']:.4f} s; prediction error (predicted - measured) / measured = "
             f"{100 * error:+.1f}%",
             f"throughput: {m['tokens_per_s']:,.0f} tokens/s, MFU {100 * m['mfu']:.1f}% "
             f"(plan's model and devices), final loss {m['loss'][-1]:.4f}"]
    peaks = {d: b for d, b in m["peak_memory_bytes"].items() if b is not None}
    if peaks:
        predicted = results["predicted"]["memory_bytes"]
        lines.append("peak memory: " + ", ".join(f"{d} {b / 1e9:.2f} GB (predicted {predicted[d] / 1e9:.2f})"
                                                for d, b in sorted(peaks.items())))
    if run.get("resumed_from"):
        lines.append(f"resumed from {run['resumed_from']['path']} at iteration {run['first_iteration']}")
    if run.get("checkpoints"):
        last = run["checkpoints"][-1]
        lines.append(f"checkpoints: {len(run['checkpoints'])} written, the last before iteration {last['iteration']} "
                     f"in {last['path']} ({last['seconds']:.2f} s)")
    for event in results.get("elastic", {}).get("events", []):
        plan = event["new_plan"]
        lines.append(f"elastic: {event['device']} lost ({event['failure']}); resumed from iteration "
                     f"{event['checkpoint_iteration']} under {event['plan']} ({plan['replicas']} replica(s) x "
                     f"{plan['stages']} stage(s)), {event['lost_s']:.1f} s of work redone, restarted "
                     f"{event.get('restarted_after_s', 0.0):.1f} s after the failure")
    lines.append(f"results: {folder}/results.json, Chrome trace: {folder}/trace.json")
    return "\n".join(lines)


def _calibrate(args) -> int:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise InputError("needs torch: pip install -e '.[runtime]'", field="plan calibrate")
    from planner.runtime.calibrate import CalibrateOptions, CalibrationFailure, calibrate

    if args.repeats < 1:
        raise InputError(f"must be at least 1, got {args.repeats}", field="--repeats")
    _check_writable(args.output, "--output", _inputs(args))
    options = CalibrateOptions(out=args.output, device_type=args.device_type,
                               processes=_positive("--processes", args.processes),
                               names=tuple(args.names.split(",")) if args.names else (), backend=args.backend,
                               repeats=args.repeats, model=args.model, compile=args.compile,
                               micro_batch_size=_positive("--micro-batch-size", args.micro_batch_size))
    try:
        document = calibrate(args.topology, options, log=lambda line: print(line, flush=True))
    except CalibrationFailure as failure:
        print(f"plan: calibration failed: {failure}", file=sys.stderr)
        return EXIT_FAILED
    for kind, entry in document["device_types"].items():
        m = entry["measured"]
        print(f"{kind}: efficiency {entry['efficiency']:.3f} ({m['achieved_flops'] / 1e12:.2f} of "
              f"{m['peak_flops'] / 1e12:.2f} TFLOP/s), optimizer memory bandwidth "
              f"{entry['memory_bandwidth_bytes_per_s'] / 1e9:.1f} GB/s")
    network = document.get("network")
    if network:
        for i, a in enumerate(network["devices"]):
            for j, b in enumerate(network["devices"]):
                if i != j:
                    print(f"{a} -> {b}: latency {network['latency_s'][i][j] * 1e6:.1f} us, "
                          f"bandwidth {network['bandwidth_bytes_per_s'][i][j] / 1e9:.2f} GB/s")
    print(f"calibration written to {args.output}")
    return 0


def _plot(args) -> int:
    from pathlib import Path

    from planner.report.plot import plot_accuracy, plot_loss, plot_memory, plot_timeline
    from planner.runtime.results import read_results

    runs = [(Path(folder).name or str(folder), read_results(folder)) for folder in args.runs]
    labels = [label for label, _ in runs]
    if len(set(labels)) != len(labels):
        raise InputError("two run folders share a name: give each run its own folder name", field="runs")
    figures = {f.strip() for f in args.figures.split(",") if f.strip()}
    unknown = sorted(figures - {"accuracy", "timeline", "memory", "loss"})
    if unknown or not figures:
        raise InputError(f"unknown figure {unknown[0] if unknown else '(none)'}: use accuracy, timeline, memory, "
                         "loss", field="--figures")
    out = Path(args.out)
    if not out.parent.is_dir():  # as -o: the folder for the figures may be new, the one holding it not
        raise InputError(f"its parent folder {out.parent} does not exist: create it first, or name another folder",
                         field="--out")
    written = plot_accuracy(runs, out / "accuracy", title=args.title) if "accuracy" in figures else []
    written += plot_loss(runs, out / "loss") if "loss" in figures else []
    for label, results in runs:
        if "timeline" in figures and results["measured"].get("trace") and results["predicted"].get("trace"):
            written += plot_timeline(results, out / f"timeline-{label}", label=label)
        if "memory" in figures:
            written += plot_memory(results, out / f"memory-{label}", label=label)
    for path in written:
        print(path)
    return 0


def main(argv: list | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = _parse(argv)
        commands = {"make": _make, "launch": _launch, "calibrate": _calibrate, "plot": _plot}
        code = commands[args.command](args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return code
    except InputError as error:
        print(f"plan: error: {error}", file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt:
        print("plan: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of stdout went away (``plan TOPO | head``): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # as the Python docs advise on SIGPIPE
        return 141


if __name__ == "__main__":
    raise SystemExit(main())
