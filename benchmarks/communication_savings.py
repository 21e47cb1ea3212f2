"""Less communication on slow links: predicted time per token with the best communication settings
against none, and emulated runs of both against their predictions.

    python benchmarks/communication_savings.py [--budget 5] [--seed 0] [--seconds 8] [--iterations 4]

1. Planned: for DTFM's worldwide case and the home GPUs, one search per setting, each with the same
   seed and work budget (``--budget``, seconds at ``planner.search.deadline``'s fixed rates, so the
   numbers do not depend on the machine's load while ``--time-limit`` leaves the clock out): none
   (every iteration synced, nothing compressed); int8 messages, PowerSGD and both, each switch on
   ``auto`` (``planner.search.front``: a search with it off and one with it on, each on half the
   budget, as ``plan --budget B --compress-messages auto`` runs; a switch stays on only where it
   pays); local steps ``sync_every`` H = 4 and 16 with ``sync_groups: auto``; and local steps with
   int8 messages. Local steps with PowerSGD are refused by the planner (local steps sync parameter
   deltas, not gradients); those rows carry its one-line refusal. A row is the plan's predicted
   iteration, tokens per iteration, seconds per token and per million tokens, and the bytes the
   workers send each other per token (``planner.prediction.predict.communication_bytes``, as the
   report's "Communication" line); the best row is the least time per token.
2. Emulated: on the ``-mini`` topologies of both (``topologies/emulated``: the same regions and links
   with fewer devices and a smaller batch, so that every device is a process of this host), the
   plans of "none", of the best setting and, on ``home-mini``, of the best local-steps setting, each
   searched with the same seed and budget, run by ``plan launch --emulate`` (``benchmarks/accuracy.py``'s
   path: the plan written with its prediction, each device and link emulated at ``--seconds`` per
   iteration); measured against predicted, target |error| <= 5%.

H > 1 and compression change the optimisation: these are speeds, not model quality. Prints the
tables and writes ``benchmarks/results/communication_savings.json`` (the runs under
``benchmarks/results/communication_savings/``).
"""

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.accuracy import _write  # noqa: E402
from benchmarks.compression import _row  # noqa: E402
from planner.errors import InputError  # noqa: E402
from planner.inputs.job import load_job  # noqa: E402
from planner.search.front import SearchOptions, search  # noqa: E402

# (planned topology, its emulated -mini version, whether a local-steps plan is emulated there whatever wins)
TOPOLOGIES = (("topologies/dtfm/case5-worldwide.yaml", "topologies/emulated/dtfm-case5-mini.yaml", False),
              ("topologies/hetero/home-consumer-gpus.yaml", "topologies/emulated/home-mini.yaml", True))
NONE = "none"
# (label, training changes); every row keeps the topology's other training fields.
SETTINGS = ((NONE, {}),
            ("int8 messages", {"compress_messages": "auto"}),
            ("PowerSGD", {"compress_gradients": "auto"}),
            ("int8 + PowerSGD", {"compress_messages": "auto", "compress_gradients": "auto"}),
            ("H=4", {"sync_every": 4, "sync_groups": "auto"}),
            ("H=16", {"sync_every": 16, "sync_groups": "auto"}),
            ("H=4 + int8", {"sync_every": 4, "sync_groups": "auto", "compress_messages": "auto"}),
            ("H=16 + int8", {"sync_every": 16, "sync_groups": "auto", "compress_messages": "auto"}),
            ("H=4 + PowerSGD", {"sync_every": 4, "sync_groups": "auto", "compress_gradients": "auto"}),
            ("H=16 + PowerSGD", {"sync_every": 16, "sync_groups": "auto", "compress_gradients": "auto"}))
TARGET_ERROR = 0.05  # |predicted - measured| / measured of the emulated runs


def plan_setting(job, changes: dict, options: SearchOptions):
    """(search result, training) of ``job`` searched with ``changes`` to its training; an
    ``InputError`` where the planner refuses the combination."""
    training = dataclasses.replace(job.training, **changes)  # TrainingSpec refuses what cannot combine
    return search(job.topology, job.model, training, options)


