"""The search's estimate against the simulator for each gradient sync algorithm on random
placements over hosts, shared NICs and regions, before and after a change.

    python benchmarks/estimate_syncs.py --before REV [--seeds 40] [--workers 2] [--no-nics]

Each instance (seeded): 4-16 hosts of 2-8 A100-80GB each, in 1-5 regions (each pair of regions
5-80 ms and 1-25 Gbit/s, inside a region 0.1 ms and 25 or 100 Gbit/s, inside a host 2,400 Gbit/s),
a shared NIC of 10, 25 or 100 Gbit/s per host on 60% of them; 1-3 stages x 2 or more replicas of
randomly chosen devices, GPT-3 XL, micro-batch 1, 8 micro-batches a replica, 1F1B, the optimizer
state not sharded (so every algorithm runs as itself). For each of ring, hierarchical,
parameter-server and sharded: the estimate of that placement (``evaluate.evaluate_placement``, its
splits chosen by the estimate) and the simulator's iteration of the plan it becomes
(``plans.candidate_to_plan``: the ring order, the parameter servers). The instances are drawn here
(``instance``) and handed to each tree (the planner at git revision ``REV``, ``git archive``, and
this one), which runs in its own process. Prints per algorithm the
median, largest and least ``estimate / simulated - 1`` and how many lie over +5% and under -5%,
and writes ``benchmarks/results/estimate_syncs.json``.
"""

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tree_errors import errors_in_trees, summary, tree_arguments, write_rows  # noqa: E402

SYNCS = ("ring", "hierarchical", "parameter-server", "sharded")

_ESTIMATES = """
import json, sys
from planner.inputs.model import model_preset, parse_training
from planner.inputs.topology import parse_topology
from planner.prediction.predict import predict
from planner.search.evaluate import evaluate_placement, make_context
from planner.search.plans import candidate_to_plan
import numpy as np
sync = sys.argv[1]
model = model_preset("gpt3-xl")
errors = []
for document, assign in json.loads(sys.stdin.read()):
    topology = parse_topology(document, name="random")
    assign = np.array(assign)
    training = parse_training({"global_batch": 8 * assign.shape[0], "micro_batch_size": 1, "precision": "bf16",
                               "sync": sync, "shard_optimizer": False})
    ctx = make_context(topology, model, training)
    candidate = evaluate_placement(ctx, assign, 1, "1f1b")
    if candidate is None:
        continue
    simulated = predict(candidate_to_plan(ctx, candidate), topology, model, training)[0].iteration_s
    errors.append(candidate.score_s / simulated - 1.0)
print(json.dumps(errors))
"""


def instance(seed: int, nics: bool = True) -> tuple:
    """(topology document, R x S device indices) of instance ``seed`` (the module description);
    ``nics`` False: the same instance without its shared NICs, where it has them."""
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
        nic = f"{rng.choice([10, 25, 100])}Gbps"
        if nics:
            network["nic"] = nic
    n = hosts * per
    S = int(rng.integers(1, min(3, n) + 1))
    R = min(int(rng.integers(2, max(3, n // S + 1))), n // S)
    return {"name": "random", "devices": devices, "network": network}, rng.permutation(n)[:S * R].reshape(R, S)


def main() -> None:
    args = tree_arguments(__doc__.splitlines()[0], "estimate_syncs.json",
                          no_nics="the same instances without shared NICs (what the NICs' queues cost the estimate)")
    instances = json.dumps([(document, assign.tolist())
                            for document, assign in (instance(seed, not args.no_nics) for seed in range(args.seeds))])
    cells = [({"sync": sync}, [sync], instances) for sync in SYNCS]
    before_commit, rows = errors_in_trees(args.before, _ESTIMATES, cells, args.workers)
    for before, after in zip(rows[::2], rows[1::2]):
        print(f"{after['sync']:16}  before: {summary(before, 5)}\n{'':16}  after:  {summary(after, 5)}")
    write_rows(args, "estimate_syncs.py", before_commit, rows)


if __name__ == "__main__":
    main()
