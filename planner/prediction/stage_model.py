"""The one stage model: what a block, the embeddings and the head cost per micro-batch (FLOPs,
parameters, activations, messages), and what a stage of ``n`` blocks costs in time and memory.

The search's estimate (``planner.search.evaluate``), its balancing (``planner.search.balance``),
its CP-SAT model and bounds, and the simulator's input (``planner.prediction.predict``) all derive
from ``LayerCosts``; the formulas themselves are ``cost_models.flops`` and ``cost_models.memory``.
"""

from dataclasses import dataclass

import numpy as np

from cost_models import comm, flops, memory
from cost_models.compression import (INT8_CODEC_BANDWIDTH_SHARE, POWERSGD_BANDWIDTH_SHARE,
                                     POWERSGD_PASS_BYTES_PER_PARAMETER, POWERSGD_STATE_BYTES_PER_PARAMETER,
                                     GradientCompression, MessageCompression, block_matrix_shapes, int8_decode_bytes,
                                     int8_encode_bytes, int8_message_bytes, powersgd_sync)
from cost_models.network import Sync
from planner.plan.tensor import TENSOR_DEGREES

__all__ = ["OPTIMIZER_BYTES_PER_PARAMETER", "OUTER_STATE_BYTES_PER_PARAMETER", "OUTER_STEP_BYTES_PER_PARAMETER",
           "LayerCosts", "layer_costs", "StageProfile", "stage_profile",
           "stage_parameters", "stage_memory_bytes", "stage_step_bytes", "in_flight_table", "held_table", "peak_table",
           "optimizer_time_s",
           "iteration_flops", "optimizer_shards", "tensor_layer_s", "head_outputs", "message_codec_s",
           "stage_gradient_bytes", "stage_compress_flops", "stage_compress_s", "least_gradient_bytes_per_param",
           "powersgd_pass_s", "recompute_multiple"]

# Bytes the optimizer update moves per parameter (read + write), a roofline estimate of a fused
# Adam step: fp32 master, m and v read and written (24 B), the 16-bit gradient read and the 16-bit
# weight written (4 B). SGD with momentum: master and momentum (16 B) plus the same 4 B.
OPTIMIZER_BYTES_PER_PARAMETER = {"adam": 28.0, "sgd": 20.0}
# Local steps (DiLoCo, Douillard et al. 2023, arXiv 2311.08105, Algorithm 1): each device keeps the
# parameters of the last sync and the outer Nesterov momentum, fp32 each (8 B per parameter), and the
# outer step reads and writes both and the fp32 master (24 B per parameter, roofline).
OUTER_STATE_BYTES_PER_PARAMETER = 8.0
OUTER_STEP_BYTES_PER_PARAMETER = 24.0


