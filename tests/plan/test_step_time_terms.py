"""The step-time terms the H100-era rows called for (docs/planner.md, "The model"): ZeRO-3's gathers one layer ahead
of the compute, the type gradients are reduced in, causal fused attention, FP8's casts (test_layouts_and_precision),
eager PyTorch's element-wise traffic. Each against a hand count from the documented formula."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from bubblescope.analysis.planner import ParallelConfig, evaluate, make_cluster, model_from
from bubblescope.analysis.planner.efficiencies import DEFAULT_EFFICIENCIES
from bubblescope.analysis.planner.memory import activation_bytes_per_layer, layer_params_on_gpu, stage_params
from bubblescope.analysis.planner.request import plan_document
from bubblescope.analysis.planner.specs import ClusterSpec, PlanInputError
from bubblescope.analysis.planner.step_time import (
    StepTime,
    layer_cost,
    output_layer_cost,
    unpipelined_reduce_scatter_seconds,
)

LLAMA_8B = model_from("llama-3-8b")
_SLOW_NIC = {"name": "h100", "peak_tflops": 989, "memory_gib": 80, "hbm_gbps": 3350, "nvlink_gbps": 450}


def _step(cfg: ParallelConfig, gpus: int, batch: int, gpu: str = "H100-SXM", **eff: float) -> StepTime:
    plan = evaluate(LLAMA_8B, make_cluster(gpu, gpus), cfg, batch, replace(DEFAULT_EFFICIENCIES, **eff))
    assert plan.step is not None, plan.problems
    return plan.step


def _ring_pass(bytes_: float, ranks: int, gbps: float, link_eff: float) -> float:
    return DEFAULT_EFFICIENCIES.collective_latency_s + (ranks - 1) / ranks * bytes_ / (gbps * 1e9 * link_eff)


def _llama_8b_over_128(cluster: ClusterSpec, cfg: ParallelConfig, gbps: float) -> tuple[float, float, float, float]:
    """Llama 3 8B over 128 data-parallel ranks, unpipelined, by hand: one bf16 gather of its weights, one fp32
    reduce-scatter of its gradients, and a micro-batch's forward and backward (the layers' and the output layer's)."""
    params, eff = stage_params(LLAMA_8B, 1, 1), DEFAULT_EFFICIENCIES
    gather = _ring_pass(2 * params, 128, gbps, eff.network)
    reduce = _ring_pass(4 * params, 128, gbps, eff.network)
    layer, output = layer_cost(LLAMA_8B, cluster, cfg.with_dp(128), eff), output_layer_cost(LLAMA_8B, cluster, cfg, eff)
    forward = LLAMA_8B.layers * layer.forward + output.forward
    return gather, reduce, forward, LLAMA_8B.layers * layer.backward + output.backward


@pytest.mark.parametrize("network_gbps", [50.0, 2.0])  # hidden under the compute; then mostly exposed
def test_zero3_gathers_one_layer_ahead_and_exposes_only_what_the_compute_does_not_cover(network_gbps: float) -> None:
    """FSDP on 128 GPUs (16 nodes), 2 micro-batches: per micro-batch, the weights' gather (bf16) under the forward,
    gather and fp32 reduce-scatter under the backward, the first layer's gather and the last layer's reduction
    always exposed: m·[max(0, G − F) + max(0, G + R − B) + (G + R)/L + the tree latency], F and B the layers'
    forward and backward (with recompute) plus the output layer's."""
    gpu = {"name": "h100", "peak_tflops": 989, "memory_gib": 80, "hbm_gbps": 3350, "nvlink_gbps": 450}
    cfg = ParallelConfig(mbs=2, zero=3, recompute="selective")  # torchtitan's local batch 2, accumulated twice
    cluster = make_cluster({**gpu, "network_gbps": network_gbps}, 128)
    plan = evaluate(LLAMA_8B, cluster, cfg, 512)
    step = plan.step
    assert step is not None and step.microbatches == 2
    params, ranks, eff = stage_params(LLAMA_8B, 1, 1), 128, DEFAULT_EFFICIENCIES
    gather, reduce, forward, backward = _llama_8b_over_128(cluster, cfg, network_gbps)
    assert backward > 2 * forward  # fused attention's backward is 3.1 forwards (cuDNN's, measured)
    exposed = max(0, gather - forward) + max(0, gather + reduce - backward) + (gather + reduce) / LLAMA_8B.layers
    buckets = math.ceil(4 * params / eff.bucket_bytes)
    latency = buckets * 3 / 2 * 2 * math.ceil(math.log2(ranks)) * eff.hop_latency_s
    assert step.dp_comm == pytest.approx(2 * (exposed + latency), rel=1e-9)
    if network_gbps == 50.0:  # torchtitan's 8B on 128 GPUs: the prefetch hides most of it
        assert step.dp_comm < 0.2 * 2 * (2 * gather + reduce)
    else:
        assert gather + reduce > backward and step.dp_comm > 0.5 * step.total