def setting_row(result, model) -> dict:
    """One searched plan: ``benchmarks/compression.py``'s row (iteration, tokens/s, seconds per million
    tokens, bytes per token, compression chosen, degrees) with the tokens of an iteration, the seconds
    per token and the local steps the plan runs."""
    plan = result.plan
    row = _row(result, model)
    tokens = plan.global_batch * model.sequence
    return {**row, "tokens_per_iteration": tokens, "seconds_per_token": row["iteration_s"] / tokens,
            "sync_every": plan.sync_every, "sync_groups": [list(g) for g in plan.sync_groups],
            "sync_groups_tried": plan.search.get("sync_groups_tried", {}),
            "clock_cut": plan.search.get("clock_cut", [])}


def settings_table(job, options: SearchOptions, settings=SETTINGS) -> dict:
    """Every setting of ``settings`` planned on ``job`` with ``options``: {"rows", "best", "best_over_none"}.
    A refused setting's row has ``refused`` (the planner's line) instead of numbers. ``best``: the label
    of the least seconds per token (the earlier setting on ties, none first)."""
    rows = []
    for label, changes in settings:
        started = time.perf_counter()
        try:
            result = plan_setting(job, changes, options)
        except InputError as error:
            rows.append({"setting": label, "changes": changes, "refused": str(error)})
            continue
        rows.append({"setting": label, "changes": changes, **setting_row(result, job.model),
                     "search_wall_s": round(time.perf_counter() - started, 2)})
    planned = [r for r in rows if "refused" not in r]
    none = next(r for r in planned if r["setting"] == NONE)
    best = min(planned, key=lambda r: r["seconds_per_token"])
    for r in planned:
        r["over_none"] = r["seconds_per_token"] / none["seconds_per_token"]
    return {"rows": rows, "best": best["setting"], "best_over_none": best["over_none"]}


def _local_best(table: dict) -> str | None:
    """The label of the fastest planned local-steps row (None if none was planned)."""
    local = [r for r in table["rows"] if "refused" not in r and r["changes"].get("sync_every", 1) > 1]
    return min(local, key=lambda r: r["seconds_per_token"])["setting"] if local else None


def emulate_setting(topology_path: str, label: str, changes: dict, options: SearchOptions, out: Path, *,
                    seconds: float, iterations: int, warmup: int) -> dict:
    """Plan ``topology_path`` with ``changes`` and run the plan emulated at about ``seconds`` of this host
    per iteration; the row of ``planner.report.accuracy.run_row`` with the setting, the plan's shape and
    compression, whether |error| <= ``TARGET_ERROR``, and the emulation's compute overrun."""
    from planner.report.accuracy import run_row
    from planner.runtime.launch import LaunchOptions, launch

    job = load_job(ROOT / topology_path)
    result = plan_setting(job, changes, options)
    run_job = dataclasses.replace(job, training=result.training)
    name = f"{job.topology.name}--{label.replace(' ', '').replace('+', '-').replace('=', '')}"
    path = _write(result.plan, run_job, topology_path, out / "plans" / f"{name}.yaml")
    scale = seconds / result.plan.prediction.iteration_s
    results = launch(path, LaunchOptions(iterations=iterations, warmup=warmup, out_dir=str(out / name), emulate=True,
                                         time_scale=scale, backend="gloo", seed=options.seed), log=lambda s: None)
    overrun = results.get("emulation", {}).get("compute_overrun", {})
    row = run_row(results, name)
    tokens = result.plan.global_batch * job.model.sequence
    return {**row, "setting": label, "changes": changes, "within_target": abs(row["error"]) <= TARGET_ERROR,
            "tokens_per_iteration": tokens, "predicted_seconds_per_token": row["predicted_s"] / tokens,
            "measured_seconds_per_token": row["measured_s"] / tokens,
            "sync_every": result.plan.sync_every, "compression": _row(result, job.model)["compression"],
            "compute_overrun_share": overrun.get("worst_share_of_iteration"),
            "compute_overrun_warning": bool(overrun.get("warning"))}