@dataclass(frozen=True, kw_only=True, eq=False)
class LayerCosts:
    """Per-block and per-stage-extra work, memory and messages for one micro-batch of
    ``micro_batch_size`` sequences, in a pipeline of ``stages`` stages. The extras of each stage
    (embeddings on the first, head and logits on the last) are derived once into arrays of length
    ``stages``: ``stage_extra_params``, ``stage_extra_kept_bytes``, ``stage_transient_bytes``.
    A stage also holds the messages it sent until the iteration's sync, outputs downstream and
    gradients upstream (``cost_models.memory.held_messages``), each at its boundary's size:
    ``boundary_bytes`` where the plan compresses it, ``raw_boundary_bytes`` elsewhere.

    With the optimizer state sharded over ``shards`` replicas (ZeRO stage 1), the per-parameter
    state and step bytes are the sharded ones; a tied embedding's two copies are summed over their
    own group and stay unsharded, which ``stage_unsharded_bytes`` and ``stage_unsharded_step_bytes``
    add back on the first and last stages."""

    stages: int
    layers: int
    micro_batch_size: int  # sequences per micro-batch
    layer_forward_flops: float
    layer_flops: float  # forward + backward (+ recompute) of one block
    head_forward_flops: float
    head_flops: float  # forward + backward of the LM head, last stage
    layer_params: float
    first_params: float  # embeddings (and, with one stage, the head)
    last_params: float  # final norm + head (+ the tied embedding's copy)
    layer_kept_bytes: float
    output_kept_bytes: float  # a stage's output beside the int8 message it sent (its boundary compressed)
    last_kept_bytes: float  # the head's: logits and the final norm's input and output
    transient_bytes: float
    last_transient_bytes: float
    state_bytes_per_param: float
    gradient_bytes_per_param: float  # what the all-reduce moves per parameter, per iteration (over sync_every)
    optimizer_bytes_per_param: float  # what the optimizer step reads and writes per parameter (+ outer step share)
    boundary_bytes: float  # one message across a stage boundary, as sent (compressed with compress_messages)
    shards: int = 1  # replicas the optimizer state is sharded over (1: not sharded)
    first_unsharded_params: float = 0.0  # the tied embedding on the first stage, when sharded
    last_unsharded_params: float = 0.0  # its copy on the last stage
    unsharded_state_bytes_per_param: float = 0.0  # optimizer state an unsharded parameter keeps beyond the sharded rate
    unsharded_step_bytes_per_param: float = 0.0
    # Tensor parallelism: the parts of a block that a group of t devices divides (each member keeps
    # ``whole - split * (1 - 1/t)``), and the activation each member all-reduces per block.
    layer_split_params: float = 0.0
    layer_split_kept_bytes: float = 0.0
    split_transient_bytes: float = 0.0  # the recomputed block's divided part
    # A member other than the group's lead keeps the whole parameters' 16-bit (or fp32) weights only,
    # and the gradients of the first stage's embeddings (``planner.runtime.tensor_parallel.follow_lead``).
    weight_bytes_per_param: float = 0.0
    embedding_params: float = 0.0  # the first stage's token and position embeddings
    tensor_message_bytes: float = 0.0
    tensor_allreduces_forward: int = 0
    tensor_allreduces_backward: int = 0
    recompute: bool | str = False  # False, True (full) or "selective" (``planner.plan.recompute``)
    sync_every: int = 1  # iterations between data-parallel syncs (local steps; 1: every iteration)
    layer_weight_gradient_flops: float = 0.0  # the weight gradients' part of a block's backward
    micro_batches_per_round: int = 0  # accumulation rounds (``cost_models.schedule.round_sizes``; 0: one round)
    # 1F1B's warm-up depth the training fixes (``cost_models.schedule.one_f_one_b_warmup``; 1 under auto,
    # whose deeper variants the search scores with their own depth)
    warmup_depth: int = 1
    # Compressed messages (``cost_models.compression``): memory traffic to encode one and to decode one.
    boundary_encode_bytes: float = 0.0
    boundary_decode_bytes: float = 0.0
    raw_boundary_bytes: float = 0.0  # one message uncompressed (a boundary the plan leaves uncompressed)
    # PowerSGD gradient sync (rank > 0): bytes all-reduced and FLOPs of compressing per block and for
    # the first and last stages' extras (``cost_models.compression.powersgd_sync``).
    powersgd_rank: int = 0
    layer_gradient_bytes: float = 0.0
    first_gradient_bytes: float = 0.0
    last_gradient_bytes: float = 0.0
    layer_compress_flops: float = 0.0
    # ... of a block split over a tensor group, indexed by its degree (``TENSOR_DEGREES``; NaN
    # elsewhere): every member's shards' bytes together, and one member's FLOPs.
    layer_gradient_bytes_by_degree: np.ndarray = None
    layer_compress_flops_by_degree: np.ndarray = None
    first_compress_flops: float = 0.0
    last_compress_flops: float = 0.0
    powersgd_pass_bytes_per_param: float = 0.0  # PowerSGD's error-feedback passes per parameter (powersgd_pass_s)

    def __post_init__(self):
        first = (np.arange(self.stages) == 0).astype(float)
        last = (np.arange(self.stages) == self.stages - 1).astype(float)
        object.__setattr__(self, "stage_extra_params", first * self.first_params + last * self.last_params)
        object.__setattr__(self, "stage_extra_kept_bytes", last * self.last_kept_bytes)
        object.__setattr__(self, "stage_transient_bytes", self.transient_bytes + last * self.last_transient_bytes)
        unsharded = first * self.first_unsharded_params + last * self.last_unsharded_params
        object.__setattr__(self, "stage_unsharded_bytes", unsharded * self.unsharded_state_bytes_per_param)
        object.__setattr__(self, "stage_unsharded_step_bytes", unsharded * self.unsharded_step_bytes_per_param)
        object.__setattr__(self, "stage_extra_gradient_bytes",
                           first * self.first_gradient_bytes + last * self.last_gradient_bytes)
        object.__setattr__(self, "stage_extra_compress_flops",
                           first * self.first_compress_flops + last * self.last_compress_flops)


def _per_member(whole, split, tensor):
    """What each of a tensor group's ``tensor`` members keeps of ``whole`` when ``split`` of it is divided."""
    return whole - split * (1.0 - 1.0 / np.asarray(tensor, dtype=float))


def optimizer_shards(training, replicas: int) -> int:
    """Replicas each stage's optimizer state is split over: all of them under ZeRO stage 1
    (``training.shard_optimizer`` true or auto), else 1; 1 with local steps (``training.sync_every``
    above 1), whose replicas each step their whole state between syncs, and with PowerSGD, which
    all-reduces whole (compressed) gradients, and with a hierarchical or parameter-server sync,
    which sums whole gradients (``planner.plan.sync``)."""
    if training.sync_every > 1 or training.compress_gradients == GradientCompression.POWERSGD:
        return 1
    if getattr(training, "sync", "ring") in (Sync.HIERARCHICAL, Sync.PARAMETER_SERVER):
        return 1
    return replicas if training.shard_optimizer is not False and replicas > 1 else 1


