"""Compression on slow-link topologies: predicted time per token with the best compression settings
against none.

    python benchmarks/compression.py [--time-limit 5] [--seed 0]

For each topology, one row per setting: the plan searched without compression (today's default),
and searched with each compression switch on ``auto`` (``planner.search.front``: a search with the
switch off and one with it on, the second started from the first's plan compressed, and the faster
plan; a switch stays on only where the cost model says it pays). An ``auto`` row runs two searches
on halves of its limit, so it gets twice ``--time-limit``: each of its searches has the limit of
the row without compression (the search's result depends on its limit). Bytes per token are
what the workers send each other (``planner.prediction.predict.communication_bytes``, compressed
sizes). Compression is lossy and changes the optimisation: these are speeds, not model quality.
Prints a table and writes ``benchmarks/results/compression.json``.
"""

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.errors import InputError  # noqa: E402
from planner.inputs.job import load_job  # noqa: E402
from planner.prediction.predict import communication_bytes  # noqa: E402
from planner.search.front import SearchOptions, search  # noqa: E402

TOPOLOGIES = ("topologies/dtfm/case5-worldwide.yaml", "topologies/hetero/home-consumer-gpus.yaml",
              "topologies/hetero/h100-3090-homes.yaml")
# (label, training changes): none, then each switch on auto, then both
SETTINGS = (("off", {}),
            ("messages auto", {"compress_messages": "auto"}),
            ("gradients auto", {"compress_gradients": "auto"}),
            ("both auto", {"compress_messages": "auto", "compress_gradients": "auto"}))


def _row(result, model) -> dict:
    plan, prediction = result.plan, result.plan.prediction
    sent = communication_bytes(plan, model, result.training)
    return {"iteration_s": prediction.iteration_s, "tokens_per_s": prediction.tokens_per_s,
            "seconds_per_million_tokens": 1e6 / prediction.tokens_per_s,
            "pipeline_transfer_s": prediction.breakdown_s["pipeline_transfer_s"],
            "gradient_sync_s": prediction.breakdown_s["gradient_sync_s"], "bytes_per_token": sent["bytes_per_token"],
            "data_parallel_bytes_per_token": sent["data_parallel_bytes_per_token"],
            "compression": {"messages": str(plan.compression.messages), "gradients": str(plan.compression.gradients),
                            "rank": plan.compression.rank, "boundaries": plan.compression.boundaries},
            "stages": plan.stages, "replicas": plan.replicas, "devices_used": len(plan.used_devices)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--time-limit", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "compression.json"))
    args = parser.parse_args(argv)
    options = SearchOptions(seed=args.seed, time_limit_s=args.time_limit)
    rows = []
    print(f"{'topology':<20} {'setting':<15} {'chosen':<15} {'S x R':>7} {'iteration s':>12} {'s / Mtoken':>11} "
          f"{'speed-up':>9} {'KiB/token':>10}")
    for name in TOPOLOGIES:
        job = load_job(ROOT / name)
        base = None
        for label, changes in SETTINGS:
            training = dataclasses.replace(job.training, **changes)
            started = time.perf_counter()
            limit = args.time_limit * (2 if changes else 1)  # each of auto's two searches: the limit of "off"
            try:
                result = search(job.topology, job.model, training, dataclasses.replace(options, time_limit_s=limit))
            except InputError as error:
                rows.append({"topology": Path(name).stem, "setting": label, "error": str(error)})
                continue
            row = {"topology": Path(name).stem, "setting": label, **_row(result, job.model), "time_limit_s": limit,
                   "compression_tried": result.plan.search.get("compression_tried", {}),
                   "clock_cut": result.plan.search.get("clock_cut", []),
                   "search_wall_s": round(time.perf_counter() - started, 2)}
            base = base or row
            row["speed_up"] = base["seconds_per_million_tokens"] / row["seconds_per_million_tokens"]
            rows.append(row)
            c = row["compression"]
            int8 = "int8" if c["boundaries"] is None else f"int8 {len(c['boundaries'])}/{row['stages'] - 1}"
            chosen = "+".join(k for k, on in ((int8, c["messages"] != "off"),
                                              (f"powersgd r{c['rank']}", c["gradients"] != "off")) if on) or "none"
            print(f"{row['topology'][:20]:<20} {label:<15} {chosen:<15} {row['stages']:>3} x {row['replicas']:<3} "
                  f"{row['iteration_s']:>12.3f} {row['seconds_per_million_tokens']:>11.3f} {row['speed_up']:>8.2f}x "
                  f"{row['bytes_per_token'] / 1024:>10.2f}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"time_limit_s": args.time_limit, "seed": args.seed,
                               "settings": [label for label, _ in SETTINGS],
                               "note": "compression is lossy and changes the optimisation: speeds, not model quality",
                               "rows": rows}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
