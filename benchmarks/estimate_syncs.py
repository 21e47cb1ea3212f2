"""The search's estimate against the simulator for each gradient sync algorithm on random
placements over hosts, shared NICs and regions, before and after a change.

    python benchmarks/estimate_syncs.py --before REV [--seeds 40] [--workers 2]

Each instance (seeded): 4-16 hosts of 2-8 A100-80GB each, in 1-5 regions (each pair of regions
5-80 ms and 1-25 Gbit/s, inside a region 0.1 ms and 25 or 100 Gbit/s, inside a host 2,400 Gbit/s),
a shared NIC of 10, 25 or 100 Gbit/s per host on 60% of them; 1-3 stages x 2 or more replicas of
randomly chosen devices, GPT-3 XL, micro-batch 1, 8 micro-batches a replica, 1F1B, the optimizer
state not sharded (so every algorithm runs as itself). For each of ring, hierarchical,
parameter-server and sharded: the estimate of that placement (``evaluate.evaluate_placement``, its
splits chosen by the estimate) and the simulator's iteration of the plan it becomes
(``plans.candidate_to_plan``: the ring order, the parameter servers). Each tree (the planner at git
revision ``REV``, ``git archive``, and this one) runs in its own process. Prints per algorithm the
median, largest and least ``estimate / simulated - 1`` and how many lie over +5% and under -5%,
and writes ``benchmarks/results/estimate_syncs.json``.
"""

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from structural_moves import ROOT, _extract  # noqa: E402

SYNCS = ("ring", "hierarchical", "parameter-server", "sharded")

_INSTANCES = """
import json, sys
import numpy as np
from planner.inputs.model import model_preset, parse_training
from planner.inputs.topology import parse_topology
from planner.prediction.predict import predict
from planner.search.evaluate import evaluate_placement, make_context
from planner.search.plans import candidate_to_plan
sync, seeds = sys.argv[1], int(sys.argv[2])
model = model_preset("gpt3-xl")
errors = []
for seed in range(seeds):
    rng = np.random.default_rng(seed)
    regions = int(rng.integers(1, 6))
    hosts, per = int(rng.integers(max(4, regions), 17)), int(rng.integers(2, 9))
    devices = [{"name": f"h{h}", "count": per, "type": "A100-80GB", "host": f"host{h}", "region": f"r{h % regions}"}
               for h in range(hosts)]
    pairs = [{"regions": [f"r{a}", f"r{b}"], "latency": f"{rng.uniform(5, 80):.1f}ms",
              "bandwidth": f"{rng.uniform(1, 25):.2f}Gbps"} for a in range(regions) for b in range(a + 1, regions)]
    network = {"host": {"latency": "0.01ms", "bandwidth": "2400Gbps"},
               "region": {"latency": "0.1ms", "bandwidth": f"{rng.choice([25, 100])}Gbps"},
               "global": {"latency": "100ms", "bandwidth": "1Gbps"}, "region_pairs": pairs}
    if rng.random() < 0.6:
        network["nic"] = f"{rng.choice([10, 25, 100])}Gbps"
    topology = parse_topology({"name": "random", "devices": devices, "network": network}, name="random")
    n = topology.size
    S = int(rng.integers(1, min(3, n) + 1))
    R = min(int(rng.integers(2, max(3, n // S + 1))), n // S)
    assign = rng.permutation(n)[:S * R].reshape(R, S)
    training = parse_training({"global_batch": 8 * R, "micro_batch_size": 1, "precision": "bf16", "sync": sync,
                               "shard_optimizer": False})
    ctx = make_context(topology, model, training)
    candidate = evaluate_placement(ctx, assign, 1, "1f1b")
    if candidate is None:
        continue
    simulated = predict(candidate_to_plan(ctx, candidate), topology, model, training)[0].iteration_s
    errors.append(candidate.score_s / simulated - 1.0)
print(json.dumps(errors))
"""


def _run(task: tuple) -> dict:
    label, tree, sync, seeds = task
    done = subprocess.run([sys.executable, "-c", _INSTANCES, sync, str(seeds)],
                          env={**os.environ, "PYTHONPATH": str(tree)}, cwd=str(tree), capture_output=True, text=True)
    row = {"search": label, "sync": sync}
    if done.returncode != 0:
        return {**row, "error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    return {**row, "errors": json.loads(done.stdout.strip().splitlines()[-1])}


def _summary(row: dict) -> str:
    if "error" in row:
        return row["error"][:60]
    e = 100 * np.array(row["errors"])
    return (f"median {np.median(e):+5.1f}% max {e.max():+6.1f}% min {e.min():+6.1f}% "
            f"over 5%: {(e > 5).sum():2d} under -5%: {(e < -5).sum():2d} ({len(e)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="git revision of the planner to compare with")
    parser.add_argument("--seeds", type=int, default=40)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--output", default=str(ROOT / "benchmarks" / "results" / "estimate_syncs.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as before_tree:
        before_commit = _extract(args.before, before_tree)
        tasks = [(label, tree, sync, args.seeds) for sync in SYNCS
                 for label, tree in (("before", before_tree), ("after", ROOT))]
        with multiprocessing.Pool(args.workers) as pool:
            rows = pool.map(_run, tasks)
    for before, after in zip(rows[::2], rows[1::2]):
        print(f"{after['sync']:16}  before: {_summary(before)}\n{'':16}  after:  {_summary(after)}")
    Path(args.output).write_text(json.dumps({
        "command": "python benchmarks/estimate_syncs.py " + " ".join(sys.argv[1:]), "before_commit": before_commit,
        "seeds": args.seeds, "rows": rows}, indent=1) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