def head_outputs(model, *, padded: bool = True) -> tuple:
    """(outputs, positions) of the model's head: an LM head gives ``padded_vocabulary(V)`` logits (the
    rows the runtime trains; ``V`` itself with ``padded=False``) at every position; a classification
    head gives ``classes`` logits at the last position only."""
    if model.head == "classification":
        return model.classes, 1
    return (flops.padded_vocabulary(model.vocabulary) if padded else model.vocabulary), model.sequence


def layer_costs(model, training, micro_batch_size: int, stages: int, replicas: int = 1, *,
                compiled: bool = True) -> LayerCosts:
    """The costs of ``model`` under ``training`` (formulas in ``cost_models``, sources cited there),
    for ``stages`` stages of ``replicas`` replicas each (the optimizer state's shards); ``compiled``:
    whether the runtime compiles the loss (``plan launch`` does on GPUs), which changes what the
    loss keeps (``cost_models.memory.loss_bytes``)."""
    if not (isinstance(training.recompute, bool) or training.recompute == "selective"):
        raise ValueError("recompute 'auto' is a search decision: resolve it before costing a plan")
    full_recompute = training.recompute is True  # (a bool or "selective", checked above)
    b, s, h, a = micro_batch_size, model.sequence, model.hidden, model.heads
    v = flops.padded_vocabulary(model.vocabulary)  # the embedding's rows, as the runtime trains them
    outputs, positions = head_outputs(model)
    dtype = training.activation_bytes
    fwd = flops.layer_forward_flops(b, s, h, model.ffn_hidden, gated_mlp=model.gated_mlp)
    head_fwd = flops.head_forward_flops(b, positions, h, outputs)
    kept = memory.layer_activation_bytes(s, b, h, a, dtype_bytes=dtype, flash_attention=training.flash_attention,
                                         recompute=training.recompute)
    full = memory.layer_activation_bytes(s, b, h, a, dtype_bytes=dtype, flash_attention=training.flash_attention)
    # Activations are linear in 1/t (Korthikanti et al. 2022, Table 2): the divided part is twice
    # what a group of two saves.
    half_kept = memory.layer_activation_bytes(s, b, h, a, dtype_bytes=dtype, flash_attention=training.flash_attention,
                                              recompute=training.recompute, tensor=2)
    half_full = memory.layer_activation_bytes(s, b, h, a, dtype_bytes=dtype, flash_attention=training.flash_attention,
                                              tensor=2)
    tensor_forward, tensor_backward = comm.tensor_allreduces(training.recompute)
    # Recomputation's working set in backward, on top of what stays: a block's full set (full), or
    # (selective) the attention core's softmax output that flash attention would not keep.
    if full_recompute:
        recomputed, half_recomputed = full, half_full
    elif training.recompute == "selective" and not training.flash_attention:
        recomputed, half_recomputed = full - kept, half_full - half_kept
    else:
        recomputed = half_recomputed = 0.0
    boundary = float(b * s * h * dtype)
    last_params = flops.head_parameters(outputs, h, tied=model.tied_embeddings, biases=model.biases)
    if model.tied_embeddings and stages > 1:
        last_params += v * h  # the last stage keeps its own copy of the tied embedding (Megatron-LM)
    embedding = float(flops.embedding_parameters(v, h, s, learned_positions=model.learned_positions))
    first_params = embedding
    if stages == 1:
        first_params += last_params
        last_params = 0.0
    # Recomputation re-runs a block's forward in backward and keeps one block's full set meanwhile.
    # The receive buffer (the sent message is held until the sync: ``held_messages``).
    transient = boundary + recomputed
    shards = optimizer_shards(training, replicas)
    state = memory.state_bytes_per_parameter(training.precision, training.optimizer)
    sharded_state = memory.optimizer_state_bytes_per_parameter(training.precision, training.optimizer)
    step = OPTIMIZER_BYTES_PER_PARAMETER[training.optimizer]
    H = training.sync_every if replicas > 1 else 1  # one replica has no sync to space out
    if H > 1:  # local steps: the outer state kept, the outer step and the delta sync once every H iterations
        state += OUTER_STATE_BYTES_PER_PARAMETER
        step += OUTER_STEP_BYTES_PER_PARAMETER / H
    tied_copy = float(v * h) if model.tied_embeddings and stages > 1 and shards > 1 else 0.0
    if training.compress_messages not in tuple(MessageCompression):
        raise ValueError("compress_messages 'auto' is a search decision: resolve it before costing a plan")
    int8 = training.compress_messages == MessageCompression.INT8
    values = b * s * h  # one boundary message's values
    powersgd = _powersgd_costs(model, training, stages, first_params, last_params, v, dtype)
    loss_kept, loss_transient = memory.loss_bytes(positions, b, outputs, dtype, compiled=compiled)
    passes = 0.0
    if powersgd and replicas > 1:  # the error feedback kept, its passes over every gradient (powersgd_pass_s)
        state += POWERSGD_STATE_BYTES_PER_PARAMETER
        passes = POWERSGD_PASS_BYTES_PER_PARAMETER
    return LayerCosts(**powersgd,
        stages=stages, layers=model.layers, micro_batch_size=b, layer_forward_flops=fwd,
        layer_flops=flops.recomputed_layer_flops(fwd, flops.attention_core_forward_flops(b, s, h), training.recompute),
        head_forward_flops=head_fwd, head_flops=3.0 * head_fwd,
        layer_params=float(flops.layer_parameters(h, model.ffn_hidden, gated_mlp=model.gated_mlp,
                                                  biases=model.biases)),
        first_params=float(first_params), last_params=float(last_params), layer_kept_bytes=kept,
        output_kept_bytes=boundary if int8 else 0.0,  # uncompressed, the message sent is the output itself
        last_kept_bytes=loss_kept + memory.final_norm_bytes(s, b, h, positions, dtype),
        transient_bytes=transient,
        last_transient_bytes=loss_transient,  # the logits' gradient
        state_bytes_per_param=state - sharded_state * (1.0 - 1.0 / shards),
        gradient_bytes_per_param=float(dtype) / H, sync_every=H,
        micro_batches_per_round=training.micro_batches_per_round,
        warmup_depth=getattr(training, "fixed_warmup_depth", 1),
        layer_weight_gradient_flops=flops.layer_weight_gradient_flops(b, s, h, model.ffn_hidden,
                                                                      gated_mlp=model.gated_mlp),
        optimizer_bytes_per_param=step / shards, powersgd_pass_bytes_per_param=passes,
        boundary_bytes=int8_message_bytes(values) if int8 else boundary, raw_boundary_bytes=boundary,
        boundary_encode_bytes=int8_encode_bytes(values, dtype) if int8 else 0.0,
        boundary_decode_bytes=int8_decode_bytes(values, dtype) if int8 else 0.0,
        shards=shards, first_unsharded_params=tied_copy, last_unsharded_params=tied_copy,
        unsharded_state_bytes_per_param=sharded_state * (1.0 - 1.0 / shards),
        unsharded_step_bytes_per_param=step * (1.0 - 1.0 / shards),
        layer_split_params=float(flops.tensor_split_parameters(h, model.ffn_hidden, gated_mlp=model.gated_mlp,
                                                               biases=model.biases)),
        layer_split_kept_bytes=2.0 * (kept - half_kept),
        split_transient_bytes=2.0 * (recomputed - half_recomputed),
        tensor_message_bytes=boundary, tensor_allreduces_forward=tensor_forward,
        tensor_allreduces_backward=tensor_backward, recompute=training.recompute,
        weight_bytes_per_param=memory.weight_bytes_per_parameter(training.precision),
        embedding_params=embedding)


