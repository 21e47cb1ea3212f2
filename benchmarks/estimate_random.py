"""The search's estimate against the simulator on random pipelines, before and after a change to
the estimate: the one placement each instance names, its splits chosen by the estimate.

    python benchmarks/estimate_random.py --before REV [--seeds 40] [--workers 2]

Each instance (seeded): 3-6 stages x 1-2 replicas of A100s, every pair of devices its own link
(0.1-80 ms, 25/100/400 Gbit/s, symmetric), micro-batch 1, warm-up depths 1, 2 and 3. The grid:
the models ``small`` (compute negligible beside the links) and ``gpt3-xl``, global batches of 64-256
or of 8-32 sequences (fewer micro-batches than the windows hold), one round or rounds of 8
micro-batches, 1F1B and ZB-H1. Each tree (the planner at git revision ``REV``, ``git archive``,
and this one) runs in its own processes. Prints per grid row the median, largest and least
``estimate / simulated - 1`` and how many lie over +15% and under -15%, and writes
``benchmarks/results/estimate_random.json``.
"""

import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tree_errors import errors_in_trees, summary, tree_arguments, write_rows  # noqa: E402

_INSTANCES = """
import json, sys
import numpy as np
from planner.inputs.model import model_preset, parse_training
from planner.inputs.topology import parse_topology
from planner.prediction.predict import predict
from planner.search.evaluate import evaluate_placement, make_context
from planner.search.plans import candidate_to_plan
model_name, batches, per_round, schedule, seeds = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
model = model_preset(model_name)
errors = []
for seed in range(seeds):
    rng = np.random.default_rng(100 + seed)
    S, R = int(rng.integers(3, 7)), int(rng.integers(1, 3))
    global_batch = int(rng.choice([int(b) for b in batches.split(",")]))
    n = S * R
    latency = rng.uniform(0.1, 80.0, (n, n)); latency = (latency + latency.T) / 2; np.fill_diagonal(latency, 0.0)
    bandwidth = rng.choice([25.0, 100.0, 400.0], (n, n)); bandwidth = np.maximum(bandwidth, bandwidth.T)
    types = rng.choice(["A100-80GB", "A100-40GB", "A100-80GB"], n)
    topology = parse_topology({"devices": [{"name": f"d{i}", "type": str(types[i]), "region": "r"} for i in range(n)],
                               "network": {"matrix": {"latency_unit": "ms", "bandwidth_unit": "Gbps",
                                                      "latency": latency.tolist(), "bandwidth": bandwidth.tolist()}}},
                              name="random")
    for depth in (1, 2, 3):
        asked = {"global_batch": global_batch, "micro_batch_size": 1, "schedule": schedule, "precision": "fp16",
                 "warmup_depth": depth}
        if per_round:
            asked["micro_batches_per_round"] = per_round
        training = parse_training(asked)
        ctx = make_context(topology, model, training)
        candidate = evaluate_placement(ctx, np.arange(n).reshape(R, S), 1, schedule)
        if candidate is None:
            continue
        simulated = predict(candidate_to_plan(ctx, candidate), topology, model, training)[0].iteration_s
        errors.append(candidate.score_s / simulated - 1.0)
print(json.dumps(errors))
"""

GRID = list(itertools.product(("small", "gpt3-xl"), ("64,128,256", "8,16,32"), (0, 8), ("1f1b", "zb-h1")))


def main() -> None:
    args = tree_arguments(__doc__.splitlines()[0], "estimate_random.json")
    cells = [({"model": model, "global_batches": batches, "micro_batches_per_round": per_round, "schedule": schedule},
              [model, batches, str(per_round), schedule, str(args.seeds)], None)
             for model, batches, per_round, schedule in GRID]
    before_commit, rows = errors_in_trees(args.before, _INSTANCES, cells, args.workers)
    for before, after in zip(rows[::2], rows[1::2]):
        label = (f"{after['model']:8} batch {after['global_batches']:10} rounds {after['micro_batches_per_round']} "
                 f"{after['schedule']:6}")
        print(f"{label}  before: {summary(before, 15)}\n{'':44}  after:  {summary(after, 15)}")
    write_rows(args, "estimate_random.py", before_commit, rows)


if __name__ == "__main__":
    main()