def _print_table(name: str, table: dict) -> None:
    print(f"\n{name}: best {table['best']}, {table['best_over_none']:.3f}x none's seconds per token")
    print(f"{'setting':<16} {'chosen':<16} {'S x R':>7} {'iteration s':>12} {'tokens/it':>10} {'us/token':>9} "
          f"{'s/Mtoken':>9} {'KiB/token':>10} {'vs none':>8}")
    for r in table["rows"]:
        if "refused" in r:
            print(f"{r['setting']:<16} refused: {r['refused']}")
            continue
        c = r["compression"]
        int8 = "int8" if c["boundaries"] is None else f"int8 {len(c['boundaries'])}/{r['stages'] - 1}"
        chosen = "+".join(k for k, on in ((int8, c["messages"] != "off"), (f"psgd r{c['rank']}", c["gradients"] != "off"),
                                          (f"H{r['sync_every']}", r["sync_every"] > 1)) if on) or "none"
        print(f"{r['setting']:<16} {chosen:<16} {r['stages']:>3} x {r['replicas']:<3} {r['iteration_s']:>12.3f} "
              f"{r['tokens_per_iteration']:>10} {1e6 * r['seconds_per_token']:>9.2f} "
              f"{r['seconds_per_million_tokens']:>9.1f} {r['bytes_per_token'] / 1024:>10.2f} {r['over_none']:>7.3f}x",
              flush=True)


def _write_report(report: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=float) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget", type=float, default=5.0, metavar="SECONDS", help="each search's work budget")
    parser.add_argument("--time-limit", type=float, default=300.0, help="each search's clock cap (kept out of the way)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=8.0,
                        help="each emulated plan runs at about this many seconds of this host per iteration "
                             "(raise it when a run warns of compute overrun)")
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--no-emulate", action="store_true", help="plan only")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "communication_savings.json"))
    args = parser.parse_args(argv)
    options = SearchOptions(seed=args.seed, time_limit_s=args.time_limit, budget_s=args.budget)
    settings = dict(SETTINGS)
    out = Path(args.out)
    runs_dir = out.with_suffix("")
    report = {"budget_s": args.budget, "time_limit_s": args.time_limit, "seed": args.seed,
              "note": "H > 1 and compression change the optimisation: speeds, not model quality",
              "planned": {}, "emulated": [],
              "emulated_best_over_none": {}}
    for topology_path, mini_path, local_steps in TOPOLOGIES:
        job = load_job(ROOT / topology_path)
        table = settings_table(job, options)
        report["planned"][job.topology.name] = {"topology": topology_path, **table}
        _print_table(job.topology.name, table)
        if args.no_emulate:
            continue
        labels = [NONE, table["best"]]
        if local_steps:
            labels.append(_local_best(table))
        emulated = {}
        for label in dict.fromkeys(l for l in labels if l is not None):
            row = emulate_setting(mini_path, label, settings[label], options, runs_dir, seconds=args.seconds,
                                  iterations=args.iterations, warmup=args.warmup)
            report["emulated"].append(row)
            emulated[label] = row
            print(f"emulated {row['label']:<36} {row['stages']} x {row['replicas']:<2} predicted "
                  f"{row['predicted_s']:8.3f} s  measured {row['measured_s']:8.3f} s  {100 * row['error']:+6.2f}%"
                  + ("" if row["within_target"] else "  (outside 5%)")
                  + ("  (compute overrun)" if row["compute_overrun_warning"] else ""), flush=True)
        best, none = emulated[table["best"]], emulated[NONE]
        report["emulated_best_over_none"][best["topology"]] = {
            "best": table["best"], "predicted": best["predicted_seconds_per_token"] / none["predicted_seconds_per_token"],
            "measured": best["measured_seconds_per_token"] / none["measured_seconds_per_token"]}
        _write_report(report, out)  # after each topology: a long run keeps what it measured
    _write_report(report, out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