def _powersgd_costs(model, training, stages, first_params, last_params, v, dtype) -> dict:
    """The ``LayerCosts`` fields of a PowerSGD sync (empty without one): every block's weight
    matrices, the learned positions, the token embedding (a tied embedding's copies too, summed over
    their own group by PowerSGD as well) and an untied head. In a tensor group of ``t`` each member
    compresses its own shards (``block_matrix_shapes(..., tensor=t)``) over its counterparts in the
    other replicas, so a block's matrices go as ``t`` shards' ``P`` and ``Q`` (an ``n x m`` matrix
    cut by rows: ``r (n + t m)`` values in all), its vectors whole once (a shard's share by each
    member, the rest by the lead); the embeddings and the head stay whole on the lead."""
    if training.compress_gradients not in tuple(GradientCompression):
        raise ValueError("compress_gradients 'auto' is a search decision: resolve it before costing a plan")
    if training.compress_gradients != GradientCompression.POWERSGD:
        return {}
    h, r = model.hidden, training.powersgd_rank
    first = ([(model.sequence, h)] if model.learned_positions else []) + [(v, h)]
    head = [(v, h)] if not model.tied_embeddings or stages > 1 else []  # the head, or the tied copy
    first, last = (first + head, []) if stages == 1 else (first, head)
    layer_params = flops.layer_parameters(h, model.ffn_hidden, gated_mlp=model.gated_mlp, biases=model.biases)
    layer = powersgd_sync(block_matrix_shapes(h, model.ffn_hidden, gated_mlp=model.gated_mlp), layer_params, r, dtype)
    one, two = powersgd_sync(first, first_params, r, dtype), powersgd_sync(last, last_params, r, dtype)
    by_bytes, by_flops = np.full(max(TENSOR_DEGREES) + 1, np.nan), np.full(max(TENSOR_DEGREES) + 1, np.nan)
    for t in TENSOR_DEGREES:
        shards = block_matrix_shapes(h, model.ffn_hidden, gated_mlp=model.gated_mlp, tensor=t)
        by_bytes[t] = powersgd_sync(shards * t, layer_params, r, dtype)[0]  # every member's, one message each
        by_flops[t] = powersgd_sync(shards, layer_params, r, dtype)[1]  # one member's products
    return {"powersgd_rank": r, "layer_gradient_bytes": layer[0], "layer_compress_flops": layer[1],
            "layer_gradient_bytes_by_degree": by_bytes, "layer_compress_flops_by_degree": by_flops,
            "first_gradient_bytes": one[0], "first_compress_flops": one[1],
            "last_gradient_bytes": two[0], "last_compress_flops": two[1]}