def test_zero3_transfers_run_under_the_passes_wall_time_so_faster_gemms_never_slow_a_step() -> None:
    """Llama 3 70B on 64 H100s, TP 8 × FSDP 8 with async TP, bf16 against FP8 and fused against separate projections:
    FSDP's gathers and reductions travel on their own stream under each pass as the clock reads it, its compute and
    its exposed TP transfers (``_Cost.forward_wall``, ``backward_wall``), not under its compute alone. Here the
    network bounds both passes, so the step is m·(2G + R + (G + R)/L) whatever the GEMMs cost: FP8 and separate
    projections give the same step as bf16 and fused (FP8 was 1.1% slower while the TP time its shorter GEMMs no
    longer hide was added on top of a step already waiting on the network)."""
    cluster = make_cluster("H100-SXM", 64)
    base = ParallelConfig(tp=8, zero=3, mbs=1, sequence_parallel=True, tp_comm_overlap=True)
    variants = {"bf16": base, "fp8": replace(base, precision="fp8"), "separate": replace(base, projections="separate")}
    steps = {name: evaluate(model_from("llama-3-70b"), cluster, cfg, 256).step for name, cfg in variants.items()}
    assert all(step is not None for step in steps.values())
    bf16, fp8, separate = (steps[name] for name in ("bf16", "fp8", "separate"))
    assert bf16 is not None and fp8 is not None and separate is not None
    assert bf16.dp_comm > bf16.compute  # network-bound
    assert fp8.compute < bf16.compute < separate.compute and fp8.tp_comm > bf16.tp_comm  # less TP hidden under FP8
    assert fp8.total == pytest.approx(bf16.total, rel=1e-9)
    assert separate.total == pytest.approx(bf16.total, rel=1e-9)


def test_gradients_reduced_in_fp32_move_twice_the_bytes_of_bf16() -> None:
    """ZeRO-1 and plain data parallelism on 64 A100s (a 25 GB/s NIC each; the reduction exposed): in fp32
    (Megatron-LM's and torchtitan's default) the reduce-scatter costs (4 − 2)·P·(n−1)/n / (NIC · network) more than in
    bf16 (--grad-reduce-in-bf16), the all-reduce twice that, and the buckets' tree latency grows with the bytes; the
    weights' all-gather is bf16 either way."""
    eff = DEFAULT_EFFICIENCIES
    params = stage_params(LLAMA_8B, 1, 1)
    levels = math.ceil(math.log2(64))  # 64 replicas over 8 nodes: every bucket walks the tree

    def latency(bytes_per_param: int) -> float:
        return math.ceil(bytes_per_param * params / eff.bucket_bytes) * 2 * levels * eff.hop_latency_s

    one_pass_extra = (64 - 1) / 64 * 2 * params / (25e9 * eff.network)
    for zero, passes in ((1, 1), (0, 2)):  # a reduce-scatter; an all-reduce
        cfg = ParallelConfig(mbs=1, zero=zero, recompute="selective")
        fp32, bf16 = (_step(replace(cfg, grad_reduce=kind), 64, 64, "A100-80GB") for kind in ("fp32", "bf16"))
        extra = passes * one_pass_extra + latency(4) - latency(2)
        assert bf16.dp_comm > 0 and fp32.dp_comm - bf16.dp_comm == pytest.approx(extra, rel=1e-9), zero
        fp16 = _step(replace(cfg, grad_reduce="fp16"), 64, 64, "A100-80GB")
        assert fp16.dp_comm == bf16.dp_comm


def test_fused_attention_is_causal_with_its_measured_backward_at_its_own_efficiency() -> None:
    """Fused attention forward: 2·q·s·d per head (half of the two products' 4·q·s·d: the causal mask skips the rest)
    at ``attention`` of the peak; backward 3.1× (cuDNN's, measured on an H200). Halving that efficiency adds 4.1
    forwards' worth a layer."""
    cfg = ParallelConfig(mbs=1)
    fast, slow = (_step(cfg, 1, 1, attention=a) for a in (0.5, 0.25))
    s, d, heads = LLAMA_8B.seq, LLAMA_8B.head_dim, LLAMA_8B.heads
    forward_at = {a: 2 * s * s * d * heads / (989e12 * a) for a in (0.5, 0.25)}
    expected = LLAMA_8B.layers * 4.1 * (forward_at[0.25] - forward_at[0.5])
    assert slow.compute - fast.compute == pytest.approx(expected, rel=1e-9)
    unfused = _step(replace(cfg, flash_attention=False), 1, 1, attention=0.25)
    assert unfused.compute == _step(replace(cfg, flash_attention=False), 1, 1, attention=0.5).compute


