"""Memory per GPU by part (docs/planner.md), on the worst pipeline stage.

Model state: mixed-precision Adam keeps 2 bytes of weights, the gradients in ``grad_reduce``'s type (4 in fp32, the
default: Megatron-LM's main_grad buffer, FSDP2's gradients under a ``reduce_dtype`` of fp32; 2 in bf16 or fp16;
ZeRO-3's sharded gradients are FSDP2's, in its fp32 parameters' type whatever it reduces in) and
12 of optimizer state (fp32 master weights, momentum, variance): 18 bytes per parameter, 16 with 2-byte gradients
(the ZeRO paper's figure); ZeRO-1/2/3 shard the optimizer, then the gradients, then the weights over the
data-parallel group. Weights of GEMMs are split over tensor parallelism; norms and biases of
width h are replicated (as Megatron does). The word embedding lives on the first stage and the output
layer on the last (Megatron keeps a copy of a tied embedding there when p > 1).

Activations per layer and micro-batch, Korthikanti et al. 2022 (s sequence, b micro-batch, h hidden,
a heads, t tensor parallel):
  no recompute            s·b·h·(10 + 24/t + 5·a·s/(h·t))   (34/t + 5as/(ht) with sequence parallelism)
  selective recompute     s·b·h·(10 + 24/t)                 (34/t with sequence parallelism)
  full recompute          2·s·b·h                           (2/t with sequence parallelism)
The 34 = 10 replicated + 24 split generalises to other FFN widths and grouped-query attention:
  attention 2h (QKV input) + 2h (Q) + 2k (K) + 2k (V) + 2h (projection input) + h (dropout mask),
  MLP 2h (input) + 4f (activation input and output; 6f gated) + h (dropout mask), norms 4h,
where k is the K/V width and f the FFN width; of these, 10h (norm inputs, the two block inputs, the
two dropout masks) are replicated across t unless sequence parallelism splits them.

The loss's buffers, on the last stage: the cross-entropy runs on fp32 logits, and at the start of the backward torch's
holds the saved log-probabilities, the loss's gradient and log-softmax's input gradient, 3 × 4 bytes per logit
(b·s/cp tokens × V/t logits; torchtitan computes ``cross_entropy(pred.float(), labels)``; Megatron-LM's in-place
vocab-parallel cross-entropy holds less). At 32k tokens and Llama 3's 128,256 words that is 47 GiB.

Activations in flight on the first stage, in micro-batch·layers: 1F1B p·L/p, GPipe m·L/p,
interleaved 1F1B (p·v + p − 1) chunks of L/(p·v) layers. Full recompute also rebuilds one layer's
whole activations during its backward: one layer's no-recompute activations are added.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from bubblescope.analysis.planner.specs import (
    GRAD_REDUCE_BYTES,
    RESERVE_FRACTION,
    RESERVE_MIN_GIB,
    ClusterSpec,
    ModelSpec,
    ParallelConfig,
)
from bubblescope.analysis.schedule_orders import BACKWARD, BACKWARD_INPUT, FORWARD, Action
from bubblescope.analysis.schedules import Schedule, ScheduleError

GIB = 1024**3
BYTES_WEIGHTS, BYTES_OPTIMIZER = 2, 12
LOSS_BYTES_PER_LOGIT = 12


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per GPU on the worst stage; ``available`` is the GPU's memory less the reserve."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    params_on_gpu: float
    available: float
    loss: float = 0.0  # the loss's buffers, on the last stage

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.loss

    @property
    def fits(self) -> bool:
        return self.total <= self.available

    def gib(self) -> dict[str, float]:
        return {
            "weights": self.weights / GIB,
            "gradients": self.gradients / GIB,
            "optimizer": self.optimizer / GIB,
            "activations": self.activations / GIB,
            "loss": self.loss / GIB,
            "total": self.total / GIB,
        }


def layers_on_stage(model: ModelSpec, pp: int, layers_per_stage: tuple[int, ...] = ()) -> int:
    """Layers on the fullest stage (uneven splits put the extra layers on some stages)."""
    return max(layers_per_stage) if layers_per_stage else math.ceil(model.layers / pp)


def layer_params_on_gpu(model: ModelSpec, tp: int, ep: int = 1, etp: int = 0) -> tuple[float, float]:
    """(all, routed experts') parameters of one layer on one GPU: GEMM weights split over tensor parallelism, the
    routed experts over their own (``etp``, 0: as ``tp``) and expert parallelism, norms and biases replicated."""
    experts = model.layer_expert_params / ((etp or tp) * ep)
    replicated = model.layer_params - model.layer_matmul_params
    return model.layer_dense_matmul_params / tp + experts + replicated, experts


def stage_params(
    model: ModelSpec, tp: int, pp: int, layers_per_stage: tuple[int, ...] = (), ep: int = 1, etp: int = 0
) -> float:
    """Parameters held by one GPU of the worst stage (first or last)."""
    h = model.hidden
    per_layer, _experts = layer_params_on_gpu(model, tp, ep, etp)
    layers = layers_on_stage(model, pp, layers_per_stage) * per_layer
    embedding = model.vocab * h / tp + (model.embedding_params - model.vocab * h)
    output = model.vocab * h / tp if (not model.tied_embeddings or pp > 1) else 0.0
    final_norm = 2 * h
    if pp == 1:
        return layers + embedding + output + final_norm
    return layers + max(embedding, output + final_norm)


def activation_bytes_per_layer(
    model: ModelSpec,
    mbs: int,
    tp: int,
    sequence_parallel: bool,
    recompute: str,
    flash_attention: bool = False,
    cp: int = 1,
    capacity_factor: float = 1.0,
) -> float:
    """Stored activations of one layer for one micro-batch on one GPU (Korthikanti et al. 2022);
    fused (flash) attention stores no s×s scores, like selective recompute. With context parallelism a GPU holds
    s/cp of the sequence (its scores: s/cp queries against all s keys)."""
    s, b, h, a = model.seq, mbs, model.hidden, model.heads
    local = s / cp
    sb = local * b
    if recompute == "full":
        return 2 * sb * h / (tp if sequence_parallel else 1)
    copies = model.top_k * capacity_factor + model.shared_experts if model.moe else 1.0
    ffn = model.moe_ffn_hidden if model.moe else model.ffn_hidden
    if recompute == "op":
        return op_checkpoint_bytes(model, sb, tp, sequence_parallel, copies * ffn)
    mlp_width: float = (6 if model.gated_mlp else 4) * ffn
    if model.moe:  # each token's copies in its routed experts (and the shared ones), and their dispatched inputs
        mlp_width = copies * (mlp_width + 2 * h)
    # what tensor parallelism does not split without sequence parallelism (the norms' and the QKV and MLP inputs, the
    # two dropout masks: 10·h), then Q and the attention's output (2 + 2 a query width), K and V, and the MLP's
    replicated = 10 * sb * h
    linear_total = replicated + sb * (4 * model.q_dim + 4 * model.kv_dim + mlp_width)
    if sequence_parallel:
        linear = linear_total / tp
    else:
        linear = replicated + (linear_total - replicated) / tp
    scores = 0.0 if recompute == "selective" or flash_attention else 5 * a * local * s * b / tp
    return linear + scores


def op_checkpoint_bytes(model: ModelSpec, tokens: float, tp: int, sequence_parallel: bool, ffn: float) -> float:
    """What torchtitan's per-op selective checkpointing keeps of a layer, in bf16: its input, the attention's output
    and the outputs of every second matmul (Llama's wq, wk, wv, wo, w1, w3, w2 keep wq, wv, w1 and w2; a plain MLP's
    w1, w2 keep w1), and, with sequence parallelism, the reduce-scatters' outputs (its save list holds them).
    Column-parallel outputs and the attention's are split over tensor parallelism; w2's is a row-parallel GEMM's
    partial sums, whole on every rank; the layer's input is split only with sequence parallelism. A mixture of
    experts' is approximate (its router's matmul shifts which are kept)."""
    h = model.hidden
    split = model.q_dim + model.kv_dim + ffn + model.q_dim  # wq, wv, w1 and the attention's output
    block_input = h / (tp if sequence_parallel else 1)
    w2_output = h if model.gated_mlp else 0.0  # row-parallel: each rank's partial sums, whole
    reduce_scattered = 2 * h / tp if sequence_parallel and tp > 1 else 0.0  # wo's and w2's, kept as collectives
    return 2.0 * tokens * (split / tp + block_input + w2_output + reduce_scattered)


def in_flight_microbatch_layers(cfg: ParallelConfig, microbatches: int, layers: int) -> float:
    """Micro-batch·layers of activations the worst rank holds at once (gradient accumulation
    without pipelining holds one micro-batch)."""
    if cfg.pp == 1:
        return float(layers)
    return cfg.schedule.in_flight(cfg.pp, microbatches, cfg.vpp) * layers / cfg.vpp


def memory_per_gpu(
    model: ModelSpec, cluster: ClusterSpec, config: ParallelConfig, microbatches: int
) -> MemoryBreakdown:
    """Model state and activations per GPU on the worst stage, for ``microbatches`` per step."""
    cfg = config.with_dp(cluster.gpus)
    if cfg.layers_per_stage and cfg.pp > 1:  # the stages differ: the one nearest its limit
        return _fullest_rank_memory(model, cluster, cfg, microbatches)
    layers = layers_on_stage(model, cfg.pp)
    in_flight = in_flight_microbatch_layers(cfg, microbatches, layers)
    experts = layers * layer_params_on_gpu(model, cfg.tp, cfg.ep, cfg.expert_tp)[1]
    params = stage_params(model, cfg.tp, cfg.pp, ep=cfg.ep, etp=cfg.expert_tp)
    first = _breakdown(model, cluster, cfg, params, in_flight, experts, last_stage=cfg.pp == 1)
    if cfg.pp == 1:
        return first
    last_rank = cfg.output_rank  # it holds the output layer and the loss's buffers
    chunks = _chunks_held(cfg, microbatches, last_rank)
    last = _rank_memory(model, cluster, cfg, last_rank, cfg.stage_layers(model.layers)[last_rank], chunks)
    return max(first, last, key=lambda part: part.total)


def memory_per_pipeline_rank(
    model: ModelSpec, cluster: ClusterSpec, config: ParallelConfig, microbatches: int
) -> list[MemoryBreakdown]:
    """Model state and activations per GPU of each pipeline rank, first to last: its own layers (``layers_per_stage``,
    else the first ``L mod p`` ranks hold one more), the embedding on the first and the output layer on the last,
    and the activation chunks its schedule's action order holds at once (1F1B: p − r micro-batches on
    rank r, so the first rank holds the most)."""
    cfg = config.with_dp(cluster.gpus)
    if cfg.pp == 1:
        return [memory_per_gpu(model, cluster, cfg, microbatches)]
    return [
        _rank_memory(model, cluster, cfg, rank, layers, _chunks_held(cfg, microbatches, rank))
        for rank, layers in enumerate(cfg.stage_layers(model.layers))
    ]


FEW_RANKS = 6
"""Pipelines of this many ranks or fewer are broken down rank by rank (``bench/planner_search.py``)."""


def _fullest_rank_memory(
    model: ModelSpec, cluster: ClusterSpec, cfg: ParallelConfig, microbatches: int
) -> MemoryBreakdown:
    """``memory_per_pipeline_rank``'s largest, the first such rank, without a breakdown for every rank (a search
    asks it of 90,000 layouts of up to 64 ranks): a rank holding neither the embedding nor the output layer needs
    layers · (state a layer + chunks / v · activations a layer) plus what every rank holds, so the fullest of those
    is found by that product and only it, the first and the last rank are broken down."""
    stages = cfg.stage_layers(model.layers)
    if len(stages) <= FEW_RANKS:  # three breakdowns and the shortcut's own cost no fewer than one a rank
        return max(memory_per_pipeline_rank(model, cluster, cfg, microbatches), key=lambda part: part.total)
    ends = {0, cfg.output_rank}
    per_layer, experts_per_layer = layer_params_on_gpu(model, cfg.tp, cfg.ep, cfg.expert_tp)
    base = _breakdown(model, cluster, cfg, 0.0, 0.0, last_stage=False).total
    state = _breakdown(model, cluster, cfg, per_layer, 0.0, experts_per_layer, last_stage=False).total - base
    activation = _breakdown(model, cluster, cfg, 0.0, 1.0, last_stage=False).total - base
    middle: int | None = None
    most = -1.0
    for rank, layers in enumerate(stages):
        if rank in ends:
            continue
        need = layers * (state + _chunks_held(cfg, microbatches, rank) / cfg.vpp * activation)
        if need > most:
            middle, most = rank, need
    ranks = sorted(ends | ({middle} if middle is not None else set()))
    parts = [_rank_memory(model, cluster, cfg, r, stages[r], _chunks_held(cfg, microbatches, r)) for r in ranks]
    return max(parts, key=lambda part: part.total)


def _rank_memory(
    model: ModelSpec, cluster: ClusterSpec, cfg: ParallelConfig, rank: int, layers: int, chunks: int
) -> MemoryBreakdown:
    """One pipeline rank's memory: its ``layers``, the embedding on the first, the output layer and the loss's
    buffers on the last, ``chunks`` activation chunks held at once."""
    h = model.hidden
    per_layer, experts_per_layer = layer_params_on_gpu(model, cfg.tp, cfg.ep, cfg.expert_tp)
    embedding = model.vocab * h / cfg.tp + (model.embedding_params - model.vocab * h)
    output = model.vocab * h / cfg.tp + 2 * h  # the output layer (a tied embedding's copy) and the final norm
    last = rank == cfg.output_rank
    params = layers * per_layer + (embedding if rank == 0 else 0.0) + (output if last else 0.0)
    in_flight = chunks * layers / cfg.vpp
    return _breakdown(model, cluster, cfg, params, in_flight, layers * experts_per_layer, last_stage=last)


def _chunks_held(cfg: ParallelConfig, microbatches: int, rank: int) -> int:
    return _chunks_held_by_schedule(cfg.schedule, cfg.pp, microbatches, cfg.vpp, rank)


@functools.lru_cache(maxsize=4096)
def _chunks_held_by_schedule(schedule: Schedule, pp: int, microbatches: int, vpp: int, rank: int) -> int:
    """A pipeline rank's activation chunks held at once, from its action order. Past the orders' size limit (a very
    large global batch) the order of fewer micro-batches stands in where the worst rank's closed form has stopped
    growing by then (1F1B and the interleaved schedules hold at most p·v-ish chunks); otherwise every rank is taken
    to hold what the worst does. Cached: the search asks for the same few shapes across thousands of layouts."""
    worst = schedule.in_flight(pp, microbatches, vpp)
    for fewer in (microbatches, 4 * pp * vpp, 2 * pp * vpp):
        if fewer > microbatches or (fewer < microbatches and schedule.in_flight(pp, fewer, vpp) != worst):
            continue
        try:
            return _peak_chunks(schedule.rank_order(rank, pp, fewer, vpp))
        except ScheduleError:
            continue
    return worst


def _peak_chunks(actions: list[Action]) -> int:
    """Activation chunks held at once: each forward keeps one until its backward (or input backward) frees it."""
    held = peak = 0
    for action in actions:
        if action.kind == FORWARD:
            held += 1
            peak = max(peak, held)
        elif action.kind in (BACKWARD, BACKWARD_INPUT):
            held -= 1
    return peak


def _breakdown(
    model: ModelSpec,
    cluster: ClusterSpec,
    cfg: ParallelConfig,
    params: float,
    in_flight: float,
    expert_params: float = 0.0,
    *,
    last_stage: bool,
) -> MemoryBreakdown:
    """``expert_params`` of ``params`` are routed experts', whose replicas (and ZeRO shards) are tp·dp·cp/(etp·ep).
    ZeRO-3 with a pipeline keeps the weights gathered and the gradients whole through the step (FSDP under torchtitan's pipeline
    schedules: no reshard after forward, one reduction at the last micro-batch), so it holds what ZeRO-1 holds."""
    zero = 1 if cfg.zero == 3 and cfg.pp > 1 else cfg.zero
    # FSDP2 (ZeRO-3) keeps the sharded gradients in the sharded fp32 parameters' type, whatever it reduces in
    gradient_bytes = 4 if zero == 3 else GRAD_REDUCE_BYTES[cfg.grad_reduce]
    sizes = (BYTES_WEIGHTS, gradient_bytes, BYTES_OPTIMIZER)
    weights, gradients, optimizer = (
        _state(params - expert_params, cfg.replicas, zero, part, sizes[part])
        + _state(expert_params, cfg.expert_replicas, zero, part, sizes[part])
        for part in range(3)
    )
    per_layer = activation_bytes_per_layer(
        model, cfg.mbs, cfg.tp, cfg.sequence_parallel, cfg.recompute, cfg.flash_attention, cfg.cp, cfg.capacity_factor
    )
    activations = in_flight * per_layer
    if cfg.recompute == "full":
        activations += activation_bytes_per_layer(
            model, cfg.mbs, cfg.tp, cfg.sequence_parallel, "none", cfg.flash_attention, cfg.cp, cfg.capacity_factor
        )
    capacity = cluster.gpu.memory_gib * GIB
    reserve = max(RESERVE_FRACTION * capacity, RESERVE_MIN_GIB * GIB)
    return MemoryBreakdown(
        weights=weights,
        gradients=gradients,
        optimizer=optimizer,
        activations=activations,
        params_on_gpu=params,
        available=capacity - reserve,
        loss=loss_bytes(model, cfg) if last_stage else 0.0,
    )


def loss_bytes(model: ModelSpec, cfg: ParallelConfig) -> float:
    """The loss's buffers at the start of the backward, for one micro-batch (module docstring)."""
    return LOSS_BYTES_PER_LOGIT * cfg.mbs * model.seq / cfg.cp * model.vocab / cfg.tp


def _state(params: float, replicas: int, zero: int, part: int, size: int) -> float:
    """Bytes of weights (``part`` 0), gradients (1) or optimizer state (2), ``size`` bytes a parameter, for
    ``params`` held by ``replicas`` ranks: ZeRO-1/2/3 shard the optimizer, then the gradients, then the weights."""
    sharded = {0: (), 1: (2,), 2: (1, 2), 3: (0, 1, 2)}[zero]
    return params * size / (max(1, replicas) if part in sharded else 1)