def stage_gradient_bytes(costs: LayerCosts, n_layers, stage, tensor=1):
    """Bytes stage ``stage``'s all-reduce moves per iteration with ``n_layers`` blocks: its parameters'
    gradients at the training precision (over ``sync_every``), or PowerSGD's ``P`` and ``Q`` and the
    vectors; with tensor groups of degree ``tensor`` every member's shards' messages together (each
    member syncs its shards with the same shards of the other replicas, the lead the whole
    parameters; vectorised over layers, stages and degrees)."""
    if not costs.powersgd_rank:
        return stage_parameters(costs, n_layers, stage) * costs.gradient_bytes_per_param
    return n_layers * costs.layer_gradient_bytes_by_degree[np.asarray(tensor)] + costs.stage_extra_gradient_bytes[stage]


def stage_compress_flops(costs: LayerCosts, n_layers, stage, tensor=1):
    """FLOPs of PowerSGD's products on stage ``stage``'s gradients per iteration on the busiest
    member of a tensor group of degree ``tensor`` (its lead: its shards and the whole matrices; 0
    without PowerSGD)."""
    if not costs.powersgd_rank:
        return 0.0 * np.asarray(n_layers)
    return n_layers * costs.layer_compress_flops_by_degree[np.asarray(tensor)] + costs.stage_extra_compress_flops[stage]


def stage_compress_s(costs: LayerCosts, n_layers, stage, flops_per_s, tensor=1):
    """Seconds of PowerSGD's products before the optimizer step (``stage_compress_flops``) on a
    device, or a tensor group of degree ``tensor``, of ``flops_per_s`` (a group's: ``tensor`` times
    a member's, ``planner.plan.tensor``), each member at its own speed. The search's estimate and
    the simulator's input both call it."""
    return stage_compress_flops(costs, n_layers, stage, tensor) * np.asarray(tensor) / flops_per_s


def least_gradient_bytes_per_param(costs: LayerCosts) -> float:
    """The fewest bytes any parameter adds to a sync (for lower bounds): the per-parameter rate, or
    with PowerSGD the smallest of the blocks' (at any tensor degree) and the extras' rates."""
    if not costs.powersgd_rank:
        return costs.gradient_bytes_per_param
    rates = [costs.layer_gradient_bytes_by_degree[t] / costs.layer_params for t in TENSOR_DEGREES]
    rates += [b / p for b, p in ((costs.first_gradient_bytes, costs.first_params),
                                 (costs.last_gradient_bytes, costs.last_params)) if p > 0]
    return min(rates)


def stage_parameters(costs: LayerCosts, n_layers, stage, tensor=1):
    """Parameters of stage ``stage`` with ``n_layers`` blocks on each member of a tensor group of
    ``tensor`` devices (vectorised over layers, stages and degrees). The embeddings and the head
    stay whole on every member."""
    return n_layers * _per_member(costs.layer_params, costs.layer_split_params, tensor) + costs.stage_extra_params[stage]