def test_flash_attention_2_runs_its_forward_at_0_55_of_cudnns_on_hopper_and_each_its_own_backward() -> None:
    """``attention_kernel=flash2`` on an H100: fused attention's forward at 0.55·``attention`` of the peak
    (FlashAttention-2 against cuDNN's kernel, measured on an H200), its backward 2.7× that (cuDNN's 3.1×): a layer's
    attention takes F · (3.7/0.55 − 4.1) more, F the forward at cuDNN's. On an A100 the forwards price alike and only
    the backwards differ: FlashAttention-2's 0.4·F shorter."""
    cudnn, flash2 = (_step(ParallelConfig(mbs=1, attention_kernel=k), 1, 1) for k in ("cudnn", "flash2"))
    s, d, heads = LLAMA_8B.seq, LLAMA_8B.head_dim, LLAMA_8B.heads
    forward = 2 * s * s * d * heads / (989e12 * DEFAULT_EFFICIENCIES.attention)
    expected = LLAMA_8B.layers * forward * (3.7 / 0.55 - 4.1)
    assert flash2.compute - cudnn.compute == pytest.approx(expected, rel=1e-9)
    assert flash2.tp_comm == cudnn.tp_comm and flash2.optimizer == cudnn.optimizer
    on_a100 = [_step(ParallelConfig(mbs=1, attention_kernel=k), 1, 1, gpu="A100-80GB") for k in ("cudnn", "flash2")]
    forward_a100 = 2 * s * s * d * heads / (312e12 * DEFAULT_EFFICIENCIES.attention)
    assert on_a100[0].compute - on_a100[1].compute == pytest.approx(LLAMA_8B.layers * forward_a100 * 0.4, rel=1e-9)


def test_eager_pytorch_moves_eager_traffic_times_the_element_wise_bytes() -> None:
    """compile=false: each layer's element-wise kernels move ``eager_traffic`` times the fused bytes, forward once
    and backward twice: (eager − 1)·traffic·stored·3 / (HBM·hbm) more a layer."""
    cfg = ParallelConfig(mbs=1)
    fused, eager = (_step(replace(cfg, compile=flag), 1, 1) for flag in (True, False))
    eff = DEFAULT_EFFICIENCIES
    stored = activation_bytes_per_layer(LLAMA_8B, 1, 1, False, "none", True)
    per_layer = (eff.eager_traffic - 1) * eff.elementwise_traffic * stored * 3 / (3350e9 * eff.hbm)
    assert eager.compute - fused.compute == pytest.approx(LLAMA_8B.layers * per_layer, rel=1e-9)


@pytest.mark.parametrize("tp", [1, 4])
def test_the_fp32_loss_moves_38_bytes_a_logit_forward_and_14_backward(tp: int) -> None:
    """The output layer: its GEMM forward and twice that backward, plus the cross-entropy's HBM traffic as
    Megatron-LM's vocab-parallel cross-entropy moves it (docs/planner.md, "Step time"): b·s tokens × V/t logits on a
    GPU, 38 bytes each forward, 14 backward, at HBM·hbm. Llama 3 8B, 8,192 tokens, 128,256 words, H100 SXM."""
    cluster, eff = make_cluster("H100-SXM", tp), DEFAULT_EFFICIENCIES
    cfg = ParallelConfig(tp=tp, mbs=1).with_dp(tp)
    output = output_layer_cost(LLAMA_8B, cluster, cfg, eff)
    tokens, logits = LLAMA_8B.seq, LLAMA_8B.seq * LLAMA_8B.vocab / tp
    gemm = 2 * tokens * (LLAMA_8B.vocab / tp) * LLAMA_8B.hidden / (989e12 * eff.gemm)  # compute-bound at this size
    hbm = 3350e9 * eff.hbm
    assert output.forward == pytest.approx(gemm + 38 * logits / hbm, rel=1e-9)
    assert output.compute == pytest.approx(3 * gemm + 52 * logits / hbm, rel=1e-9)
    assert output.compute - output.forward == pytest.approx(2 * gemm + 14 * logits / hbm, rel=1e-9)


@pytest.mark.parametrize(
    ("config", "field", "words"),
    [
        ({"grad_reduce": "int8"}, "config.grad_reduce", "expected one of fp32, bf16, fp16"),
        ({"compile": "sometimes"}, "config.compile", "true or false"),
        ({"projections": "unfused"}, "config.projections", "expected one of fused, separate, fused_qkv"),
    ],
)
def test_the_new_knobs_are_refused_by_name(config: dict[str, object], field: str, words: str) -> None:
    with pytest.raises(PlanInputError) as refused:
        plan_document({"model": "llama-3-8b", "cluster": "h100-sxm-x8", "global_batch": 8, "config": config})
    assert refused.value.field == field and words in refused.value.message


def test_the_answer_says_which_reduction_type_it_assumed() -> None:
    silent = plan_document({"model": "llama-3-8b", "cluster": "h100-sxm-x8", "global_batch": 8, "config": {}})
    assert any(said.startswith("grad_reduce: fp32") for said in silent.assumed), silent.assumed
    given = {"model": "llama-3-8b", "cluster": "h100-sxm-x8", "global_batch": 8, "config": {"grad_reduce": "bf16"}}
    told = plan_document(given)
    assert not any(said.startswith("grad_reduce") for said in told.assumed)
    assert told.plans[0].config.grad_reduce == "bf16"


