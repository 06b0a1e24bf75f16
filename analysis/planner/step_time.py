"""Step time from first principles, for one configuration on one cluster.

Per micro-batch, on one GPU of the slowest stage (each stage's layers, ``ParallelConfig.stage_layers``; the last
also runs the output layer and the loss):

* **GEMMs** — every matrix product of a layer (QKV, projection, MLP; attention scores and
  attention·V per head) is timed on the roofline: max(FLOPs / (peak·gemm), bytes / (HBM·hbm)); with
  ``precision="fp8"`` the four linear GEMMs (QKV, projection, the MLP's two) use the FP8 peak and pay for their
  dynamic scaling's casts in HBM traffic (``fp8_cast_seconds``). The
  backward pass runs two GEMMs of the same shape per forward GEMM (input and weight gradients).
  Small heads (head dim 64–160) make the attention GEMMs memory-bound; that is where size matters.
* **Fused (flash) attention** — the causal half of the two products' FLOPs at ``attention`` of the peak (times
  ``attention_kernel_share``: FlashAttention-2 at 0.55 of cuDNN's on Hopper), backward 2.7× (FlashAttention-2) or
  3.1× (cuDNN's) forward, as measured (``ATTENTION_BACKWARD_RATIO``, ``attention_seconds``).
* **Memory-bound kernels** (norms, softmax, dropout, GeLU, bias and residual adds) move about
  ``elementwise_traffic`` bytes of HBM per byte of the activations they leave behind (the
  Korthikanti stored-activation count, which is what those kernels write), twice that backward;
  ``eager_traffic`` times that without fused kernels (``compile=False``).
* **Output layer and loss** (last stage) — the logits GEMM, and the fp32 cross-entropy's HBM traffic, counted off
  Megatron-LM's (``LOSS_BYTES_FORWARD``, ``LOSS_BYTES_BACKWARD`` a logit).
* **Tensor parallelism** — per layer, two all-reduces forward and two backward (with sequence
  parallelism, all-gather + reduce-scatter pairs of the same volume), ring cost
  2(t−1)/t·bytes / (bandwidth·efficiency) + latency, over NVLink inside a node, else the network.
  Exposed in full unless ``tp_comm_overlap``: then up to ``tp_overlap`` of the layer's linear GEMM time hides them,
  but for the backward reduce-scatters of projections run apart (``unpipelined_reduce_scatter_seconds``).
* **Recompute** — full: the whole forward again (with its all-reduces); selective: the attention
  scores, softmax, dropout and attention·V again; op (torchtitan's per-op checkpointing): the matmuls it does not
  keep (wk, wo, w3; ``op_recomputed_gemm_seconds``) with their FP8 casts, every element-wise op, and the TP
  collectives whose outputs it does not keep (the all-gathers with sequence parallelism, else the all-reduces).
* **Pipeline** — two blocking point-to-point transfers (activation in, gradient in) per model chunk,
  each 1/t of the activation (Megatron's scatter/gather), over the network when stages sit in
  different nodes.

Step = m·T_stage / (1 − bubble) with the bubble from the schedule's closed form (for 1F1B:
(m + p − 1)·T_stage; where a rank's v chunks of layers are not equal the fill and drain run at its largest chunk,
``chunk_imbalance``), then the exposed part of the data-parallel gradient reduction (in ``grad_reduce``'s type;
ZeRO-3's gathers and reductions one layer ahead of each micro-batch's compute: ``zero3_exposed_seconds``; ZeRO-1/2's
weight gather under the next forward with ``overlap_param_gather``: ``gathered_under_forward``), the tied
embedding's gradient all-reduce between the first and last stage, and the optimizer step
(memory-bound: ``optimizer_bytes_per_param`` of HBM traffic per local parameter).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from bubblescope.analysis.planner.efficiencies import Efficiencies, efficiencies_for
from bubblescope.analysis.planner.memory import (
    activation_bytes_per_layer,
    layer_params_on_gpu,
    layers_on_stage,
    stage_params,
)
from bubblescope.analysis.planner.specs import GRAD_REDUCE_BYTES, ClusterSpec, GpuSpec, ModelSpec, ParallelConfig


@dataclass(frozen=True)
class StepTime:
    """Seconds per training step on the slowest rank, by part; ``total`` is the step time.

    compute, recompute, tp_comm, cp_comm, ep_comm, pp_comm are summed over the step's micro-batches; bubble is the
    pipeline's idle time; dp_comm the exposed part of the gradient reduction (plus the embedding
    all-reduce); optimizer the parameter update.
    """

    compute: float
    recompute: float
    tp_comm: float
    pp_comm: float
    bubble: float
    dp_comm: float
    optimizer: float
    microbatches: int
    bubble_fraction: float
    cp_comm: float = 0.0
    ep_comm: float = 0.0
    straggler: float = 0.0

    @property
    def total(self) -> float:
        return (
            self.compute
            + self.recompute
            + self.tp_comm
            + self.cp_comm
            + self.ep_comm
            + self.straggler
            + self.pp_comm
            + self.bubble
            + self.dp_comm
            + self.optimizer
        )


@dataclass(frozen=True)
class _Cost:
    """One piece of work per micro-batch: compute (``forward`` of it in the forward pass), recompute and
    communication seconds."""

    compute: float = 0.0
    recompute: float = 0.0
    comm: float = 0.0
    context: float = 0.0  # exposed context-parallel communication
    experts: float = 0.0  # expert parallelism's all-to-alls
    forward: float = 0.0  # the forward pass's share of ``compute``
    forward_comm: float = 0.0  # the forward pass's share of the exposed ``comm``, ``context`` and ``experts``

    def __add__(self, other: _Cost) -> _Cost:
        return _Cost(
            self.compute + other.compute,
            self.recompute + other.recompute,
            self.comm + other.comm,
            self.context + other.context,
            self.experts + other.experts,
            self.forward + other.forward,
            self.forward_comm + other.forward_comm,
        )

    def scale(self, factor: float) -> _Cost:
        return _Cost(
            self.compute * factor,
            self.recompute * factor,
            self.comm * factor,
            self.context * factor,
            self.experts * factor,
            self.forward * factor,
            self.forward_comm * factor,
        )

    @property
    def backward(self) -> float:
        """The backward pass, with what it recomputes."""
        return self.compute - self.forward + self.recompute

    @property
    def seconds(self) -> float:
        return self.compute + self.recompute + self.comm + self.context + self.experts

    @property
    def forward_wall(self) -> float:
        """The forward pass as the clock reads it: its compute and its exposed communication, the window the
        data-parallel gathers run under (they travel on their own stream while the pass computes or waits on TP)."""
        return self.forward + self.forward_comm

    @property
    def backward_wall(self) -> float:
        """The backward pass (with what it recomputes) as the clock reads it, likewise."""
        return self.seconds - self.forward_wall


def gemm_seconds(
    m: float, n: float, k: float, gpu: GpuSpec, eff: Efficiencies, batch: float = 1.0, peak_tflops: float = 0.0
) -> float:
    """Roofline time of ``batch`` (m×k)·(k×n) products at ``peak_tflops`` (default: the GPU's bf16 peak), with bf16
    operands' traffic."""
    flops = 2.0 * m * n * k * batch
    traffic = 2.0 * (m * k + k * n + m * n) * batch
    peak = peak_tflops or gpu.peak_tflops
    return max(flops / (peak * 1e12 * eff.gemm), traffic / (gpu.hbm_gbps * 1e9 * eff.hbm))


#: The share of a bf16 GEMM's efficiency (the fraction of its peak) an FP8 GEMM of the same shape reaches, measured, not
#: fitted: on an H200 (torch 2.11, cuBLASLt through ``torch._scaled_mm``, tensor-wise scales) every published
#: H100-class run's linear GEMMs reached 0.59-0.64 of the FP8 peak where bf16 reached 0.66-0.70 of its own, 0.88-0.92
#: of it over two runs (``bench/gpu_kernel_efficiency.py``); a whole Llama 3 70B layer ran 1.46× faster in FP8 than in
#: bf16, priced so 1.50× (1.62× at a share of 1; ``bench/gpu_layer_step.py``, docs/planner.md "Measured on an H200").
FP8_GEMM_SHARE = 0.90


def linear_peak_tflops(gpu: GpuSpec, precision: str) -> float:
    """The peak a layer's linear GEMMs run at, as bf16's efficiency reads it: FP8's times ``FP8_GEMM_SHARE`` where asked
    for (the caller checked the GPU has it)."""
    return gpu.fp8_tflops * FP8_GEMM_SHARE if precision == "fp8" else gpu.peak_tflops


def ring_seconds(
    bytes_: float, ranks: int, bandwidth_gbps: float, link_eff: float, eff: Efficiencies, passes: float
) -> float:
    """``passes`` ring phases (all-reduce 2, all-gather or reduce-scatter 1) over ``ranks``."""
    if ranks <= 1 or bytes_ <= 0:
        return 0.0
    return passes * (eff.collective_latency_s + (ranks - 1) / ranks * bytes_ / (bandwidth_gbps * 1e9 * link_eff))


def _tp_bandwidth(cluster: ClusterSpec, ranks: int, eff: Efficiencies) -> tuple[float, float]:
    if ranks <= cluster.gpus_per_node:
        return cluster.gpu.nvlink_gbps, eff.nvlink
    return cluster.gpu.network_gbps, eff.network


def layer_cost(model: ModelSpec, cluster: ClusterSpec, cfg: ParallelConfig, eff: Efficiencies) -> _Cost:
    """Forward + backward (+ recompute) of one transformer layer, one micro-batch, one GPU."""
    gpu, t, s, h = cluster.gpu, cfg.tp, model.seq, model.hidden
    local = s / cfg.cp  # context parallelism: this GPU's queries; its attention reads every key
    tokens = cfg.mbs * local
    parts = linear_gemm_seconds(model, cfg, gpu, eff, tokens)
    dense = sum(map(sum, parts))
    if model.moe:  # the router, in bf16
        dense += gemm_seconds(tokens, model.experts, h, gpu, eff)
    heads = cfg.mbs * model.heads / t
    attention, attention_backward = attention_seconds(model, cfg, gpu, eff, local, heads)
    capacity = cfg.capacity_factor
    stored = activation_bytes_per_layer(
        model, cfg.mbs, t, cfg.sequence_parallel, "none", cfg.flash_attention, cfg.cp, capacity
    )
    stored_scores = stored - activation_bytes_per_layer(
        model, cfg.mbs, t, cfg.sequence_parallel, "selective", cp=cfg.cp, capacity_factor=capacity
    )
    hbm = gpu.hbm_gbps * 1e9 * eff.hbm
    traffic = eff.elementwise_traffic * (1.0 if cfg.compile else eff.eager_traffic)
    elementwise = traffic * stored / hbm
    score_elementwise = traffic * stored_scores / hbm
    # two all-reduces (or all-gather + reduce-scatter pairs: the same ring volume) per pass: the attention's and the
    # MLP's (``mlp_tp_seconds``)
    tp_pass = ring_seconds(tp_pair_bytes(cfg, tokens * h), t, *_tp_bandwidth(cluster, t, eff), eff, passes=2)
    tp_pass += mlp_tp_seconds(model, cluster, cfg, eff, tokens)
    cast_forward, cast_backward = fp8_cast_seconds(model, cfg, hbm, tokens)
    forward = dense + attention + elementwise + cast_forward
    gradient_sums = input_gradient_sum_bytes(model, cfg, tokens) / hbm
    backward = 2 * dense + attention_backward + 2 * elementwise + cast_backward + gradient_sums
    rerun_gemms = {"full": dense, "op": op_recomputed_gemm_seconds(model, parts)}.get(cfg.recompute, 0.0)
    # the recomputed forward repeats its collectives: all of them (full; per-op without sequence parallelism, whose
    # all-reduces' outputs are not kept), or the two all-gathers (per-op keeps the reduce-scatters' outputs)
    rerun_passes = {"full": 1.0, "op": 0.5 if cfg.sequence_parallel else 1.0}.get(cfg.recompute, 0.0)
    # overlapped, a pass's TP collectives run under that pass's linear GEMMs (forward 1×, backward 2× the GEMM time)
    hidden_under = eff.tp_overlap * (3 * dense + rerun_gemms) if cfg.tp_comm_overlap else 0
    # (the GEMMs whose input gradients feed the unpipelined reduce-scatters still count: an approximation)
    unpipelined = unpipelined_reduce_scatter_seconds(model, cluster, cfg, eff, tokens)
    collectives = (2 + rerun_passes) * tp_pass
    comm = unpipelined + max(0.0, collectives - unpipelined - hidden_under)
    context = cp_seconds(model, cluster, cfg, eff, attention, attention_backward)
    experts = ep_seconds(model, cluster, cfg, eff)
    # the forward's share of the exposed collectives: its pass's volume among those that could hide (the unpipelined
    # reduce-scatters are the backward's); one of the 2 + rerun passes of CP's and EP's transfers
    pipelined = collectives - unpipelined
    forward_tp = (comm - unpipelined) * tp_pass / pipelined if pipelined > 0 else 0.0
    forward_comm = forward_tp + (context + experts) / (2 + rerun_passes)
    if cfg.recompute == "full":
        return _Cost(forward + backward, forward, comm, context, experts, forward, forward_comm)
    if cfg.recompute == "selective":
        return _Cost(forward + backward, attention + score_elementwise, comm, context, experts, forward, forward_comm)
    if cfg.recompute == "op":  # the rerun matmuls with their FP8 casts, every element-wise op, unfused attention
        casts = cast_forward * rerun_gemms / dense if dense else 0.0
        unfused = 0.0 if cfg.flash_attention else attention + score_elementwise
        rerun = rerun_gemms + casts + elementwise + unfused
        return _Cost(forward + backward, rerun, comm, context, experts, forward, forward_comm)
    return _Cost(forward + backward, 0.0, comm, context, experts, forward, forward_comm)


def unpipelined_reduce_scatter_seconds(
    model: ModelSpec, cluster: ClusterSpec, cfg: ParallelConfig, eff: Efficiencies, tokens: float
) -> float:
    """The backward's reduce-scatters TP overlap cannot hide, per micro-batch: torch's async TP pipelines a
    reduce-scatter with the one matmul that produces its input (``_find_producer_matmul`` in
    ``torch/_inductor/fx_passes/micro_pipeline_tp.py``), and the input gradient of projections run apart
    (``projection_shares``: wq, wk and wv, a dense MLP's w1 and w3) is the sum of their matmuls, so the sequence-parallel
    reduce-scatter of that gradient, one bf16 activation, runs whole after them. 0 without TP overlap or sequence
    parallelism, or with fused projections (one GEMM's gradient, which Megatron's TP overlap hides as well)."""
    if not (cfg.tp_comm_overlap and cfg.sequence_parallel):
        return 0.0
    inputs = [index for index in projection_shares(model, cfg) if index == 0 or not model.moe]
    one = ring_seconds(2.0 * tokens * model.hidden, cfg.tp, *_tp_bandwidth(cluster, cfg.tp, eff), eff, passes=1)
    return len(inputs) * one


def mlp_tp_seconds(
    model: ModelSpec, cluster: ClusterSpec, cfg: ParallelConfig, eff: Efficiencies, tokens: float
) -> float:
    """The MLP's tensor-parallel all-gather and reduce-scatter of one pass: a dense MLP's activations over tp; a mixture
    of experts' routed copies (top_k·capacity a token, etp/tp of the tp group's tokens on each of the experts' own
    tensor-parallel ranks, gathered after the all-to-all as Megatron's dispatcher does) over etp ranks, none at etp 1,
    plus shared experts' activations over tp (Megatron's shared experts keep the dense layout)."""
    h, t = model.hidden, cfg.tp
    if not model.moe:
        return ring_seconds(tp_pair_bytes(cfg, tokens * h), t, *_tp_bandwidth(cluster, t, eff), eff, passes=2)
    etp = cfg.expert_tp
    routed = 2.0 * tokens * h * model.top_k * cfg.capacity_factor * etp / t
    seconds = ring_seconds(routed, etp, *_tp_bandwidth(cluster, etp, eff), eff, passes=2)
    if model.shared_experts:
        seconds += ring_seconds(2.0 * tokens * h, t, *_tp_bandwidth(cluster, t, eff), eff, passes=2)
    return seconds


#: Bytes an FP8 activation or gradient takes in a tensor-parallel all-gather.
FP8_GATHER_BYTES = 1.0


def tp_pair_bytes(cfg: ParallelConfig, elements: float) -> float:
    """The bytes a phase of one sequence-parallel all-gather + reduce-scatter pair moves, on average, for ``elements``
    activations: 2 each in bf16; with ``precision="fp8"`` the all-gather moves the FP8 input (forward) or output
    gradient (backward), 1 byte, and the reduce-scatter bf16 partial sums, 2 (torchao's ``Float8ColwiseParallel`` /
    ``Float8RowwiseParallel``, which torchtitan runs with Float8 and TP; Transformer Engine's FP8 linears gather
    their FP8 input too)."""
    if cfg.precision == "fp8" and cfg.sequence_parallel:
        return (FP8_GATHER_BYTES + 2.0) / 2 * elements
    return 2.0 * elements


def op_recomputed_gemm_seconds(model: ModelSpec, parts: list[list[float]]) -> float:
    """The matmuls torchtitan's per-op checkpointing runs again in the backward (``memory.op_checkpoint_bytes`` keeps
    the others'), from ``linear_gemm_seconds``' four GEMMs: wk (its own GEMM with separate projections, else its share
    of the QKV GEMM), the projection wo, and w3 (the gated MLP's second GEMM, or half its fused first) or a plain MLP's
    w2."""
    qkv, projection, up, down = parts
    q, k = model.q_dim, model.kv_dim
    wk = qkv[1] if len(qkv) == 3 else sum(qkv) * k / (q + 2 * k)
    if not model.gated_mlp:
        return wk + sum(projection) + sum(down)
    return wk + sum(projection) + (up[1] if len(up) == 2 else sum(up) / 2)


def projection_shares(model: ModelSpec, cfg: ParallelConfig) -> dict[int, tuple[float, ...]]:
    """The ``linear_shapes`` GEMMs that run apart (``cfg.projections``), each as the shares of its width its parts take:
    QKV as wq, wk and wv (``separate``), a gated MLP's first as w1 and w3 (``separate``, ``fused_qkv``)."""
    q, k = model.q_dim, model.kv_dim
    shares: dict[int, tuple[float, ...]] = {}
    if cfg.projections == "separate":
        shares[0] = (q / (q + 2 * k), k / (q + 2 * k), k / (q + 2 * k))
    if cfg.projections != "fused" and model.gated_mlp:
        shares[2] = (0.5, 0.5)
    return shares


def linear_gemm_seconds(
    model: ModelSpec, cfg: ParallelConfig, gpu: GpuSpec, eff: Efficiencies, tokens: float
) -> list[list[float]]:
    """Seconds of a layer's four linear GEMMs (``linear_shapes``) on one GPU, each as the GEMMs it runs as: one, or its
    parts apart (``projection_shares``), each reading the whole input. A narrow one sits on the roofline's memory side:
    a TP 8 rank's wk of Llama 3 is 128 columns wide."""
    peak = linear_peak_tflops(gpu, cfg.precision)
    return [
        [gemm_seconds(rows, width, depth, gpu, eff, peak_tflops=peak) for rows, depth, width in parts]
        for parts in linear_gemms(model, cfg, tokens)
    ]


def linear_gemms(model: ModelSpec, cfg: ParallelConfig, tokens: float) -> list[list[tuple[float, float, float]]]:
    """(rows, depth, width) of each GEMM a layer's linear layers run on one GPU: ``linear_shapes``' four, each as the
    GEMMs it runs as, one or its parts apart (``projection_shares``)."""
    shares = projection_shares(model, cfg)
    return [
        [(rows, depth, width * share) for share in shares.get(index, (1.0,))]
        for index, (rows, depth, width, _) in enumerate(linear_shapes(model, cfg, tokens))
    ]


def input_gradient_sum_bytes(model: ModelSpec, cfg: ParallelConfig, tokens: float) -> float:
    """HBM bytes one layer's backward spends summing an input's gradients where projections apart read the same input
    (``projection_shares``): wq, wk and wv's three, w1 and w3's two, each the size of the whole input (bf16; the
    gathered sequence under sequence parallelism, which the TP degree does not shrink). Compiled, one fused kernel
    reads the n gradients and writes their sum (n + 1 passes); eager, autograd adds them in pairs (3 passes an add).
    Fused projections produce the one gradient in their GEMM."""
    shapes = linear_shapes(model, cfg, tokens)
    return sum(
        (len(parts) + 1 if cfg.compile else 3 * (len(parts) - 1)) * 2.0 * shapes[index][0] * model.hidden
        for index, parts in projection_shares(model, cfg).items()
    )


#: FP8 with dynamic (tensor-wise) scaling, as Transformer Engine's and torchao's Float8 linears do: every bf16 operand
#: of a linear GEMM is read once for its absolute maximum and once to cast, and written back in one byte (5 bytes an
#: element); the backward's transposed copies of the FP8 input and weight read and write one byte each (2).
FP8_CAST_BYTES = 5.0
FP8_TRANSPOSE_BYTES = 2.0


def linear_shapes(model: ModelSpec, cfg: ParallelConfig, tokens: float) -> list[tuple[float, float, float, float]]:
    """(rows, k, n, weights) of a layer's four linear GEMMs on one GPU: QKV, the projection, the MLP's two (a mixture
    of experts' routed and shared rows as one grouped GEMM); ``weights`` is how many k×n matrices the GPU holds for it
    (the experts it hosts, ``experts/ep``, each ``tp/etp`` such matrices when the experts' own tensor parallelism is
    narrower, plus the shared ones). A GPU's routed FLOPs do not depend on etp: at etp < tp it computes tp/etp times
    fewer rows, each tp/etp times wider."""
    h, t = model.hidden, cfg.tp
    width = model.moe_ffn_hidden if model.moe else model.ffn_hidden
    rows = tokens * (model.top_k * cfg.capacity_factor + model.shared_experts) if model.moe else tokens
    held = model.experts / cfg.ep * t / cfg.expert_tp + model.shared_experts if model.moe else 1.0
    up = width * (2 if model.gated_mlp else 1)
    return [
        (tokens, h, (model.q_dim + 2 * model.kv_dim) / t, 1.0),
        (tokens, model.q_dim / t, h, 1.0),
        (rows, h, up / t, held),
        (rows, width / t, h, held),
    ]


def fp8_cast_seconds(model: ModelSpec, cfg: ParallelConfig, hbm_bytes_s: float, tokens: float) -> tuple[float, float]:
    """The HBM time of FP8's casts around a layer's linear GEMMs, forward and backward (0 in bf16): forward casts each
    input and weight; backward casts each output gradient (``FP8_CAST_BYTES``) and transposes the FP8 input and
    weight for the weight and input gradients (``FP8_TRANSPOSE_BYTES``); what sequence parallelism gathers in FP8 is
    cast on a rank's share (``sharded_cast_elements``), and so are the weights ZeRO gathers in FP8 (``fp8_all_gather``:
    ``gathered_weight_cast_share``)."""
    if cfg.precision != "fp8":
        return 0.0, 0.0
    shapes = linear_shapes(model, cfg, tokens)
    operands = sum(rows * k + weights * k * n for rows, k, n, weights in shapes)
    gradients = sum(rows * n for rows, _, n, _ in shapes)
    weight_casts = sum(
        weights * k * n * gathered_weight_cast_share(model, cfg, index)
        for index, (_, k, n, weights) in enumerate(shapes)
    )
    cast_inputs = sum(rows * k for rows, k, _, _ in shapes) + weight_casts
    cast_inputs -= sharded_cast_elements(model, cfg, shapes, inputs=True)
    cast_gradients = gradients - sharded_cast_elements(model, cfg, shapes, inputs=False)
    forward = FP8_CAST_BYTES * cast_inputs / hbm_bytes_s
    backward = (FP8_CAST_BYTES * cast_gradients + FP8_TRANSPOSE_BYTES * operands) / hbm_bytes_s
    return forward, backward


def gathered_weight_cast_share(model: ModelSpec, cfg: ParallelConfig, shape: int) -> float:
    """The share of a ``linear_shapes`` GEMM's weights a GPU casts to FP8 itself: all of them, unless ZeRO gathers them
    in FP8 (``fp8_all_gather``), which casts each rank's shard before the all-gather (torchao's FSDP float8 all-gather,
    torchtitan's ``enable_fsdp_float8_all_gather``: "cast high precision weights (1/N on each rank) into float8, and
    perform float8 all-gather"; Megatron's ``--fp8-param-gather`` casts the shard in the optimizer's step): 1/N of
    them, N the ranks the weights are sharded over (the routed experts' own replicas for a mixture's MLP)."""
    if not cfg.fp8_all_gather:
        return 1.0
    return 1.0 / (cfg.expert_replicas if model.moe and shape >= 2 else cfg.replicas)


def sharded_cast_elements(
    model: ModelSpec, cfg: ParallelConfig, shapes: list[tuple[float, float, float, float]], inputs: bool
) -> float:
    """The elements FP8 does not cast because sequence parallelism casts them on a rank's 1/tp share before gathering
    them in FP8: the column-parallel GEMMs' inputs (QKV's, a dense MLP's first; ``inputs``) and the row-parallel
    GEMMs' output gradients (the projection's, a dense MLP's second), as torchao's ``Float8ColwiseParallel`` /
    ``Float8RowwiseParallel`` and Transformer Engine's sequence-parallel FP8 linears cast before the all-gather."""
    if not cfg.sequence_parallel or cfg.tp <= 1:
        return 0.0
    not_cast = 1 - 1 / cfg.tp
    picked = (0, 2) if inputs else (1, 3)
    dense = [index for index in picked if index < 2 or not model.moe]
    return sum(not_cast * shapes[i][0] * (shapes[i][1] if inputs else shapes[i][2]) for i in dense)


#: FlashAttention-2's forward efficiency over cuDNN's fused attention's on Hopper, measured on an H200 (torch 2.11's
#: SDPA backends, every H100-class published run's heads, sequence and micro-batch): 0.44-0.58, median 0.55
#: (``bench/gpu_kernel_efficiency.py``, 2026-11-30; forward + backward 0.54-0.60, median 0.58, which the backward
#: ratios below give as 0.61). Elsewhere (A100: FlashAttention-2 is the faster) the two forwards are priced alike.
FLASH2_SHARE_ON_HOPPER = 0.55
HOPPER = ("H100", "H200")
#: Fused attention's backward over its forward, by kernel, measured on an H200 (torch 2.11, ``bench/gpu_kernel_
#: efficiency.py``: every published H100-class run's heads, sequence and micro-batch): FlashAttention-2 2.43-3.06,
#: median 2.7; cuDNN's 2.80-3.28, median 3.1. FLOPs alone say 2.5 (FlashAttention-2, §3.1: the scores recomputed and
#: four more products); the backward's products run further below the peak than the forward's. Measured on Hopper
#: alone, applied on every GPU (the A100 calibration rows run unfused attention; the B200's fused).
ATTENTION_BACKWARD_RATIO = {"flash2": 2.7, "cudnn": 3.1}


def attention_kernel_share(gpu: GpuSpec, kernel: str) -> float:
    """The share of ``Efficiencies.attention`` (cuDNN's kernel, where the GPU has it fitted or measured) ``kernel`` reaches."""
    return FLASH2_SHARE_ON_HOPPER if kernel == "flash2" and gpu.name.upper().startswith(HOPPER) else 1.0


def attention_seconds(
    model: ModelSpec, cfg: ParallelConfig, gpu: GpuSpec, eff: Efficiencies, queries: float, heads: float
) -> tuple[float, float]:
    """Attention's forward and backward seconds for ``queries`` queries against the sequence's keys, ``heads`` heads.

    Fused (flash) attention keeps the scores on chip and skips the blocks a causal mask hides: half of the
    4·q·s·d FLOPs a head's two products take forward, at ``eff.attention`` of the peak; its backward recomputes the
    scores and runs four more products, 2.5× the forward's FLOPs (FlashAttention-2, §3.1) and, measured,
    ``ATTENTION_BACKWARD_RATIO`` × its time. Unfused attention writes the
    full s×s scores (the mask applied after): two GEMMs on the roofline forward, twice that backward."""
    if cfg.flash_attention:
        reach = eff.attention * attention_kernel_share(gpu, cfg.attention_kernel)
        forward = 2.0 * queries * model.seq * model.head_dim * heads / (gpu.peak_tflops * 1e12 * reach)
        return forward, ATTENTION_BACKWARD_RATIO[cfg.attention_kernel] * forward
    forward = gemm_seconds(queries, model.seq, model.head_dim, gpu, eff, heads) + gemm_seconds(
        queries, model.head_dim, model.seq, gpu, eff, heads
    )
    return forward, 2 * forward


def ep_seconds(model: ModelSpec, cluster: ClusterSpec, cfg: ParallelConfig, eff: Efficiencies) -> float:
    """Expert parallelism's all-to-alls of one layer and micro-batch, exposed: each GPU sends its tokens' routed
    copies, b·(s/cp)/t · top_k · capacity · h · 2 bytes, spread evenly over the ep ranks, at dispatch and at combine,
    forward and backward (four; six with full recompute). The ep ranks sit next to each other after the experts' own
    tensor-parallel ranks (Megatron's expert rank order, etp then ep, context parallelism folded into them): those in
    this GPU's node take their share over NVLink, the rest over this GPU's network link, both at once; the slower of
    the two sets the time. With ``deepep`` or ``hybridep`` a token crosses the network once to each other node its
    experts sit on (``remote_nodes_per_token``), and every routed copy but those for the GPU it lands on is fanned
    out over NVLink: (in-node ranks − 1)/(in-node ranks) of them."""
    if not model.moe or cfg.ep == 1:
        return 0.0
    tokens = cfg.mbs * model.seq / cfg.cp / cfg.tp  # this GPU's sequence-parallel share
    routed_bytes = tokens * model.top_k * cfg.capacity_factor * model.hidden * 2
    in_node = min(cfg.ep, max(1, cluster.gpus_per_node // cfg.expert_tp))  # ep ranks in this GPU's node
    if cfg.dispatcher == "alltoall":
        over_nvlink = (in_node - 1) / cfg.ep * routed_bytes
        over_network = (cfg.ep - in_node) / cfg.ep * routed_bytes
    else:
        over_nvlink = (in_node - 1) / in_node * routed_bytes
        over_network = tokens * remote_nodes_per_token(model, cfg.ep, in_node) * model.hidden * 2
    nvlink = over_nvlink / (cluster.gpu.nvlink_gbps * 1e9 * eff.nvlink)
    network = over_network / (cluster.gpu.network_gbps * 1e9 * eff.network)
    return (6 if cfg.recompute == "full" else 4) * (eff.collective_latency_s + max(nvlink, network))


def remote_nodes_per_token(model: ModelSpec, ep: int, in_node: int) -> float:
    """Other nodes a token's top_k experts sit on, on average: the ep ranks span ep/in_node nodes of
    experts/nodes experts each, and a token picks top_k distinct experts evenly (the balanced routing the published
    MoE runs force): (nodes − 1)·(1 − C(E − E/nodes, k)/C(E, k))."""
    nodes = -(-ep // in_node)  # a partly filled last node counts
    if nodes == 1:
        return 0.0
    experts, k = model.experts, model.top_k
    missed = math.comb(experts - experts // nodes, k) / math.comb(experts, k)  # none of its experts on that node
    return (nodes - 1) * (1.0 - missed)


def cp_seconds(
    model: ModelSpec,
    cluster: ClusterSpec,
    cfg: ParallelConfig,
    eff: Efficiencies,
    attention_s: float,
    attention_backward_s: float,
) -> float:
    """Exposed context-parallel communication of one layer and micro-batch: every rank needs the sequence's keys
    and values, 4·b·s·k/t bytes (K and V, bf16; k the K/V width attention receives: kv_heads·head_dim, or
    heads·head_dim with ``kv_repeated``), gathered over the cp ranks.

    ``p2p`` (ring attention, Transformer Engine's) passes each block on while attending the previous one, once
    forward (twice with full recompute) and twice backward (the blocks again, and their gradients): only what
    attention does not cover is exposed.

    ``allgather`` is torch's context parallelism (``torch.distributed.tensor.experimental._attention``,
    ``_templated_ring_attention`` and its backward), attention in cp load-balanced blocks of equal work: the keys
    and values are all-gathered once, under the first block (forward, and again in the recomputed forward and the
    backward), so what the gather takes beyond a block's attention is exposed; the backward then passes the key and
    value gradients on after every block, the rank's whole share in fp32 (``convert_to_f32``: 2·bytes/cp), each
    under the next block's backward, and waits for the last one after the loop."""
    if cfg.cp == 1:
        return 0.0
    width = model.q_dim if cfg.kv_repeated else model.kv_dim
    kv_bytes = 4.0 * cfg.mbs * model.seq * width / cfg.tp
    in_node = cfg.tp * cfg.cp <= cluster.gpus_per_node
    bandwidth, link_eff = (cluster.gpu.nvlink_gbps, eff.nvlink) if in_node else (cluster.gpu.network_gbps, eff.network)
    one = ring_seconds(kv_bytes, cfg.cp, bandwidth, link_eff, eff, passes=1)
    forward_passes = 2 if cfg.recompute == "full" else 1
    if cfg.cp_comm == "allgather":
        block, block_backward = attention_s / cfg.cp, attention_backward_s / cfg.cp
        gradient_step = eff.collective_latency_s + 2.0 * kv_bytes / cfg.cp / (bandwidth * 1e9 * link_eff)
        gathers = forward_passes * max(0.0, one - block) + max(0.0, one - block_backward)
        return gathers + (cfg.cp - 1) * max(0.0, gradient_step - block_backward) + gradient_step
    return forward_passes * max(0.0, one - attention_s) + max(0.0, 2 * one - attention_backward_s)


#: HBM bytes per logit of the fp32 softmax cross-entropy, counted off Megatron-LM's vocab-parallel cross-entropy
#: (``megatron/core/tensor_parallel/cross_entropy.py`` at d98e8a64dd; torchtitan's ``cross_entropy(pred.float())``
#: moves about as many): forward the bf16 logits cast to fp32 (read 2, write 4), their maximum (read 4), then the
#: maximum subtracted, the exponential and the division by the sum, each in place (read 4, write 4), and the sum (read
#: 4): 38; backward the softmax scaled by the loss's gradient in place (read 4, write 4), cast back to bf16 (read 4,
#: write 2): 14.
LOSS_BYTES_FORWARD = 38.0
LOSS_BYTES_BACKWARD = 14.0


def output_layer_cost(model: ModelSpec, cluster: ClusterSpec, cfg: ParallelConfig, eff: Efficiencies) -> _Cost:
    """Logits GEMM forward and backward plus the fp32 softmax cross-entropy (``LOSS_BYTES_FORWARD`` and
    ``LOSS_BYTES_BACKWARD`` of HBM traffic a logit), on the last stage."""
    gpu, t, h = cluster.gpu, cfg.tp, model.hidden
    tokens = cfg.mbs * model.seq / cfg.cp
    gemm = gemm_seconds(tokens, model.vocab / t, h, gpu, eff)
    per_logit_byte = tokens * model.vocab / t / (gpu.hbm_gbps * 1e9 * eff.hbm)
    loss, loss_backward = LOSS_BYTES_FORWARD * per_logit_byte, LOSS_BYTES_BACKWARD * per_logit_byte
    bandwidth, link_eff = _tp_bandwidth(cluster, t, eff)
    comm = 2 * ring_seconds(2.0 * tokens * h, t, bandwidth, link_eff, eff, passes=1)
    return _Cost(3 * gemm + loss + loss_backward, 0.0, comm, forward=gemm + loss, forward_comm=comm / 2)


def p2p_seconds(model: ModelSpec, cluster: ClusterSpec, cfg: ParallelConfig, eff: Efficiencies) -> float:
    """Blocking pipeline transfers per micro-batch on one stage: activation in and gradient in, per chunk."""
    if cfg.pp == 1:
        return 0.0
    message = 2.0 * cfg.mbs * model.seq / cfg.cp * model.hidden / cfg.tp
    crosses_nodes = cfg.tp * cfg.cp * cfg.pp > cluster.gpus_per_node  # a stage spans tp·cp GPUs
    bandwidth = cluster.gpu.network_gbps * eff.network if crosses_nodes else cluster.gpu.nvlink_gbps * eff.nvlink
    one = eff.collective_latency_s + message / (bandwidth * 1e9)
    return 2 * cfg.vpp * one


def dp_seconds(
    model: ModelSpec,
    cluster: ClusterSpec,
    cfg: ParallelConfig,
    eff: Efficiencies,
    last_backward_s: float,
    forward_s: float,
    microbatches: int,
) -> float:
    """Data parallelism's exposed communication per step, plus the tied embedding's all-reduce between the first
    and the last stage. Gradients travel in ``grad_reduce``'s type, weights in bf16 (the layers' linear weights in FP8
    with ``fp8_all_gather``: ``gathered_weight_bytes``). ZeRO 0–2: the gradients'
    all-reduce (or reduce-scatter, then the weights' all-gather), of which ``dp_overlap`` of the last micro-batch's
    backward hides some (gradients are accumulated locally before it, so only that pass can); with
    ``overlap_param_gather`` the all-gather runs under the next step's first forward instead
    (``gathered_under_forward``). ZeRO-3: per
    micro-batch, ``zero3_exposed_seconds``; under a pipeline, torchtitan's way: the weights gathered once under the
    first micro-batch's forward and kept, the gradients reduced once after the last backward, where torch's schedules
    run FSDP's post-backward (``perform_reduce_grad``), with nothing left to hide it. Under ZeRO-3 ``forward_s`` and
    ``last_backward_s`` are the passes as the clock reads them (``_Cost.forward_wall``, ``backward_wall``): compute and
    the exposed TP, CP and EP transfers, which FSDP's prefetch stream runs under as it runs under compute; under ZeRO
    0-2 the passes' compute, which ``dp_overlap`` was fitted on."""
    params = stage_params(model, cfg.tp, cfg.pp, cfg.layers_per_stage, cfg.ep, cfg.expert_tp)
    experts = stage_expert_params(model, cfg)
    layers = layers_on_stage(model, cfg.pp, cfg.layers_per_stage)
    group_in_node = cfg.tp * cfg.pp * cfg.replicas <= cluster.gpus_per_node
    bandwidth, link_eff = (
        (cluster.gpu.nvlink_gbps, eff.nvlink) if group_in_node else (cluster.gpu.network_gbps, eff.network)
    )
    if not group_in_node and min(cfg.replicas, cluster.nodes) > cluster.nodes_per_leaf:
        bandwidth /= cluster.oversubscription  # the group spans more nodes than a leaf holds: shared uplinks
    passes = 3.0 if cfg.zero == 3 else 2.0

    def one_pass(dense_bytes: float, expert_bytes: float) -> float:
        dense = ring_seconds(dense_bytes, cfg.replicas, bandwidth, link_eff, eff, 1)
        return dense + ring_seconds(expert_bytes, cfg.expert_replicas, bandwidth, link_eff, eff, 1)

    grad_bytes = GRAD_REDUCE_BYTES[cfg.grad_reduce]
    latency = dp_latency_seconds(grad_bytes * params, cfg.replicas, group_in_node, eff, passes)
    gather = one_pass(*gathered_weight_bytes(model, cfg, params, experts))
    reduce_scatter = one_pass(grad_bytes * (params - experts), grad_bytes * experts)
    if cfg.zero == 3 and cfg.pp > 1:  # gathered once for the step, reduced once after its last micro-batch
        reduce = gathered_under_forward(gather, forward_s, layers) + reduce_scatter + latency
    elif cfg.zero == 3:  # every micro-batch gathers and reduces
        exposed = zero3_exposed_seconds(gather, reduce_scatter, forward_s, last_backward_s, layers)
        reduce = microbatches * (exposed + latency)
    elif cfg.zero == 0:  # an all-reduce: two passes of the gradients
        reduce = max(0.0, 2 * reduce_scatter + latency - eff.dp_overlap * last_backward_s)
    elif cfg.overlap_param_gather:
        # the gradients' shards reduce-scattered (with both passes' tree latency); the weights gathered under the next
        # step's first forward. Where the backward hid the whole sum, this costs the first layer's share, G/L, more.
        reduce = max(0.0, reduce_scatter + latency - eff.dp_overlap * last_backward_s)
        reduce += gathered_under_forward(gather, forward_s, layers)
    else:  # the gradients' shards reduce-scattered, the updated weights all-gathered
        reduce = max(0.0, reduce_scatter + gather + latency - eff.dp_overlap * last_backward_s)
    embedding = 0.0
    if cfg.pp > 1 and model.tied_embeddings:
        crosses = cfg.tp * cfg.cp * cfg.pp > cluster.gpus_per_node
        bw, link = (cluster.gpu.network_gbps, eff.network) if crosses else (cluster.gpu.nvlink_gbps, eff.nvlink)
        embedding = ring_seconds(grad_bytes * model.vocab * model.hidden / cfg.tp, 2, bw, link, eff, passes=2)
    return reduce + embedding


def gathered_weight_bytes(model: ModelSpec, cfg: ParallelConfig, params: float, experts: float) -> tuple[float, float]:
    """Bytes one all-gather of a stage's weights moves per GPU's shard group, (dense, routed experts'): bf16, 2 bytes a
    weight; with ``fp8_all_gather`` the layers' linear weights (and every expert's) in FP8, one byte, the embedding,
    output layer and norms still in bf16."""
    if not cfg.fp8_all_gather:
        return 2.0 * (params - experts), 2.0 * experts
    linear = layers_on_stage(model, cfg.pp, cfg.layers_per_stage) * model.layer_dense_matmul_params / cfg.tp
    return 2.0 * (params - experts) - linear, experts


def gathered_under_forward(gather_s: float, forward_s: float, layers: int) -> float:
    """Weights gathered once, under a micro-batch's forward over the stage's ``layers`` (ZeRO-3 under a pipeline,
    ZeRO-1/2 with ``overlap_param_gather``): the forward waits for the first layer's share, and for whatever of the
    gather outlasts it."""
    return max(0.0, gather_s - forward_s) + gather_s / max(layers, 1)


def zero3_exposed_seconds(gather_s: float, reduce_s: float, forward_s: float, backward_s: float, layers: int) -> float:
    """ZeRO-3 (FSDP) per micro-batch: each layer's weights are gathered before its forward and again before its
    backward, and its gradients reduce-scattered after it, one layer ahead of the compute (FSDP2's prefetch,
    DeepSpeed's): the gathers hide under the forward, the gathers and reductions under the backward, except the first
    layer's gather and the last layer's reduction."""
    edges = (gather_s + reduce_s) / max(layers, 1)
    return max(0.0, gather_s - forward_s) + max(0.0, gather_s + reduce_s - backward_s) + edges


def stage_expert_params(model: ModelSpec, cfg: ParallelConfig) -> float:
    """The routed experts' parameters one GPU of the fullest stage holds (0 for a dense model)."""
    return (
        layers_on_stage(model, cfg.pp, cfg.layers_per_stage)
        * layer_params_on_gpu(model, cfg.tp, cfg.ep, cfg.expert_tp)[1]
    )


def dp_latency_seconds(grad_bytes: float, replicas: int, in_node: bool, eff: Efficiencies, passes: float) -> float:
    """What a data-parallel reduction over many replicas costs beyond its bytes: every bucket's collective walks a
    tree of log2(n) network steps per pass, 2·log2(n) an all-reduce (none inside a node: one NVLink switch hop)."""
    if replicas <= 1 or in_node:
        return 0.0
    buckets = math.ceil(grad_bytes / eff.bucket_bytes)
    return buckets * passes / 2 * 2 * math.ceil(math.log2(replicas)) * eff.hop_latency_s


def straggler_seconds(step_s: float, ranks: int, eff: Efficiencies) -> float:
    """The wait for the slowest of ``ranks`` ranks each step: σ·√(2 ln n) of the step (the expected maximum of n
    normal draws), σ = ``rank_jitter``."""
    return step_s * eff.rank_jitter * math.sqrt(2 * math.log(ranks)) if ranks > 1 else 0.0


def chunk_imbalance(cfg: ParallelConfig, layers: int) -> float:
    """How much longer the pipeline's fill and drain run than the closed form's equal chunks: a rank's largest chunk
    over its stage's layers / v, on the fullest stage (8 layers in v = 7 chunks: one of 2, 1.75×; 1 where the chunks
    are equal). The closed forms' bubble is (p − 1) chunk times at each end."""
    if cfg.pp == 1 or cfg.schedule.placement == "single":
        return 1.0
    fullest = max(cfg.stage_layers(layers))
    return math.ceil(fullest / cfg.vpp) * cfg.vpp / fullest


def slowest_stage(layers_per_stage: tuple[int, ...], layer: _Cost, output: _Cost, output_rank: int) -> _Cost:
    """The costliest pipeline rank per micro-batch: its layers, plus the output layer and the loss on the rank
    running the last stage (``ParallelConfig.output_rank``)."""
    costs = [layer.scale(n) + (output if i == output_rank else _Cost()) for i, n in enumerate(layers_per_stage)]
    return max(costs, key=lambda cost: cost.seconds)


def step_time(
    model: ModelSpec,
    cluster: ClusterSpec,
    config: ParallelConfig,
    global_batch: int,
    eff: Efficiencies | None = None,
) -> StepTime:
    """Seconds per step; the caller has checked feasibility (see ``evaluate.evaluate``). ``eff``: the GPU's own
    constants where none are given (``efficiencies.efficiencies_for``)."""
    eff = efficiencies_for(cluster.gpu) if eff is None else eff
    cfg = config.with_dp(cluster.gpus)
    microbatches = global_batch // (cfg.dp * cfg.mbs)
    layer, output = layer_cost(model, cluster, cfg, eff), output_layer_cost(model, cluster, cfg, eff)
    stage = slowest_stage(cfg.stage_layers(model.layers), layer, output, cfg.output_rank)
    p2p = p2p_seconds(model, cluster, cfg, eff)
    floor = cfg.schedule.bubble(cfg.pp, microbatches, cfg.vpp) if cfg.pp > 1 else None
    if cfg.pp > 1 and floor is None:
        raise ValueError(f"schedule {cfg.schedule.name!r} has no closed-form bubble")
    busy = microbatches * (stage.seconds + p2p)
    lead = 0.0 if floor is None else floor.fraction / (1.0 - floor.fraction) * chunk_imbalance(cfg, model.layers)
    bubble = lead / (1.0 + lead)
    held = stage_params(model, cfg.tp, cfg.pp, cfg.layers_per_stage, cfg.ep, cfg.expert_tp)
    experts = stage_expert_params(model, cfg)
    sharded = cfg.zero >= 1  # the optimizer steps a rank's shard: dense over dp·cp ranks, an expert over its replicas
    local_params = (held - experts) / cfg.replicas + experts / cfg.expert_replicas if sharded else held
    optimizer = local_params * eff.optimizer_bytes_per_param / (cluster.gpu.hbm_gbps * 1e9 * eff.hbm)
    # FSDP's per-layer prefetch runs under each pass as the clock reads it; ZeRO 0-2's dp_overlap is a share of the
    # last backward's compute, as it was fitted
    windows = (stage.backward_wall, stage.forward_wall) if cfg.zero == 3 else (stage.backward, stage.forward)
    dp_comm = dp_seconds(model, cluster, cfg, eff, *windows, microbatches)
    before = busy * (1.0 + lead) + dp_comm + optimizer
    return StepTime(
        compute=microbatches * stage.compute,
        recompute=microbatches * stage.recompute,
        tp_comm=microbatches * stage.comm,
        cp_comm=microbatches * stage.context,
        ep_comm=microbatches * stage.experts,
        pp_comm=microbatches * p2p,
        bubble=busy * lead,
        dp_comm=dp_comm,
        straggler=straggler_seconds(before, cluster.gpus, eff),
        optimizer=optimizer,
        microbatches=microbatches,
        bubble_fraction=bubble,
    )