def stage_memory_bytes(costs: LayerCosts, n_layers, stage, in_flight, tensor=1, lead=True, outputs=0.0,
                       gradients=0.0, heads=None, compressed=None):
    """Peak bytes of stage ``stage`` with ``n_layers`` blocks and ``in_flight`` micro-batches'
    activations kept, on each member of a tensor group of ``tensor`` devices: weights, gradients
    and optimizer state, the kept activations, the ``outputs`` and ``gradients`` messages the stage
    has sent and keeps until the sync (``cost_models.memory.held_messages``), one micro-batch's
    transient working set (recomputation, logits gradient, the receive buffer).
    A stage's outputs cross boundary ``stage``, its gradients boundary ``stage - 1``; each is held
    as sent, ``boundary_bytes`` across a compressed boundary, ``raw_boundary_bytes`` across another
    (``compressed``: (S - 1,) booleans, the boundaries the plan compresses, None: every one where
    ``costs`` compress; ``planner.runtime.engine`` sends raw tensors elsewhere), and where its
    output's boundary is compressed a stage also keeps each in-flight output whole beside the int8
    message (``output_kept_bytes``).
    ``heads``: the micro-batches whose stage extras (the last stage's head) are kept, where they are
    fewer than ``in_flight`` (interleaved 1F1B, ``cost_models.memory.head_in_flight``).
    ``lead=False``: a member other than the group's lead, which steps only its share of the split
    parameters; of the whole ones (norms, row-parallel biases, embeddings, head) it keeps the
    weights, which the lead broadcasts after each step, and the gradients of the first stage's
    embeddings only (Shoeybi et al. 2019, sec. 3: the whole parameters are duplicated on every
    member and take the same update, so one member steps them;
    ``planner.runtime.tensor_parallel.follow_lead``); only the lead sends pipeline messages
    (``planner.runtime.engine``), so such a member holds none, only the outputs of its in-flight
    micro-batches (but on the last stage), ``raw_boundary_bytes`` each."""
    blocks = n_layers * _per_member(costs.layer_kept_bytes, costs.layer_split_kept_bytes, tensor)
    kept = in_flight * blocks + (in_flight if heads is None else heads) * costs.stage_extra_kept_bytes[stage]
    transient = _per_member(costs.stage_transient_bytes[stage], costs.split_transient_bytes, tensor)
    parameters = stage_parameters(costs, n_layers, stage, tensor)
    raw = costs.raw_boundary_bytes or costs.boundary_bytes
    if lead:
        down, up = _compressed_sides(costs.stages, stage, compressed)
        held = (outputs * np.where(down, costs.boundary_bytes, raw)
                + gradients * np.where(up, costs.boundary_bytes, raw)
                + in_flight * np.where(down, costs.output_kept_bytes, 0.0))
        return parameters * costs.state_bytes_per_param + kept + held + transient + costs.stage_unsharded_bytes[stage]
    sends = np.asarray(stage) < costs.stages - 1
    activations = kept + in_flight * np.where(sends, raw, 0.0) + transient
    whole = n_layers * (costs.layer_params - costs.layer_split_params) + costs.stage_extra_params[stage]
    first = np.asarray(stage) == 0
    # the embeddings' gradients: the weight's bytes again (a 16-bit gradient of a 16-bit weight)
    gradients = np.where(first, costs.embedding_params, 0.0) * costs.weight_bytes_per_param
    return ((parameters - whole) * costs.state_bytes_per_param + whole * costs.weight_bytes_per_param + gradients
            + activations)


def _compressed_sides(stages: int, stage, compressed=None) -> tuple:
    """(boundary ``stage`` compressed, boundary ``stage - 1`` compressed) of ``compressed`` ((S - 1,)
    booleans, None: every one), False past the pipeline's ends; vectorised over stages."""
    mask = np.ones(stages - 1, dtype=bool) if compressed is None else np.asarray(compressed, dtype=bool)
    return np.append(mask, False)[stage], np.insert(mask, 0, False)[stage]


def tensor_layer_s(costs: LayerCosts, allreduce_per_byte_s, allreduce_latency_s, block_compute_s, degree,
                   issue_s=0.0, timed_s=0.0, slowdown=1.0):
    """Seconds one block of a tensor group takes per micro-batch beyond its members' share of the
    compute (``block_compute_s``), forward and backward together. Where the group's degree was
    timed (``timed_s`` > 0: ``TensorGroups.timed_block_s``, the plain block as ``plan calibrate``
    timed it at this micro-batch), the block takes that times its FLOPs' multiple (4/3 with full
    recomputation, ``flops.training_flops_multiplier``) and ``slowdown`` (the recomputed or split
    block's efficiency against the plain one's, ``Device.block_slowdown``), and this is the rest
    beyond the share (negative where the share at the blocks' efficiency is slower than
    the group's timing). Elsewhere its all-reduces, for groups whose ring all-reduce of ``n`` bytes
    takes ``n * per_byte + latency`` (``cost_models.network.Network.ring_cost``), or what the
    block's floor leaves when the share is smaller (``cost_models.comm.tensor_block_issue_s`` of the
    members' ``issue_s``, their device type's ``tensor_block_issue``: the block takes
    ``max(share + all-reduces, floor)``); 0 for a group of one (``degree`` 1). The search's
    estimate and the simulator's input both call it."""
    one = costs.tensor_message_bytes * np.asarray(allreduce_per_byte_s) + np.asarray(allreduce_latency_s)
    allreduces = (costs.tensor_allreduces_forward + costs.tensor_allreduces_backward) * one
    multiple = recompute_multiple(costs)
    floor = comm.tensor_block_issue_s(issue_s, multiple)
    modelled = np.maximum(allreduces, np.where(np.asarray(degree) > 1, floor - np.asarray(block_compute_s), 0.0))
    timed_s = np.asarray(timed_s, dtype=float)
    return np.where(timed_s > 0, timed_s * multiple * np.asarray(slowdown) - np.asarray(block_compute_s), modelled)


def recompute_multiple(costs: LayerCosts) -> float:
    """A block's forward + backward FLOPs under the costs' recomputation over a plain block's: 1,
    4/3 with full recomputation, ``1 + core / (3 forward)`` with selective
    (``cost_models.flops.recomputed_layer_flops``)."""
    return costs.layer_flops / (flops.training_flops_multiplier(False) * costs.layer_forward_flops)