def test_a_collected_run_declares_the_same_knobs_the_planner_takes() -> None:
    """A run's config (docs/planner.md: the same model for a collected run's suggestions) reads ``grad_reduce``,
    ``compile`` and ``overlap_param_gather`` with the planner's defaults; a value the planner refuses leaves the run
    without a declared plan."""
    from bubblescope.analysis.memory_fixes import declared_plan

    config = {"model": "llama-3-8b", "cluster": "h100-sxm-x16", "global_batch": 32, "zero": 3}
    default = declared_plan(config)
    assert default is not None and (default.config.grad_reduce, default.config.compile) == ("fp32", True)
    told = declared_plan({**config, "grad_reduce": "bf16", "compile": False})
    assert told is not None and (told.config.grad_reduce, told.config.compile) == ("bf16", False)
    assert declared_plan({**config, "grad_reduce": "int4"}) is None
    megatron = declared_plan({**config, "zero": 1, "overlap_param_gather": True})  # --overlap-param-gather
    assert megatron is not None and megatron.config.overlap_param_gather and not told.config.overlap_param_gather
    assert declared_plan({**config, "zero": 1, "overlap_param_gather": "sometimes"}) is None
    for zero in (0, 3):  # nothing gathered once a step: the flag dropped, as it does nothing (torchtitan's FSDP)
        fsdp = declared_plan({**config, "zero": zero, "overlap_param_gather": True})
        assert fsdp is not None and not fsdp.config.overlap_param_gather
    apart = declared_plan({**config, "projections": "separate"})  # torchtitan's Llama before fuse_qkv
    assert apart is not None and apart.config.projections == "separate" and default.config.projections == "fused"


def test_fp8_all_gather_gathers_the_layers_linear_weights_in_one_byte() -> None:
    """ZeRO-1 over two nodes of one GPU each on a 1 GB/s network, where nothing hides the reduction: with
    ``fp8_all_gather`` (torchtitan's enable_fsdp_float8_all_gather, Megatron-LM's --fp8-param-gather) the updated
    weights' all-gather moves one byte less for each of the layers' linear weights, (n−1)/n · L·W bytes at 1 GB/s ·
    network efficiency; the embedding and the norms still travel in bf16, and the gradients' reduce-scatter is
    unchanged. Each rank casts only its shard of those weights, half of them here, 5 bytes an element less on the
    other half (``test_weights_gathered_in_fp8_are_cast_on_a_ranks_shard``). The API carries the knob both ways; a
    run's config declares it."""
    from bubblescope.analysis.memory_fixes import declared_plan

    gpu = {"name": "slow", "peak_tflops": 989, "fp8_tflops": 1979, "memory_gib": 80, "hbm_gbps": 3350}
    cluster = make_cluster({**gpu, "nvlink_gbps": 450, "network_gbps": 1}, 2, gpus_per_node=1)
    base = ParallelConfig(mbs=1, zero=1, precision="fp8")
    plans = {flag: evaluate(LLAMA_8B, cluster, replace(base, fp8_all_gather=flag), 2) for flag in (False, True)}
    bf16, fp8 = plans[False].step, plans[True].step
    assert bf16 is not None and fp8 is not None
    linear_bytes = LLAMA_8B.layers * LLAMA_8B.layer_dense_matmul_params  # one byte less each
    expected = 0.5 * linear_bytes / (1e9 * DEFAULT_EFFICIENCIES.network)
    assert bf16.dp_comm - fp8.dp_comm == pytest.approx(expected, rel=1e-9)
    hbm = 3350e9 * DEFAULT_EFFICIENCIES.hbm
    assert bf16.compute - fp8.compute == pytest.approx(5 * 0.5 * linear_bytes / hbm, rel=1e-9)
    # Mixtral at tp 2, ep 2 over 4 replicas: each GPU's half of the dense linears over the 4, its experts over 2
    mixtral = model_from("mixtral-8x7b")
    nodes = make_cluster({**gpu, "nvlink_gbps": 450, "network_gbps": 1}, 8, gpus_per_node=2)
    moe = replace(base, tp=2, ep=2, sequence_parallel=True)
    moe_plans = {flag: evaluate(mixtral, nodes, replace(moe, fp8_all_gather=flag), 4) for flag in (False, True)}
    moe_bf16, moe_fp8 = moe_plans[False].step, moe_plans[True].step
    assert moe_bf16 is not None and moe_fp8 is not None, moe_plans[False].problems
    dense = mixtral.layers * mixtral.layer_dense_matmul_params / 2
    experts = mixtral.layers * layer_params_on_gpu(mixtral, 2, 2)[1]
    saved = (3 / 4 * dense + 1 / 2 * experts) / (1e9 * DEFAULT_EFFICIENCIES.network)
    assert moe_bf16.dp_comm - moe_fp8.dp_comm == pytest.approx(saved, rel=1e-9)
    document = {"model": "llama-3-8b", "cluster": "h100-sxm-x8", "global_batch": 8}
    told = plan_document({**document, "config": {"zero": 3, "precision": "fp8", "enable_fsdp_float8_all_gather": True}})
    assert told.plans[0].config.fp8_all_gather and told.plans[0].as_dict()["config"]["fp8_all_gather"] is True
    run = {"model": "llama-3-8b", "cluster": "h100-sxm-x16", "global_batch": 32, "zero": 3, "precision": "fp8"}
    declared = declared_plan({**run, "fp8_all_gather": True})
    assert declared is not None and declared.config.fp8_all_gather
    assert declared_plan({**run, "fp8_all_gather": "sometimes"}) is None


