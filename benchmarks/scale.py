"""Search at scale: generated heterogeneous topologies of 64 to 16,384 devices.

    python benchmarks/scale.py [--sizes 64 256 1024 4096] [--time-limit 60]
    python benchmarks/scale.py --command [--sizes 1024 4096 16384] [--time-limit 30] [--budget S]

Each topology has regions of 8-GPU hosts of mixed types (H100, A100-80GB, A100-40GB, V100-32GB,
RTX-4090), NVLink inside a host, 100 Gbit/s inside a region and seeded random 1-10 Gbit/s,
20-150 ms links between regions; GPT-3 6.7B, two sequences per device per iteration. Prints wall
time, predicted iteration time, bound and gap, and writes ``benchmarks/results/scale.json``.

``--command`` runs the whole ``plan`` command instead (reading the file, search, why-idle report,
plan written), one process per size under ``/usr/bin/time -v``, with a shared 100 Gbit/s NIC per
host: its wall time, overrun past the limit, CPU time and peak resident memory, the plan and the
phases the clock cut; it writes ``benchmarks/results/scale_command.json``.
"""

import argparse
import json
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.inputs.model import model_preset, parse_training  # noqa: E402
from planner.search.front import SearchOptions, search  # noqa: E402
from planner.inputs.topology import parse_topology  # noqa: E402

TYPES = ("H100-SXM", "A100-80GB", "A100-40GB", "V100-32GB", "RTX-4090")


def generated_topology(devices: int, *, seed: int = 0) -> dict:
    """A topology document: ``devices`` GPUs on 8-GPU hosts, about 16 hosts per region."""
    rng = np.random.default_rng(seed)
    hosts = devices // 8
    regions = max(2, hosts // 16)
    entries = []
    for h in range(hosts):
        region = f"region{h % regions}"
        kind = TYPES[(h * 7 + h // regions) % len(TYPES)]
        entries.append({"name": f"h{h}-{kind.lower()}", "count": 8, "type": kind, "host": f"host{h}",
                        "region": region})
    pairs = []
    for a in range(regions):
        for b in range(a + 1, regions):
            pairs.append({"regions": [f"region{a}", f"region{b}"], "latency": f"{rng.uniform(20, 150):.1f}ms",
                          "bandwidth": f"{rng.uniform(1, 10):.2f}Gbps"})
    return {"name": f"generated-{devices}", "devices": entries,
            "network": {"host": {"latency": "0.01ms", "bandwidth": "2400Gbps"},
                        "region": {"latency": "0.1ms", "bandwidth": "100Gbps"},
                        "global": {"latency": "100ms", "bandwidth": "1Gbps"}, "region_pairs": pairs}}


def _command_row(n: int, time_limit: float, budget: float | None, folder: Path) -> dict:
    """One ``plan`` process on the generated topology of ``n`` devices, measured from outside."""
    import yaml

    document = generated_topology(n)
    document["network"]["nic"] = "100Gbps"
    document["model"] = "gpt3-6.7b"
    document["training"] = {"global_batch": 2 * n, "micro_batch_size": 1, "precision": "auto", "recompute": True,
                            "flash_attention": True}
    path, plan_path = folder / f"generated-{n}.yaml", folder / f"plan-{n}.json"
    path.write_text(yaml.safe_dump(document))
    command = ["/usr/bin/time", "-v", sys.executable, "-m", "planner", str(path), "--time-limit", str(time_limit),
               "-o", str(plan_path)] + (["--budget", str(budget)] if budget else [])
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{n} devices: plan exited {done.returncode}: {done.stderr[-2000:]}")

    def measured(label: str) -> float:
        return float(re.search(rf"{re.escape(label)}: ([0-9.]+)", done.stderr).group(1))

    search = json.loads(plan_path.read_text())["search"]
    plan = json.loads(plan_path.read_text())
    return {"devices": n, "time_limit_s": time_limit, "budget_s": budget, "wall_s": wall, "overrun_s": wall - time_limit,
            "cpu_s": measured("User time (seconds)") + measured("System time (seconds)"),
            "peak_rss_mb": measured("Maximum resident set size (kbytes)") / 1024, "search_wall_s": search["wall_s"],
            "stages": len(plan["stages"]), "replicas": len(plan["replicas"]), "predicted_s": search["objective_s"],
            "clock_cut": search["clock_cut"], "evaluations": search["evaluations"],
            "simulation_wall_s": search.get("simulation_wall_s")}


def _command(args) -> int:
    rows = []
    print(f"{'devices':>7} {'limit s':>7} {'wall s':>7} {'overrun s':>9} {'cpu s':>6} {'peak RSS MB':>11} "
          f"{'S x D':>9} {'predicted s':>11}  clock cut")
    with tempfile.TemporaryDirectory() as folder:
        for n in args.sizes:
            row = _command_row(n, args.time_limit, args.budget, Path(folder))
            rows.append(row)
            print(f"{n:7d} {args.time_limit:7.1f} {row['wall_s']:7.1f} {row['overrun_s']:+9.1f} {row['cpu_s']:6.1f} "
                  f"{row['peak_rss_mb']:11.0f} {row['stages']:>4} x {row['replicas']:<4} {row['predicted_s']:11.2f}  "
                  f"{','.join(row['clock_cut']) or '-'}", flush=True)
    out = args.out or str(ROOT / "benchmarks" / "results" / "scale_command.json")
    Path(out).write_text(json.dumps({"machine": platform.platform(), "cpus": __import__("os").cpu_count(),
                                     "rows": rows}, indent=1) + "\n")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024, 4096])
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--command", action="store_true", help="measure the whole plan command per size")
    parser.add_argument("--budget", type=float, help="with --command: the plan command's --budget")
    parser.add_argument("--out", help="default: benchmarks/results/scale.json (scale_command.json with --command)")
    args = parser.parse_args()
    if args.command:
        return _command(args)
    args.out = args.out or str(ROOT / "benchmarks" / "results" / "scale.json")
    model = model_preset("gpt3-6.7b")
    rows = []
    print(f"{'devices':>7} {'wall s':>7} {'S x D':>8} {'used':>5} {'predicted s':>11} {'bound s':>8} {'gap':>6} "
          f"{'evaluations':>11}")
    for n in args.sizes:
        topology = parse_topology(generated_topology(n), name=f"generated-{n}")
        training = parse_training({"global_batch": 2 * n, "micro_batch_size": 1, "precision": "auto",
                                   "recompute": True, "flash_attention": True})
        started = time.perf_counter()
        result = search(topology, model, training, SearchOptions(seed=0, time_limit_s=args.time_limit))
        wall = time.perf_counter() - started
        plan = result.plan
        row = {"devices": n, "wall_s": wall, "stages": plan.stages, "replicas": plan.replicas,
               "used": plan.stages * plan.replicas, "predicted_s": result.predicted_s,
               "lower_bound_s": result.lower_bound_s, "gap": result.gap, "evaluations": result.evaluations}
        rows.append(row)
        print(f"{n:7d} {wall:7.1f} {plan.stages:>3} x {plan.replicas:<3} {row['used']:5d} {result.predicted_s:11.2f} "
              f"{result.lower_bound_s:8.2f} {100 * result.gap:5.1f}% {result.evaluations:11d}", flush=True)
    Path(args.out).write_text(json.dumps({"rows": rows, "time_limit_s": args.time_limit}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
