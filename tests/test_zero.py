"""Sharded optimizer state (ZeRO stage 1) in the cost model, the search and the plan file."""

from dataclasses import replace

import numpy as np
import pytest
import yaml

from cost_models import memory
from cost_models.flops import padded_vocabulary
from planner.cli import main
from planner.inputs.job import load_job
from planner.inputs.model import model_preset, parse_training
from planner.prediction.stage_model import layer_costs, stage_memory_bytes, stage_parameters, stage_step_bytes
from planner.search.front import SearchOptions, search

from conftest import small_topology


def test_sharded_state_is_working_copies_plus_a_share_of_the_rest():
    # Rajbhandari et al. 2020, sec. 5.1: (2 + 2 + 12 / N_d) bytes per parameter for mixed-precision Adam.
    assert memory.optimizer_state_bytes_per_parameter("bf16", "adam") == 12
    assert memory.optimizer_state_bytes_per_parameter("fp32", "adam") == 8
    assert memory.optimizer_state_bytes_per_parameter("fp16", "sgd") == 8
    training = parse_training({"global_batch": 64, "precision": "bf16"})
    model = model_preset("gpt3-xl")
    one, four = layer_costs(model, training, 1, 1, 1), layer_costs(model, training, 1, 1, 4)
    assert one.state_bytes_per_param == 16 and four.state_bytes_per_param == 4 + 12 / 4
    assert four.optimizer_bytes_per_param == one.optimizer_bytes_per_param / 4
    off = layer_costs(model, replace(training, shard_optimizer=False), 1, 1, 4)
    assert off.state_bytes_per_param == 16


def test_the_tied_embedding_stays_unsharded_on_the_first_and_last_stages():
    training = parse_training({"global_batch": 64, "precision": "bf16"})
    model = model_preset("gpt3-xl")
    costs = layer_costs(model, training, 1, 3, 4)
    tied = padded_vocabulary(model.vocabulary) * model.hidden  # the rows the runtime trains
    counts = np.array([8, 8, 8])
    sharded = np.array([stage_parameters(costs, counts[s], s) * costs.state_bytes_per_param for s in range(3)])
    state = np.array([stage_memory_bytes(costs, counts[s], s, 0.0) - costs.stage_transient_bytes[s]
                      for s in range(3)])
    assert state[1] == pytest.approx(sharded[1])  # the middle stage has no embedding
    for s in (0, 2):  # the embedding's optimizer state is whole: 12 B - 12 / 4 B more per parameter
        assert state[s] - sharded[s] == pytest.approx(tied * 12 * (1 - 1 / 4))
        step = stage_step_bytes(costs, stage_parameters(costs, counts[s], s), s)
        assert step == pytest.approx(stage_parameters(costs, counts[s], s) * 28 / 4 + tied * 28 * (1 - 1 / 4))


def test_a_data_parallel_plan_shards_and_says_so(write_yaml, tmp_path):
    doc = small_topology(devices=[{"name": "fast", "count": 4, "type": "A100-80GB", "region": "east"}])
    job = load_job(write_yaml(doc))
    sharded = search(job.topology, job.model, job.training, SearchOptions(time_limit_s=5, stages=1, replicas=4))
    plain = search(job.topology, job.model, replace(job.training, shard_optimizer=False),
                   SearchOptions(time_limit_s=5, stages=1, replicas=4))
    assert sharded.training.shard_optimizer is True and plain.training.shard_optimizer is False
    device = sharded.plan.assignment[0][0]
    saved = plain.plan.prediction.memory_bytes[device] - sharded.plan.prediction.memory_bytes[device]
    params = stage_parameters(layer_costs(job.model, job.training, 1, 1), job.model.layers, 0)
    assert saved == pytest.approx(params * 12 * (1 - 1 / 4), rel=1e-6)
    assert sharded.plan.prediction.breakdown_s["optimizer_s"] < plain.plan.prediction.breakdown_s["optimizer_s"]
    out = tmp_path / "plan.yaml"
    assert main([str(write_yaml(doc)), "--stages", "1", "--replicas", "4", "-o", str(out), "--time-limit", "5"]) == 0
    assert yaml.safe_load(out.read_text())["training"]["shard_optimizer"] is True


def test_shard_optimizer_accepts_only_true_false_auto(write_yaml):
    from planner.errors import InputError

    for bad in (1, "yes", "on"):
        with pytest.raises(InputError, match="training.shard_optimizer"):
            load_job(write_yaml(small_topology(training={"global_batch": 16, "shard_optimizer": bad})))