def test_ring_attention_exposes_only_what_attention_does_not_cover_forward_and_backward() -> None:
    """Context parallelism over a slow link (cp 2 across two nodes of one GPU each, 20 GB/s): ring attention (p2p)
    exposes, a layer, max(0, P − A) forward and max(0, 2P − A_b) backward, P one ring pass of the keys and values
    (4·b·s·k bytes), A and A_b fused attention's forward and backward (3.1 A, cuDNN's)."""
    gpu = {"name": "slow", "peak_tflops": 989, "memory_gib": 80, "hbm_gbps": 3350, "nvlink_gbps": 450}
    cluster = make_cluster({**gpu, "network_gbps": 20}, 2, gpus_per_node=1)
    plan = evaluate(LLAMA_8B, cluster, ParallelConfig(mbs=1, cp=2, cp_comm="p2p"), 1)
    assert plan.step is not None, plan.problems
    eff = DEFAULT_EFFICIENCIES
    one = _ring_pass(4 * LLAMA_8B.seq * LLAMA_8B.kv_dim, 2, 20, eff.network)
    s, d, heads = LLAMA_8B.seq, LLAMA_8B.head_dim, LLAMA_8B.heads
    attention = 2 * (s / 2) * s * d * heads / (989e12 * eff.attention)
    assert attention < one and 2 * one - 3.1 * attention < one  # partly hidden, both ways
    expected = max(0, one - attention) + max(0, 2 * one - 3.1 * attention)
    assert plan.step.cp_comm == pytest.approx(LLAMA_8B.layers * expected, rel=1e-9)


def test_fp8_casts_every_expert_weight_a_gpu_holds() -> None:
    """Mixtral 8x7B in FP8, tp 2: each GPU casts the weights of every expert it hosts (experts/ep), so halving the
    experts a GPU holds (ep 2) saves, a layer and micro-batch, 7 bytes of each of the 4 experts' MLP weights no
    longer there, forward (5) and backward (2)."""
    mixtral = model_from("mixtral-8x7b")
    cluster = make_cluster("H100-SXM", 16)
    plans = {
        ep: evaluate(mixtral, cluster, ParallelConfig(tp=2, mbs=1, ep=ep, precision="fp8", sequence_parallel=True), 8)
        for ep in (1, 2)
    }
    width, h = mixtral.moe_ffn_hidden, mixtral.hidden
    per_expert = h * 2 * width / 2 + width / 2 * h  # the gated up GEMM's and the down GEMM's weights, split by tp 2
    saved = 4 * per_expert * 7 / (3350e9 * DEFAULT_EFFICIENCIES.hbm) * mixtral.layers
    one, two = plans[1].step, plans[2].step
    assert one is not None and two is not None
    assert one.compute - two.compute == pytest.approx(saved * one.microbatches, rel=1e-9)


def test_the_reduction_types_the_service_accepts_are_the_planners() -> None:
    """The plan request takes every few-word field in the planner's words (``specs.CHOICES``), a run's config its
    ``grad_reduce``, ``attention_kernel`` and ``dispatcher``; a run's config refuses a mistyped ``compile``,
    ``grad_reduce``, ``attention_kernel`` or ``dispatcher`` at registration, naming it."""
    import typing

    from pydantic import ValidationError

    from bubblescope.analysis.planner.specs import CHOICES
    from bubblescope.backend.plan.schemas import ConfigIn
    from bubblescope.backend.runs.schemas import RunConfig

    def words(schema: type, field: str) -> tuple[str, ...]:
        annotation = schema.model_fields[field].annotation  # type: ignore[attr-defined]
        return tuple(arg for member in typing.get_args(annotation) for arg in typing.get_args(member))

    for field, planners in CHOICES.items():
        assert words(ConfigIn, field) == planners, field  # recompute's "op" included
    for field in ("grad_reduce", "attention_kernel", "dispatcher", "projections"):
        assert words(RunConfig, field) == CHOICES[field], field
    for field, value in (
        ("compile", "yes"),
        ("kv_repeated", "yes"),
        ("overlap_param_gather", "yes"),
        ("grad_reduce", "int8"),
        ("attention_kernel", "fa3"),
        ("dispatcher", "nccl"),
        ("projections", "unfused"),
    ):
        with pytest.raises(ValidationError) as refused:
            RunConfig.model_validate({field: value})
        assert refused.value.errors()[0]["loc"] == (field,)
    from bubblescope.analysis.planner import evaluate as evaluate_plan

    bad = evaluate_plan(LLAMA_8B, make_cluster("H100-SXM", 8), ParallelConfig(grad_reduce="int8"), 8)
    assert bad.step is None and bad.problems == ("must be one of fp32, bf16, fp16, got 'int8'",)
    odd = evaluate_plan(LLAMA_8B, make_cluster("H100-SXM", 8), ParallelConfig(attention_kernel="fa3"), 8)
    assert odd.step is None and odd.problems == ("must be one of cudnn, flash2, got 'fa3'",)