def message_codec_s(costs: LayerCosts, codec_bandwidth_bytes_per_s, compressed=None) -> tuple:
    """(forward, backward) seconds per micro-batch that each stage spends encoding and decoding its
    compressed messages, memory-bound (bytes moved / the share ``INT8_CODEC_BANDWIDTH_SHARE`` of the
    memory bandwidth that the runtime's codec was measured to reach; ``Device.codec_bandwidth``, the
    bandwidth that share was measured against):
    forward, a stage decodes the activation it receives and encodes the one it sends; backward, it
    decodes the gradient from downstream and encodes the one it sends upstream. Length-S arrays,
    broadcast against ``codec_bandwidth_bytes_per_s`` ((R, S) in the callers); 0 without compression.
    ``compressed``: (S - 1,) booleans, the boundaries compressed (None: every one)."""
    S = costs.stages
    mask = np.ones(S - 1, dtype=bool) if compressed is None else np.asarray(compressed, dtype=bool)
    sends_down = np.append(mask, False).astype(float)  # its boundary downstream is compressed
    gets_from_up = np.insert(mask, 0, False).astype(float)
    forward = sends_down * costs.boundary_encode_bytes + gets_from_up * costs.boundary_decode_bytes
    backward = sends_down * costs.boundary_decode_bytes + gets_from_up * costs.boundary_encode_bytes
    bandwidth = np.asarray(codec_bandwidth_bytes_per_s, dtype=float) * INT8_CODEC_BANDWIDTH_SHARE
    return forward / bandwidth, backward / bandwidth


def powersgd_pass_s(costs: LayerCosts, parameters, codec_bandwidth_bytes_per_s):
    """Seconds of PowerSGD's error-feedback passes over ``parameters`` gradients before the step
    (``POWERSGD_PASS_BYTES_PER_PARAMETER`` each, memory-bound: roofline, Williams et al. 2009) at the
    share ``POWERSGD_BANDWIDTH_SHARE`` of ``Device.codec_bandwidth``, the bandwidth that share was
    measured against; 0 without PowerSGD (or one replica)."""
    return parameters * costs.powersgd_pass_bytes_per_param / (np.asarray(codec_bandwidth_bytes_per_s, dtype=float)
                                                               * POWERSGD_BANDWIDTH_SHARE)


def stage_step_bytes(costs: LayerCosts, parameters, stage):
    """Bytes the optimizer step of stage ``stage`` moves, for ``parameters`` parameters on the stage
    (this worker's shard of them under ZeRO stage 1)."""
    return parameters * costs.optimizer_bytes_per_param + costs.stage_unsharded_step_bytes[stage]


def in_flight_table(schedule: str, stages: int, micro_batches, per_round: int = 0, virtual_stages: int = 1,
                    chunk_layers=None, warmup_depth: int = 1) -> np.ndarray:
    """(R, S) in-flight micro-batches of every worker at its peak (``cost_models.memory.peak_in_flight``;
    ``per_round``: micro-batches per accumulation round, 0 for one round; ``virtual_stages``: chunks
    per device of interleaved 1F1B; ``chunk_layers``: each stage's chunks' blocks, None for equal;
    ``warmup_depth``: 1F1B's, ``cost_models.schedule.one_f_one_b_warmup``)."""
    return _table(memory.peak_in_flight, schedule, stages, micro_batches, per_round, virtual_stages, chunk_layers,
                  warmup_depth)


def held_table(schedule: str, stages: int, micro_batches, per_round: int = 0, virtual_stages: int = 1,
               chunk_layers=None, warmup_depth: int = 1) -> tuple:
    """(outputs, gradients), each (R, S): the messages every worker has sent and holds at its peak
    (``cost_models.memory.held_messages``), for ``stage_memory_bytes`` beside ``in_flight_table``."""
    return _table(memory.held_messages, schedule, stages, micro_batches, per_round, virtual_stages, chunk_layers,
                  warmup_depth)


def _table(count, schedule, stages, micro_batches, per_round, virtual_stages, chunk_layers, warmup_depth=1):
    """``count`` over every (replica, stage): one vectorised call where every stage's chunks are
    equal (closed forms), a call per stage where some are not (walked)."""
    m = np.asarray(micro_batches, dtype=np.int64)
    if chunk_layers is None or all(len(set(c)) <= 1 for c in chunk_layers):
        return count(schedule, np.arange(stages)[None, :], stages, m[:, None], per_round, virtual_stages,
                     warmup_depth=warmup_depth)
    per_stage = [count(schedule, s, stages, m, per_round, virtual_stages, tuple(chunk_layers[s]),
                       warmup_depth=warmup_depth)
                 for s in range(stages)]
    if isinstance(per_stage[0], tuple):
        return tuple(np.stack([p[k] for p in per_stage], axis=1) for k in range(len(per_stage[0])))
    return np.stack(per_stage, axis=1)


