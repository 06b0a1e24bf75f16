"""Memory per GPU by part (docs/planner.md), on the worst pipeline stage.

Model state: mixed-precision Adam keeps 16 bytes per parameter, 2 weights + 2 gradients + 12
optimizer (fp32 master weights, momentum, variance); ZeRO-1/2/3 shard the 12, 14 or 16 of them over
the data-parallel group. Weights of GEMMs are split over tensor parallelism; norms and biases of
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

Activations in flight on the first stage, in micro-batch·layers: 1F1B p·L/p, GPipe m·L/p,
interleaved 1F1B (p·v + p − 1) chunks of L/(p·v) layers. Full recompute also rebuilds one layer's
whole activations during its backward: one layer's no-recompute activations are added.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bubblescope.analysis.planner.specs import ClusterSpec, ModelSpec, ParallelConfig
from bubblescope.analysis.schedule_orders import BACKWARD, BACKWARD_INPUT, FORWARD, Action
from bubblescope.analysis.schedules import ScheduleError

GIB = 1024**3
BYTES_WEIGHTS, BYTES_GRADS, BYTES_OPTIMIZER = 2, 2, 12
#: Kept free of model state and activations: CUDA context, NCCL buffers, allocator fragmentation and
#: temporary buffers (logits, communication staging). 10 % of the GPU, at least 4 GiB.
RESERVE_FRACTION, RESERVE_MIN_GIB = 0.10, 4.0


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per GPU on the worst stage; ``available`` is the GPU's memory less the reserve."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    params_on_gpu: float
    available: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations

    @property
    def fits(self) -> bool:
        return self.total <= self.available

    def gib(self) -> dict[str, float]:
        return {
            "weights": self.weights / GIB,
            "gradients": self.gradients / GIB,
            "optimizer": self.optimizer / GIB,
            "activations": self.activations / GIB,
            "total": self.total / GIB,
        }


def layers_on_stage(model: ModelSpec, pp: int, layers_per_stage: tuple[int, ...] = ()) -> int:
    """Layers on the fullest stage (uneven splits put the extra layers on some stages)."""
    return max(layers_per_stage) if layers_per_stage else math.ceil(model.layers / pp)


def layer_params_on_gpu(model: ModelSpec, tp: int, ep: int = 1) -> tuple[float, float]:
    """(all, routed experts') parameters of one layer on one GPU: GEMM weights split over tensor parallelism, the
    routed experts also over expert parallelism, norms and biases replicated."""
    experts = model.layer_expert_params / (tp * ep)
    replicated = model.layer_params - model.layer_matmul_params
    return model.layer_dense_matmul_params / tp + experts + replicated, experts


def stage_params(model: ModelSpec, tp: int, pp: int, layers_per_stage: tuple[int, ...] = (), ep: int = 1) -> float:
    """Parameters held by one GPU of the worst stage (first or last)."""
    h = model.hidden
    per_layer, _experts = layer_params_on_gpu(model, tp, ep)
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
    mlp_width: float = (6 if model.gated_mlp else 4) * model.ffn_hidden
    if model.moe:  # each token's copies in its routed experts (and the shared ones), and their dispatched inputs
        copies = model.top_k * capacity_factor + model.shared_experts
        mlp_width = copies * ((6 if model.gated_mlp else 4) * model.moe_ffn_hidden + 2 * h)
    linear_total = sb * (4 * h + 7 * h + 4 * model.kv_dim + 3 * h + mlp_width)
    replicated = 10 * sb * h
    if sequence_parallel:
        linear = linear_total / tp
    else:
        linear = replicated + (linear_total - replicated) / tp
    scores = 0.0 if recompute == "selective" or flash_attention else 5 * a * local * s * b / tp
    return linear + scores


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
        return max(memory_per_pipeline_rank(model, cluster, cfg, microbatches), key=lambda part: part.total)
    layers = layers_on_stage(model, cfg.pp)
    in_flight = in_flight_microbatch_layers(cfg, microbatches, layers)
    experts = layers * layer_params_on_gpu(model, cfg.tp, cfg.ep)[1]
    params = stage_params(model, cfg.tp, cfg.pp, ep=cfg.ep)
    return _breakdown(model, cluster, cfg, params, in_flight, experts)


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
    h = model.hidden
    per_layer, experts_per_layer = layer_params_on_gpu(model, cfg.tp, cfg.ep)
    embedding = model.vocab * h / cfg.tp + (model.embedding_params - model.vocab * h)
    output = model.vocab * h / cfg.tp + 2 * h  # the output layer (a tied embedding's copy) and the final norm
    chunks = _chunks_held(cfg, microbatches)
    out = []
    for rank, layers in enumerate(cfg.stage_layers(model.layers)):
        params = layers * per_layer + (embedding if rank == 0 else 0.0) + (output if rank == cfg.pp - 1 else 0.0)
        in_flight = chunks[rank] * layers / cfg.vpp
        out.append(_breakdown(model, cluster, cfg, params, in_flight, layers * experts_per_layer))
    return out


def _chunks_held(cfg: ParallelConfig, microbatches: int) -> list[int]:
    """Each pipeline rank's activation chunks held at once, from its action order; past the orders' size limit (a
    very large global batch) every rank is taken to hold what the worst does (the schedule's closed form)."""
    try:
        orders = cfg.schedule.build_orders(cfg.pp, microbatches, cfg.vpp)
        return [_peak_chunks(orders[rank]) for rank in range(cfg.pp)]
    except ScheduleError:
        return [cfg.schedule.in_flight(cfg.pp, microbatches, cfg.vpp)] * cfg.pp


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
) -> MemoryBreakdown:
    """``expert_params`` of ``params`` are routed experts', whose replicas (and ZeRO shards) are dp·cp/ep."""
    weights, gradients, optimizer = (
        _state(params - expert_params, cfg.replicas, cfg.zero, part)
        + _state(expert_params, cfg.replicas // cfg.ep, cfg.zero, part)
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
    )


def _state(params: float, replicas: int, zero: int, part: int) -> float:
    """Bytes of weights (``part`` 0), gradients (1) or optimizer state (2) for ``params`` held by ``replicas``
    ranks: ZeRO-1/2/3 shard the optimizer, then the gradients, then the weights over them."""
    sharded = {0: (), 1: (2,), 2: (1, 2), 3: (0, 1, 2)}[zero]
    size = (BYTES_WEIGHTS, BYTES_GRADS, BYTES_OPTIMIZER)[part]
    return params * size / (max(1, replicas) if part in sharded else 1)