def test_zero3_under_a_pipeline_gathers_once_and_reduces_once_a_step() -> None:
    """FSDP with pipeline parallelism, as torchtitan runs it (Llama 3.1 405B, FSDP 8 × TP 8 × PP 8, 8 micro-batches
    of 4): the weights are gathered once under the first micro-batch's forward and kept, the gradients reduced once
    after the last backward (torch's schedules call FSDP's post-backward then: ``perform_reduce_grad``):
    max(0, G − F) + G/L + R + the tree latency, whatever the micro-batches, F the stage's forward as the clock reads it
    (its compute and its exposed TP transfers); memory holds what ZeRO-1 holds (weights and gradients whole, the
    optimizer's state sharded)."""
    model = model_from("llama-3.1-405b")
    cluster = make_cluster({**_SLOW_NIC, "network_gbps": 15.0}, 512)  # the gather outlasts the forward
    stages = (15, 16, 16, 16, 16, 16, 16, 15)
    fsdp = ParallelConfig(tp=8, pp=8, dp=8, mbs=4, zero=3, recompute="full", sequence_parallel=True)
    fsdp = replace(fsdp, layers_per_stage=stages)
    plan, zero1 = (evaluate(model, cluster, replace(fsdp, zero=zero), 256) for zero in (3, 1))
    assert plan.step is not None and zero1.step is not None, plan.problems
    assert plan.step.microbatches == 8 and plan.memory == zero1.memory
    eff = DEFAULT_EFFICIENCIES
    params = stage_params(model, 8, 8, stages)
    gather = _ring_pass(2 * params, 8, 15.0, eff.network)
    reduce = _ring_pass(4 * params, 8, 15.0, eff.network)
    layer = layer_cost(model, cluster, fsdp, eff)
    forward, backward = 16 * layer.forward_wall, 16 * layer.backward_wall  # the fullest stage: 16 layers
    assert layer.comm > 0 and forward > 16 * layer.forward
    assert gather > forward and reduce < backward  # the reduction could have hidden, but does not
    buckets = math.ceil(4 * params / eff.bucket_bytes)
    latency = buckets * 3 / 2 * 2 * math.ceil(math.log2(8)) * eff.hop_latency_s
    expected = gather - forward + gather / 16 + reduce + latency
    assert plan.step.dp_comm == pytest.approx(expected, rel=1e-9)
    refused = evaluate(model, cluster, replace(fsdp, zero=2), 256)
    assert refused.step is None and any("ZeRO-2" in problem for problem in refused.problems)


@pytest.mark.parametrize("network_gbps", [50.0, 4.0])  # the gather hidden under the forward; then outlasting it
def test_the_distributed_optimizers_gather_under_the_next_forward_exposes_what_the_forward_does_not_cover(
    network_gbps: float,
) -> None:
    """ZeRO-1 on 128 GPUs (16 nodes), 2 micro-batches, Megatron's ``--overlap-param-gather``: the gradients'
    reduce-scatter under the last backward as without it, max(0, R + the tree latency − dp_overlap·B); the updated
    weights' all-gather no longer after the optimizer's step but under the next step's first forward,
    max(0, G − F) + G/L (the first layer waits for its share). Without the knob: max(0, R + G + latency − dp_overlap·B);
    the knob saves at most G."""
    cluster = make_cluster({**_SLOW_NIC, "network_gbps": network_gbps}, 128)
    cfg = ParallelConfig(mbs=2, zero=1, recompute="selective")
    hidden, open_ = (evaluate(LLAMA_8B, cluster, replace(cfg, overlap_param_gather=on), 512) for on in (True, False))
    assert hidden.step is not None and open_.step is not None, hidden.problems
    assert hidden.config.overlap_param_gather and hidden.step.microbatches == 2
    params, ranks, eff = stage_params(LLAMA_8B, 1, 1), 128, DEFAULT_EFFICIENCIES
    gather, reduce, forward, backward = _llama_8b_over_128(cluster, cfg, network_gbps)
    buckets = math.ceil(4 * params / eff.bucket_bytes)
    latency = buckets * 2 / 2 * 2 * math.ceil(math.log2(ranks)) * eff.hop_latency_s  # a reduce-scatter and a gather
    under_backward = max(0.0, reduce + latency - eff.dp_overlap * backward)
    expected = under_backward + max(0.0, gather - forward) + gather / LLAMA_8B.layers
    assert hidden.step.dp_comm == pytest.approx(expected, rel=1e-9)
    assert open_.step.dp_comm == pytest.approx(max(0.0, reduce + gather + latency - eff.dp_overlap * backward))
    assert 0 < open_.step.dp_comm - hidden.step.dp_comm <= gather
    if network_gbps == 50.0:
        assert gather < forward  # all but the first layer's share hidden
    else:
        assert gather > forward and hidden.step.dp_comm > under_backward + gather - forward
    assert hidden.memory == open_.memory  # the same buffers, gathered at another time