def peak_table(schedule: str, stages: int, micro_batches, per_round: int = 0, virtual_stages: int = 1,
               chunk_layers=None, warmup_depth: int = 1) -> dict:
    """``stage_memory_bytes``'s ``in_flight``, ``outputs``, ``gradients`` and ``heads``, each (R, S),
    of every worker at its peak (``in_flight_table``, ``held_table``, and the last stage's
    ``cost_models.memory.head_in_flight`` under interleaved 1F1B): what the prediction counts per
    device, for the search's memory checks."""
    in_flight, outputs, gradients = _table(memory.stage_peak, schedule, stages, micro_batches, per_round,
                                           virtual_stages, chunk_layers, warmup_depth)
    heads = in_flight.copy()
    if virtual_stages > 1:
        heads[:, -1] = memory.head_in_flight(schedule, stages - 1, stages, np.asarray(micro_batches, dtype=np.int64),
                                             per_round, virtual_stages, _chunks(chunk_layers, stages - 1))
    return {"in_flight": in_flight, "outputs": outputs, "gradients": gradients, "heads": heads}


def _chunks(chunk_layers, stage: int) -> tuple:
    return () if chunk_layers is None else tuple(chunk_layers[stage])


def optimizer_time_s(step_bytes, memory_bandwidth_bytes_per_s):
    """The optimizer update is memory-bound: bytes moved (``stage_step_bytes``) / memory bandwidth
    (roofline, Williams et al. 2009)."""
    return step_bytes / memory_bandwidth_bytes_per_s


@dataclass(frozen=True, kw_only=True, eq=False)
class StageProfile:
    """Per-stage work for one micro-batch (arrays of length S), derived from ``LayerCosts``."""

    layer_counts: np.ndarray
    forward_flops: np.ndarray
    backward_flops: np.ndarray
    parameters: np.ndarray
    boundary_bytes: np.ndarray  # length S-1
    gradient_bytes: np.ndarray  # what the stage's all-reduce moves
    head_forward_flops: np.ndarray  # the LM head's share of forward_flops (last stage only)
    weight_gradient_flops: np.ndarray = None  # the weight gradients' part of backward_flops

    @property
    def weight_gradient_share(self) -> np.ndarray:
        """Each stage's weight gradients as a share of its backward (0 where a stage has no work)."""
        return np.divide(self.weight_gradient_flops, self.backward_flops, out=np.zeros_like(self.backward_flops),
                         where=self.backward_flops > 0)


def stage_profile(costs: LayerCosts, layer_bounds, compressed=None, tensor=1) -> StageProfile:
    """The stages ``[layer_bounds[s], layer_bounds[s+1])``: forward and backward FLOPs, parameters,
    messages. Backward is twice forward, plus one forward of the blocks with recomputation.
    ``compressed``: (S - 1,) booleans, the boundaries whose messages are compressed where ``costs``
    compress them (None: every one); ``tensor``: each stage's tensor degree (its gradient sync's
    messages with PowerSGD, ``stage_gradient_bytes``)."""
    counts = np.diff(np.asarray(layer_bounds)).astype(float)
    S = counts.size
    assert S == costs.stages, "the costs were made for another number of stages"
    head = np.where(np.arange(S) == S - 1, costs.head_forward_flops, 0.0)
    forward = counts * costs.layer_forward_flops + head
    backward = counts * (costs.layer_flops - costs.layer_forward_flops) + 2.0 * head
    params = stage_parameters(costs, counts, np.arange(S))
    weight = counts * costs.layer_weight_gradient_flops + head  # the head's dW is one product of its forward's size
    return StageProfile(layer_counts=counts, forward_flops=forward, backward_flops=backward, parameters=params,
                        boundary_bytes=np.where(np.ones(S - 1, dtype=bool) if compressed is None
                                                else np.asarray(compressed, dtype=bool),
                                                costs.boundary_bytes, costs.raw_boundary_bytes or costs.boundary_bytes),
                        gradient_bytes=stage_gradient_bytes(costs, counts, np.arange(S), tensor),
                        head_forward_flops=head,
                        weight_gradient_flops=weight)


def iteration_flops(model, global_batch: int, *, recompute: bool | str, head_slowdown: float = 1.0,
                    block_slowdown: float = 1.0) -> float:
    """FLOPs of one iteration over ``global_batch`` sequences: every block's forward and backward
    (plus a forward with recomputation) and the head's, the blocks' counted ``block_slowdown`` times
    (``Device.block_slowdown``) and the head's ``head_slowdown`` times.
    With ``recompute=False`` this is the model FLOPs of MFU (PaLM, Chowdhery et al. 2022, App. B)."""
    layer = flops.layer_forward_flops(global_batch, model.sequence, model.hidden, model.ffn_hidden,
                                      gated_mlp=model.gated_mlp)
    outputs, positions = head_outputs(model, padded=False)
    head = flops.head_forward_flops(global_batch, positions, model.hidden, outputs)
    core = flops.attention_core_forward_flops(global_batch, model.sequence, model.hidden)
    return float(model.layers * flops.recomputed_layer_flops(layer, core, recompute) * block_slowdown
                 + 3.0 * head * head_slowdown)
