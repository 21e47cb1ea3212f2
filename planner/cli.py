"""``plan``: a thin dispatcher over library functions. Bad input: one line, exit code 2."""

import argparse
import json
import sys

from planner.errors import InputError

__all__ = ["main"]

EXIT_INPUT = 2


def _plan_parser(sub) -> None:
    p = sub.add_parser("make", help="plan a topology (the default command)")
    p.add_argument("topology", help="topology YAML file")
    p.add_argument("--model", help="model preset name (overrides the file's model section)")
    p.add_argument("--model-file", help="model YAML file")
    p.add_argument("--global-batch", type=int, help="global batch in sequences")
    p.add_argument("--micro-batch", type=int, help="micro-batch size in sequences (default: searched)")
    p.add_argument("--schedule", choices=["1f1b", "gpipe", "auto"], help="pipeline schedule")
    p.add_argument("--stages", type=int, help="pin the number of pipeline stages")
    p.add_argument("--replicas", type=int, help="pin the number of data-parallel replicas")
    p.add_argument("--seed", type=int, default=0, help="random seed (same seed, same plan)")
    p.add_argument("--time-limit", type=float, default=30.0, help="search time limit in seconds")
    p.add_argument("-o", "--output", help="write the plan to FILE (.yaml or .json)")
    p.add_argument("--format", choices=["text", "json"], default="text", help="what to print")


def _parse(argv: list) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="plan", description="Plan training on heterogeneous devices.")
    sub = parser.add_subparsers(dest="command")
    _plan_parser(sub)
    commands = {"make"}
    if argv and argv[0] not in commands and not argv[0].startswith("-"):
        argv = ["make"] + argv
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        print("\n  plan TOPOLOGY [options]   (same as 'plan make'; 'plan make -h' lists the options)")
        raise SystemExit(0)
    return parser.parse_args(argv)


def _positive(name: str, value):
    if value is not None and value < 1:
        raise InputError(f"must be at least 1, got {value}", field=name)
    return value


def _make(args) -> int:
    from planner.job import load_job
    from planner.plan import plan_to_document, write_plan
    from planner.report import render_plan
    from planner.search.front import SearchOptions, search

    overrides = {"global_batch": _positive("--global-batch", args.global_batch),
                 "micro_batch": _positive("--micro-batch", args.micro_batch), "schedule": args.schedule}
    if args.time_limit <= 0:
        raise InputError(f"must be positive, got {args.time_limit}", field="--time-limit")
    job = load_job(args.topology, model=args.model, model_file=args.model_file, training_overrides=overrides)
    options = SearchOptions(seed=args.seed, time_limit_s=args.time_limit,
                            stages=_positive("--stages", args.stages), replicas=_positive("--replicas", args.replicas))
    result = search(job.topology, job.model, job.training, options)
    document = plan_to_document(result.plan, model=job.model, training=job.training, topology_source=args.topology)
    if args.output:
        write_plan(document, args.output)
    if args.format == "json":
        print(json.dumps(document, indent=2))
    else:
        print(render_plan(result.plan, job.topology, job.model, job.training, result=result))
        if args.output:
            print(f"\nPlan written to {args.output}")
    return 0


def main(argv: list | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = _parse(argv)
        return {"make": _make}[args.command](args)
    except InputError as error:
        print(f"plan: error: {error}", file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt:
        print("plan: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