def test_a_search_holding_overlap_param_gather_sets_it_on_the_layouts_that_gather_once_a_step() -> None:
    """``fixed: {overlap_param_gather: true}``: the ZeRO-1/2 layouts the search ranks carry it (and the terminal's
    label says so), the ZeRO-0 and ZeRO-3 ones (nothing gathered once a step) do not, and a search holding it with
    zero 0 or 3 is refused by name."""
    from bubblescope.analysis.planner.labels import config_label

    body = {"model": "llama-3-8b", "cluster": "h100-sxm-x64", "global_batch": 64, "top": 1000}
    plans = plan_document(body | {"fixed": {"overlap_param_gather": True}}).plans
    by_zero = {
        zero: {plan.config.overlap_param_gather for plan in plans if plan.config.zero == zero} for zero in range(4)
    }
    assert by_zero[1] == by_zero[2] == {True} and by_zero[0] == by_zero[3] == {False}, by_zero
    assert all(("+overlap-param-gather" in config_label(plan)) == (plan.config.zero in (1, 2)) for plan in plans)
    for zero, words in ((0, "needs zero 1 or 2"), (3, "under the forward already")):
        with pytest.raises(PlanInputError) as refused:
            plan_document(body | {"fixed": {"overlap_param_gather": True, "zero": zero}})
        assert refused.value.field == "fixed.overlap_param_gather" and words in refused.value.message


def test_torchtitan_per_op_checkpointing_keeps_every_second_matmul_and_runs_the_others_again() -> None:
    """recompute=op, Llama 3 8B, local batch 2 of 8,192 tokens on one H100: each layer keeps its input, the attention's
    output and wq's, wv's, w1's and w2's outputs in bf16, 2·b·s·(4h + k + f) bytes; its backward runs wk, wo and w3
    again (compute-bound GEMMs at the GEMM efficiency) and every element-wise op (the layer's forward traffic)."""
    cluster = make_cluster("H100-SXM", 8)
    cfg = ParallelConfig(mbs=2, zero=3, recompute="op").with_dp(8)
    tokens, h, k, f = 2 * 8192, 4096, 1024, 14336
    assert activation_bytes_per_layer(LLAMA_8B, 2, 1, False, "op") == 2 * tokens * (4 * h + k + f)
    eff = DEFAULT_EFFICIENCIES
    rerun = 2 * tokens * (h * k + h * h + h * f) / (989e12 * eff.gemm)
    stored = activation_bytes_per_layer(LLAMA_8B, 2, 1, False, "none", flash_attention=True)
    elementwise = eff.elementwise_traffic * stored / (3350e9 * eff.hbm)
    layer = layer_cost(LLAMA_8B, cluster, cfg, eff)
    assert layer.recompute == pytest.approx(rerun + elementwise, rel=1e-6)
    full = layer_cost(LLAMA_8B, cluster, replace(cfg, recompute="full"), eff)
    assert 0 < layer.recompute < full.recompute  # less than the whole forward again


def _gemm(m: float, n: float, k: float, hbm: float) -> float:
    """A bf16 GEMM on an H100 SXM's roofline at the default constants: its FLOPs' time or its operands' bytes'."""
    eff = DEFAULT_EFFICIENCIES
    return max(2 * m * n * k / (989e12 * eff.gemm), 2 * (m * k + k * n + m * n) / hbm)


@pytest.mark.parametrize(
    ("projections", "compiled", "passes"),
    [("separate", True, 4 + 3), ("separate", False, 2 * 3 + 3), ("fused_qkv", True, 3), ("fused_qkv", False, 3)],
)
def test_projections_apart_run_as_their_own_gemms_and_the_backward_sums_the_inputs_gradients(
    projections: str, compiled: bool, passes: int
) -> None:
    """Llama 3 8B, TP 8 with sequence parallelism, local batch 12 of 8,192 tokens (torchtitan's async-TP page): wq, wk
    and wv apart are GEMMs 512, 128 and 128 columns wide on a rank, w1 and w3 1,792 each, where the fused ones are 768
    and 3,584. wk and wv then read the whole gathered input for 128 columns: memory-bound. The backward sums the
    input's gradients over the whole gathered sequence: compiled, one kernel reads wq's, wk's and wv's and writes the
    sum (4 passes of T·h bf16), then w1's and w3's (3); eager, autograd adds pairs (3 passes an add: 2 adds, then 1).
    With Q, K and V fused (torchtitan 0.3's Llama 3), only the MLP's pair is apart."""
    cluster = make_cluster("H100-SXM", 8)
    cfg = ParallelConfig(tp=8, mbs=12, sequence_parallel=True, compile=compiled).with_dp(8)
    tokens, h, hbm = 12 * 8192, 4096, 3350e9 * DEFAULT_EFFICIENCIES.hbm
    fused = layer_cost(LLAMA_8B, cluster, cfg, DEFAULT_EFFICIENCIES)
    apart = layer_cost(LLAMA_8B, cluster, replace(cfg, projections=projections), DEFAULT_EFFICIENCIES)
    qkv = _gemm(tokens, 128, h, hbm) * 2 + _gemm(tokens, 512, h, hbm) - _gemm(tokens, 768, h, hbm)
    assert _gemm(tokens, 128, h, hbm) == 2 * (tokens * h + h * 128 + tokens * 128) / hbm  # on the memory side
    up = 2 * _gemm(tokens, 1792, h, hbm) - _gemm(tokens, 3584, h, hbm)
    assert qkv > 0 and up == pytest.approx(0.0, abs=1e-12)  # w1 and w3 apart stay compute-bound: no slower
    more = up + (qkv if projections == "separate" else 0.0)
    assert apart.forward - fused.forward == pytest.approx(more, rel=1e-6)
    sums = passes * 2 * tokens * h / hbm
    assert apart.backward - fused.backward == pytest.approx(2 * more + sums, rel=1e-6)
    assert apart.comm == fused.comm  # the same collectives


def test_async_tp_leaves_the_summed_projections_backward_reduce_scatters_exposed() -> None:
    """torch's async TP pipelines a reduce-scatter only with the one matmul that produces its input; with wq, wk, wv and
    w1, w3 apart, the backward's gradients of the attention's and the MLP's inputs are sums of matmuls, so two bf16
    reduce-scatters of the activation a layer run whole. By hand on Llama 3 8B, TP 8, a micro-batch of 12 × 8,192
    tokens: 2 × [latency + 7/8 · 2·tokens·h / NVLink]; none with fused projections, none without TP overlap; the layer's
    exposed TP time is at least that, however much overlap the GEMMs offer."""
    cluster, eff = make_cluster("H100-SXM", 64), replace(DEFAULT_EFFICIENCIES, tp_overlap=1.0)
    tokens = 12 * 8192
    apart = ParallelConfig(
        tp=8, mbs=12, sequence_parallel=True, tp_comm_overlap=True, projections="separate", recompute="op"
    ).with_dp(64)
    one = _ring_pass(2.0 * tokens * LLAMA_8B.hidden, 8, cluster.gpu.nvlink_gbps, eff.nvlink)
    assert unpipelined_reduce_scatter_seconds(LLAMA_8B, cluster, apart, eff, tokens) == pytest.approx(2 * one)
    fused_qkv = replace(apart, projections="fused_qkv")  # Q, K, V one GEMM: only the MLP's input stays exposed
    assert unpipelined_reduce_scatter_seconds(LLAMA_8B, cluster, fused_qkv, eff, tokens) == pytest.approx(one)
    for hidden in (replace(apart, projections="fused"), replace(apart, tp_comm_overlap=False)):
        assert unpipelined_reduce_scatter_seconds(LLAMA_8B, cluster, hidden, eff, tokens) == 0.0
    assert layer_cost(LLAMA_8B, cluster, apart, eff).comm == pytest.approx(2 * one)
    assert layer_cost(LLAMA_8B, cluster, replace(apart, projections="fused"), eff).comm == 0.0
    no_sp = replace(apart, sequence_parallel=False)  # async TP pipelines only all-gathers and reduce-scatters
    assert unpipelined_reduce_scatter_seconds(LLAMA_8B, cluster, no_sp, eff, tokens) == 0.0
    mixtral = model_from("mixtral-8x7b")  # a mixture of experts: the attention's input alone
    moe_one = _ring_pass(2.0 * tokens * mixtral.hidden, 8, cluster.gpu.nvlink_gbps, eff.nvlink)
    assert unpipelined_reduce_scatter_seconds(mixtral, cluster, apart, eff, tokens) == pytest.approx(moe_one)


def test_with_nothing_hidden_async_tp_exposes_what_vanilla_tp_does_and_its_forward_share() -> None:
    """At ``tp_overlap`` 0 the unpipelined reduce-scatters are counted once among the layer's collectives, and the
    forward's share of the exposed TP time is still its own pass's collectives (the unpipelined ones are the
    backward's): both as vanilla TP prices them."""
    cluster, eff = make_cluster("H100-SXM", 64), replace(DEFAULT_EFFICIENCIES, tp_overlap=0.0)
    vanilla = ParallelConfig(tp=8, mbs=12, sequence_parallel=True, projections="separate", recompute="op").with_dp(64)
    plain = layer_cost(LLAMA_8B, cluster, vanilla, eff)
    overlapped = layer_cost(LLAMA_8B, cluster, replace(vanilla, tp_comm_overlap=True), eff)
    assert overlapped.comm == pytest.approx(plain.comm)
    assert overlapped.forward_comm == pytest.approx(plain.forward_comm)
    assert plain.forward_comm == pytest.approx(plain.comm / 2.5)  # forward, backward, the rerun's two all-gathers
