"""The planner's memory formulas against hand computations (docs/planner.md, Korthikanti et al. 2022),
step-time structure, search results feasible and ranked, input errors that name the field."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import Any

import pytest

from bubblescope.analysis.planner import (
    MODEL_PRESETS,
    ModelSpec,
    ParallelConfig,
    PlanInputError,
    cluster_preset,
    evaluate,
    make_cluster,
    memory_per_gpu,
    model_from,
    plan_document,
    search,
)
from bubblescope.analysis.schedules import lookup

GPT_22B = MODEL_PRESETS["gpt-22b"]  # 48 layers, h 6144, 64 heads, s 2048, V 51200
A100_X8 = cluster_preset("a100-80gb-x8")
GIB = 2**30


def test_gpt_parameter_count_is_the_megatron_formula() -> None:
    # Narayanan et al. 2021: P = 12·l·h²·(1 + 13/(12h) + (V + s)/(12·l·h)); plus the final norm (2h)
    for name, billions in [("gpt-175b", 174.6), ("gpt-1t", 1008.0), ("gpt-22b", 22.0)]:
        m = MODEL_PRESETS[name]
        layers, h = m.layers, m.hidden
        expected = 12 * layers * h * h * (1 + 13 / (12 * h) + (m.vocab + m.seq) / (12 * layers * h)) + 2 * h
        assert m.params == pytest.approx(expected, rel=1e-12)
        assert m.params / 1e9 == pytest.approx(billions, rel=0.01)


def test_llama_parameter_counts_match_the_published_sizes() -> None:
    assert MODEL_PRESETS["llama-2-7b"].params == pytest.approx(6.74e9, rel=0.005)
    assert MODEL_PRESETS["llama-3-8b"].params == pytest.approx(8.03e9, rel=0.005)
    assert MODEL_PRESETS["llama-3-70b"].params == pytest.approx(70.6e9, rel=0.005)


def test_memory_tp8_selective_sp_by_hand() -> None:
    """22B on 8 GPUs, t=8, mbs 4, selective recompute + sequence parallelism (Korthikanti Table 5)."""
    s, b, h, L, V, t = 2048, 4, 6144, 48, 51200, 8
    config = ParallelConfig(tp=8, mbs=4, recompute="selective", sequence_parallel=True, flash_attention=False)
    mem = memory_per_gpu(GPT_22B, A100_X8, config, microbatches=1)
    # GEMM weights split over t; biases and norms (13h per layer) replicated; embedding rows split
    params = L * (12 * h * h / t + 13 * h) + V * h / t + s * h + 2 * h
    assert mem.weights == pytest.approx(2 * params)
    assert mem.gradients == pytest.approx(4 * params)  # fp32 (grad_reduce's default): Megatron-LM's main_grad
    assert mem.optimizer == pytest.approx(12 * params)
    assert mem.activations == pytest.approx(L * 34 * s * b * h / t)  # 34·s·b·h/t per layer, all layers
    assert mem.loss == pytest.approx(12 * s * b * V / t)  # fp32 cross-entropy's buffers, 12 bytes per logit
    assert mem.available == pytest.approx(72 * GIB)  # 80 GiB less the 10 % reserve
    assert mem.fits


def test_memory_1f1b_first_stage_holds_p_microbatches_of_tp_activations() -> None:
    model = MODEL_PRESETS["gpt-1.7b"]  # 24 layers, h 2304, 24 heads
    s, b, h, a, t, p = 2048, 2, 2304, 24, 2, 4
    cluster = cluster_preset("a100-80gb-x8")
    config = ParallelConfig(tp=t, pp=p, dp=1, mbs=b, schedule=lookup("1f1b"), flash_attention=False)
    per_layer = s * b * h * (10 + 24 / t + 5 * a * s / (h * t))
    mem = memory_per_gpu(model, cluster, config, microbatches=8)
    assert mem.activations == pytest.approx(p * (24 // p) * per_layer)
    gpipe = memory_per_gpu(
        model,
        cluster,
        ParallelConfig(tp=t, pp=p, dp=1, mbs=b, schedule=lookup("gpipe"), flash_attention=False),
        microbatches=8,
    )
    assert gpipe.activations == pytest.approx(8 * (24 // p) * per_layer)
    v = 3
    inter = memory_per_gpu(
        model,
        cluster,
        ParallelConfig(tp=t, pp=p, dp=1, vpp=v, mbs=b, schedule=lookup("interleaved1f1b"), flash_attention=False),
        microbatches=8,
    )
    assert inter.activations == pytest.approx((p * v + p - 1) * (24 / (p * v)) * per_layer)


def test_memory_full_recompute_keeps_layer_inputs_plus_one_layer_rebuilt() -> None:
    s, b, h, a, L = 2048, 1, 6144, 64, 48
    config = ParallelConfig(tp=8, mbs=1, recompute="full", flash_attention=False)
    mem = memory_per_gpu(GPT_22B, A100_X8, config, microbatches=1)
    assert mem.activations == pytest.approx(L * 2 * s * b * h + s * b * h * (10 + 24 / 8 + 5 * a * s / (h * 8)))


@pytest.mark.parametrize("grad_reduce,grad_bytes", [("fp32", 4), ("bf16", 2), ("fp16", 2)])
@pytest.mark.parametrize("zero,shards", [(0, (1, 1, 1)), (1, (1, 1, 8)), (2, (1, 8, 8)), (3, (8, 8, 8))])
def test_zero_stages_shard_optimizer_then_gradients_then_weights_over_dp(
    zero: int, shards: tuple[int, int, int], grad_reduce: str, grad_bytes: int
) -> None:
    """18 bytes a parameter with fp32 gradients (Megatron-LM's main_grad, FSDP2's reduce_dtype fp32), 16 with
    2-byte ones (the ZeRO paper's); ZeRO-1/2/3 shard the 12, then the gradients, then the 2 of weights. ZeRO-3 is
    FSDP2's, whose sharded gradients take its fp32 parameters' type whatever it reduces in."""
    model = MODEL_PRESETS["gpt-1.7b"]
    config = ParallelConfig(tp=1, pp=1, dp=8, mbs=1, zero=zero, grad_reduce=grad_reduce)
    mem = memory_per_gpu(model, A100_X8, config, microbatches=4)
    n = model.params
    kept = 4 if zero == 3 else grad_bytes
    assert (mem.weights, mem.gradients, mem.optimizer) == pytest.approx(
        (2 * n / shards[0], kept * n / shards[1], 12 * n / shards[2])
    )


def test_pipeline_step_is_m_plus_p_minus_1_stage_times_and_mfu_counts_model_flops() -> None:
    model, cluster = MODEL_PRESETS["gpt-175b"], cluster_preset("a100-80gb-x64")
    m, p = 64, 8
    plan = evaluate(model, cluster, ParallelConfig(tp=8, pp=p, mbs=1, recompute="full"), global_batch=m)
    step = plan.step
    assert step is not None and plan.mfu is not None
    assert step.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))
    busy = step.compute + step.recompute + step.tp_comm + step.pp_comm
    assert busy + step.bubble == pytest.approx(busy * (m + p - 1) / m)
    n, L, h, s = model.params, model.layers, model.hidden, model.seq
    model_flops = m * s * (6 * n + 12 * L * h * s)
    assert plan.mfu == pytest.approx(model_flops / (step.total * 64 * 312e12))
    # the step cannot beat the GPUs' peak on the FLOPs it must do (forward counted twice: full recompute)
    hardware_flops = model_flops * 4 / 3
    assert step.total > hardware_flops / (64 * 312e12)


def test_recompute_trades_memory_for_time_and_flash_attention_drops_the_scores() -> None:
    runs = {
        r: evaluate(
            GPT_22B, A100_X8, ParallelConfig(tp=8, mbs=4, recompute=r, sequence_parallel=True, flash_attention=False), 4
        )
        for r in ("none", "selective", "full")
    }
    times = [runs[r].step.total for r in ("none", "selective", "full")]  # type: ignore[union-attr]
    memory = [runs[r].memory.activations for r in ("none", "selective", "full")]  # type: ignore[union-attr]
    assert times[0] < times[1] < times[2]
    assert memory[0] > memory[1] > memory[2]
    flash = evaluate(GPT_22B, A100_X8, ParallelConfig(tp=8, mbs=4, sequence_parallel=True, flash_attention=True), 4)
    assert flash.memory.activations == pytest.approx(memory[1])  # type: ignore[union-attr]
    assert flash.step.total < times[0]  # type: ignore[union-attr]


def test_a_model_that_cannot_fit_is_reported_not_fitting() -> None:
    plan = evaluate(MODEL_PRESETS["gpt-175b"], A100_X8, ParallelConfig(tp=8, mbs=1), global_batch=8)
    assert not plan.fits and not plan.feasible
    assert plan.memory is not None and plan.memory.total > 175e9 * 16 / 8  # model state alone
    assert any("GiB" in problem for problem in plan.problems)


def test_search_returns_feasible_configurations_fastest_first() -> None:
    model, cluster, batch = MODEL_PRESETS["gpt-175b"], cluster_preset("a100-80gb-x64"), 64
    plans = search(model, cluster, batch, top=7)
    assert len(plans) == 7
    times = [plan.step.total for plan in plans]  # type: ignore[union-attr]
    assert times == sorted(times)
    for plan in plans:
        c = plan.config
        assert plan.fits and plan.feasible
        assert c.tp * c.pp * c.dp == 64 and batch % (c.dp * c.mbs) == 0 and model.heads % c.tp == 0
        assert plan.memory.total <= plan.memory.available  # type: ignore[union-attr]
    # at least as good as Korthikanti et al.'s own choice for this job
    published = evaluate(
        model,
        cluster,
        ParallelConfig(
            tp=8, pp=8, vpp=3, mbs=1, schedule=lookup("interleaved1f1b"), recompute="selective", sequence_parallel=True
        ),
        batch,
    )
    assert published.feasible and times[0] <= published.step.total  # type: ignore[union-attr]


def test_search_holds_fixed_fields() -> None:
    plans = search(
        MODEL_PRESETS["gpt-175b"], cluster_preset("a100-80gb-x64"), 64, top=5, fixed={"tp": 4, "recompute": "full"}
    )
    assert plans and all(p.config.tp == 4 and p.config.recompute == "full" for p in plans)


def test_a_search_holding_a_pipeline_schedule_lists_pipelines_alone() -> None:
    """A held schedule, 1F1B too, or virtual stages, runs on a pipeline alone (as ``config`` refuses them at pp 1):
    the search lists no pp 1 layout, which would read as plain accumulation, and every layout listed runs the
    schedule held (holding 1F1B listed pp 1 layouts: a user holding it asks for a pipeline)."""
    model, cluster = MODEL_PRESETS["gpt-22b"], cluster_preset("a100-80gb-x8")
    assert any(p.config.pp == 1 for p in search(model, cluster, 16, top=1000, fixed={}))
    held = (
        {"schedule": lookup("gpipe")},
        {"schedule": lookup("interleaved1f1b")},
        {"vpp": 2},
        {"schedule": lookup("1f1b")},
    )
    for fixed in held:
        plans = search(model, cluster, 16, top=1000, fixed=fixed)
        assert plans and all(p.config.pp > 1 for p in plans), fixed
        assert all(p.config.schedule is fixed.get("schedule", p.config.schedule) for p in plans)


def test_search_reports_nothing_when_nothing_fits() -> None:
    assert search(MODEL_PRESETS["gpt-1t"], cluster_preset("a100-40gb-x8"), 8) == []
    # memory, not a fixed field, is what stops it: an empty answer, not a refusal
    assert (
        plan_document({"model": "gpt-1t", "cluster": "a100-40gb-x8", "global_batch": 8, "fixed": {"tp": 8}}).plans == []
    )


def test_an_empty_search_says_why_the_batch_the_memory_or_the_refusal() -> None:
    """An answer with no plan says which of three things stopped every layout: a global batch no layout's replicas
    split (with a pipeline the search leaves to the user that would split it), the memory the leanest layout still
    needs, or the reason every layout was refused."""
    odd_batch = {"model": "llama-3.1-405b", "cluster": "h100-sxm-x1024", "global_batch": 3}
    nothing = plan_document(odd_batch)  # tp 8 · pp 64 leaves 2 replicas, the fewest with pp up to the 126 layers
    assert nothing.plans == [] and nothing.why_none is not None
    assert "global batch 3 does not split over the dp of any layout tried" in nothing.why_none, nothing.why_none
    assert "the fewest replicas, 2, are 1024 GPUs over tp 8 · cp 1 · pp 64" in nothing.why_none
    assert nothing.as_dict()["why_none"] == nothing.why_none
    even = plan_document({**odd_batch, "global_batch": 4, "top": 1})  # a batch the fewest replicas split runs
    assert even.plans and even.why_none is None and "why_none" not in even.as_dict()

    too_big = plan_document({"model": "gpt-1t", "cluster": "a100-40gb-x8", "global_batch": 8, "fixed": {"tp": 8}})
    assert too_big.plans == [] and too_big.why_none is not None
    needs = re.search(r"needs ([0-9.]+) GiB per GPU, ([0-9.]+) GiB available", too_big.why_none)
    assert needs, too_big.why_none
    leanest_said, available = float(needs.group(1)), float(needs.group(2))
    one = evaluate(too_big.model, too_big.cluster, ParallelConfig(tp=8, mbs=1, recompute="full"), 8)
    assert one.memory is not None and available < leanest_said <= one.memory.total / 2**30 + 0.05


def test_the_search_shards_over_context_parallel_ranks_where_dp_is_1() -> None:
    """Llama 3 8B at 128k tokens on 8 H100s, a sequence a rank: every layout has dp 1, and ZeRO shards over dp·cp, so
    cp 8 with ZeRO-3 is tried; it is what fits fastest (cp 8 without sharding needs about 140 GiB of weights, gradients
    and optimizer state a GPU)."""
    model = replace(MODEL_PRESETS["llama-3-8b"], seq=131072)
    plans = search(model, cluster_preset("h100-sxm-x8"), 8, top=5)
    assert plans and all(p.config.dp == 1 for p in plans)
    assert any(p.config.zero > 0 and p.config.cp > 1 for p in plans), [p.config for p in plans]
    best = plans[0].config
    assert best.cp * best.tp == 8 and best.zero > 0, best


@pytest.mark.parametrize(
    "document,field",
    [
        ({"model": "gpt-nope", "cluster": "a100-80gb-x8", "global_batch": 4}, "model"),
        (
            {
                "model": {"layers": 0, "hidden": 64, "heads": 4, "seq": 16, "vocab": 10},
                "cluster": "a100-80gb-x8",
                "global_batch": 4,
            },
            "model.layers",
        ),
        (
            {"model": {"hidden": 64, "heads": 4, "seq": 16, "vocab": 10}, "cluster": "a100-80gb-x8", "global_batch": 4},
            "model.layers",
        ),
        (
            {
                "model": {"layers": 2, "hidden": 64, "heads": 5, "seq": 16, "vocab": 10},
                "cluster": "a100-80gb-x8",
                "global_batch": 4,
            },
            "model.heads",
        ),
        ({"model": "gpt-22b", "cluster": "tpu-x8", "global_batch": 4}, "cluster"),
        ({"model": "gpt-22b", "cluster": {"gpu": "V100", "gpus": 8}, "global_batch": 4}, "cluster.gpu"),
        ({"model": "gpt-22b", "cluster": {"gpu": "H100-SXM", "gpus": 12}, "global_batch": 4}, "cluster.gpus"),
        ({"model": "gpt-22b", "cluster": "a100-80gb-x8", "global_batch": 0}, "global_batch"),
        ({"model": "gpt-22b", "cluster": "a100-80gb-x8", "global_batch": 4, "config": {"tp": 3}}, "config.tp"),
        (
            {"model": "gpt-22b", "cluster": "a100-80gb-x8", "global_batch": 4, "config": {"tp": 8, "mbs": 3}},
            "config.mbs",
        ),
        (
            {"model": "gpt-22b", "cluster": "a100-80gb-x8", "global_batch": 4, "config": {"recompute": "half"}},
            "config.recompute",
        ),
        (
            {"model": "gpt-22b", "cluster": "a100-80gb-x8", "global_batch": 4, "config": {"schedule": "zigzag"}},
            "config.schedule",
        ),
        (
            {"model": "gpt-22b", "cluster": "a100-80gb-x8", "global_batch": 4, "config": {"tp": 2, "pp": 4, "zero": 2}},
            "config.zero",
        ),
        ({"model": "gpt-22b", "cluster": "a100-80gb-x8", "global_batch": 4, "config": {"colour": 1}}, "config.colour"),
        # a pipeline's schedule or virtual stages without a pipeline: not read as plain accumulation without a word
        ({"model": "gpt-22b", "cluster": "a100-80gb-x8", "global_batch": 4, "config": {"vpp": 2}}, "config.vpp"),
        (
            {"model": "gpt-22b", "cluster": "h100-sxm-x8", "global_batch": 4, "config": {"schedule": "gpipe"}},
            "config.schedule",
        ),
        # a fixed field no configuration of the space can run with: refused, not an empty answer
        (
            {"model": "llama-3-8b", "cluster": "a100-80gb-x8", "global_batch": 8, "fixed": {"precision": "fp8"}},
            "fixed.precision",
        ),
        ({"model": "llama-3-8b", "cluster": "h100-sxm-x8", "global_batch": 8, "fixed": {"cp": 3}}, "fixed.cp"),
        ({"model": "llama-3-8b", "cluster": "h100-sxm-x8", "global_batch": 8, "fixed": {"tp": 3}}, "fixed.tp"),
        ({"model": "llama-3-8b", "cluster": "h100-sxm-x8", "global_batch": 8, "fixed": {"ep": 8}}, "fixed.ep"),
        ({"model": "qwen3-30b-a3b", "cluster": "b200-x16", "global_batch": 256, "fixed": {"ep": 256}}, "fixed.ep"),
        (
            {
                "model": {"preset": "llama-3-8b", "seq": 131000},
                "cluster": "h100-sxm-x8",
                "global_batch": 8,
                "fixed": {"cp": 8},
            },
            "fixed.cp",
        ),
        ({"model": "gpt-22b", "cluster": "a100-80gb-x8", "global_batch": 4, "top": 0}, "top"),
        # a pipeline's schedule held where no layout has a pipeline (pp held at 1; one GPU)
        (
            {"model": "gpt-22b", "cluster": "a100-80gb-x8", "global_batch": 8, "fixed": {"pp": 1, "schedule": "gpipe"}},
            "fixed.schedule",
        ),
        ({"model": "gpt-1.7b", "cluster": "h100-sxm-x1", "global_batch": 8, "fixed": {"vpp": 2}}, "fixed.vpp"),
    ],
)
def test_bad_inputs_name_the_field(document: dict, field: str) -> None:
    with pytest.raises(PlanInputError) as raised:
        plan_document(document)
    assert raised.value.field == field, raised.value


def test_model_json_fields_override_a_preset() -> None:
    spec = model_from({"preset": "llama-3-8b", "seq": 4096})
    assert isinstance(spec, ModelSpec)
    assert (spec.seq, spec.kv_heads, spec.ffn_hidden, spec.gated_mlp) == (4096, 8, 14336, True)


def test_explicit_cluster_equals_the_preset() -> None:
    assert make_cluster("A100-80GB", 64, 8) == cluster_preset("a100-80gb-x64")
    assert math.isclose(cluster_preset("h100-sxm-x16").gpu.peak_tflops, 989.0)


def test_per_op_checkpointing_under_tensor_and_sequence_parallelism_keeps_w2s_partial_sums_whole() -> None:
    """Llama 3 8B, tp 2 with sequence parallelism, recompute=op, one sequence of 8,192 tokens: per layer wq's, wv's,
    w1's outputs and the attention's split over t, the layer's input split (sequence parallel), w2's partial sums
    whole on each rank, and the two reduce-scatters' outputs split: 2·s·((2h + k + f)/t + h/t + h + 2h/t) bytes."""
    from bubblescope.analysis.planner.memory import activation_bytes_per_layer

    llama = model_from("llama-3-8b")
    s, h, k, f, t = 8192, 4096, 1024, 14336, 2
    kept = activation_bytes_per_layer(llama, 1, t, True, "op")
    assert kept == 2 * s * ((2 * h + k + f) / t + h / t + h + 2 * h / t)
    assert activation_bytes_per_layer(llama, 1, 1, False, "op") == 2 * s * (4 * h + k + f)  # t = 1: nothing split


@pytest.mark.parametrize(("schedule", "last_rank"), [("1f1b", 3), ("zbv", 0)])
def test_the_rank_running_the_last_stage_holds_the_loss_buffers_and_can_be_the_fullest(
    schedule: str, last_rank: int
) -> None:
    """Llama 3 8B at 32k tokens on 4 pipeline ranks: the loss's buffers (12 bytes × 32,768 × 128,256 logits, 47 GiB)
    sit on the rank running the last stage (the last rank; rank 0 for a V schedule), which is then the fullest."""
    from bubblescope.analysis.planner.memory import memory_per_pipeline_rank

    llama = replace(model_from("llama-3-8b"), seq=32768)
    cluster = make_cluster("H200", 4)
    vpp = 2 if schedule == "zbv" else 1
    cfg = ParallelConfig(pp=4, schedule=lookup(schedule), vpp=vpp, recompute="full")
    ranks = memory_per_pipeline_rank(llama, cluster, cfg, microbatches=8)
    losses = [rank.loss for rank in ranks]
    assert losses[last_rank] == pytest.approx(12 * 32768 * 128256) and sum(losses) == losses[last_rank], losses
    worst = memory_per_gpu(llama, cluster, cfg, microbatches=8)
    assert worst.total == pytest.approx(max(rank.total for rank in ranks)) and worst.loss == losses[last_rank]


def test_memory_past_the_schedule_orders_limit_does_not_jump() -> None:
    """1F1B on 8 ranks: 5,000 micro-batches are ordered action by action, 5,001 pass the orders' limit and take
    fewer micro-batches' order, which holds as many (the ranks hold min(p − r, m) whatever m above p)."""
    llama = model_from("llama-3-8b")
    cluster = make_cluster("H100-SXM", 8)
    cfg = ParallelConfig(pp=8, recompute="full")
    assert memory_per_gpu(llama, cluster, cfg, 5000).total == pytest.approx(
        memory_per_gpu(llama, cluster, cfg, 5001).total
    )


def test_equal_steps_rank_the_simpler_configuration_first() -> None:
    """Two configurations whose steps differ only in their last bits (the same seconds summed in another order, as
    selective recompute with fused attention, which recomputes nothing, and no recompute do) are equals: the lesser
    recompute ranks first, as documented, not whichever sum rounded lower."""
    from bubblescope.analysis.planner.search import rank_key

    cfg = ParallelConfig(tp=2, mbs=2, zero=3, sequence_parallel=True)
    plain = evaluate(model_from("llama-3-8b"), make_cluster("H100-SXM", 16), cfg, 64)
    assert plain.step is not None
    noise = replace(plain.step, compute=plain.step.compute * (1 - 4e-16))
    selective = replace(plain, config=replace(cfg, recompute="selective"), step=noise)
    assert selective.step is not None and selective.step.total < plain.step.total
    assert sorted([selective, plain], key=rank_key)[0].config.recompute == "none"
    faster = replace(selective, step=replace(plain.step, compute=plain.step.compute * 0.999))
    assert sorted([plain, faster], key=rank_key)[0] is faster  # a real difference still ranks first


def test_the_search_splits_layers_unevenly_where_the_stages_do_not_divide_them() -> None:
    """Llama 3 70B (80 layers) on 144 B200s: 144 = 2^4·3^2 GPUs allow 9 stages, which 80 layers do not split evenly;
    the search tries them with the middle stages 9 layers each and the first and last the rest (9 and 8: the last,
    which also runs the output layer, the fewer), the split Megatron's first/last-stage flags express, and says it in
    the plan. Stages that split evenly carry no split."""
    document = {"model": "llama-3-70b", "cluster": {"gpu": "B200", "gpus": 144}, "global_batch": 288, "top": 1000}
    plans = plan_document(document).plans
    nine = [plan for plan in plans if plan.config.pp == 9]
    assert nine and all(plan.config.layers_per_stage == (9,) * 8 + (8,) for plan in nine)
    assert all(plan.config.layers_per_stage == () for plan in plans if 80 % plan.config.pp == 0)
    assert {plan.config.pp for plan in plans} >= {1, 2, 3, 9}
    given = plan_document({**document, "top": 5, "fixed": {"pp": 9, "layers_per_stage": [8] + [9] * 8}}).plans
    assert given and all(plan.config.layers_per_stage == (8,) + (9,) * 8 for plan in given)


def test_a_pipeline_that_does_not_divide_the_layers_says_its_split_however_it_was_asked_for() -> None:
    """pp 3 on 80 layers, held in a search or evaluated alone without a split: the plan says the split it priced
    (27/27/26), and prices it as the same split given (was: no split said, memory 0.0003 GiB apart)."""
    body = {"model": "llama-3-70b", "cluster": "h100-sxm-x192", "global_batch": 192}
    alone = plan_document({**body, "config": {"tp": 8, "pp": 3, "recompute": "full", "zero": 1}}).plans[0]
    split = {"tp": 8, "pp": 3, "recompute": "full", "zero": 1, "layers_per_stage": [27, 27, 26]}
    given = plan_document({**body, "config": split}).plans[0]
    assert alone.config.layers_per_stage == (27, 27, 26)
    assert alone.step is not None and given.step is not None and alone.memory is not None and given.memory is not None
    assert (alone.step.total, alone.memory.total) == (given.step.total, given.memory.total)
    held = plan_document({**body, "top": 3, "fixed": {"tp": 8, "pp": 3}}).plans
    assert held and all(plan.config.layers_per_stage == (27, 27, 26) for plan in held)
    # 64 stages of 80 layers leave no two-ended split; the default one (the first 16 stages 2 layers) is said
    many = plan_document({**body, "cluster": "h100-sxm-x512", "global_batch": 512, "top": 1, "fixed": {"pp": 64}})
    assert many.plans and many.plans[0].config.layers_per_stage == (2,) * 16 + (1,) * 48


def test_a_v_shaped_schedule_runs_the_output_layer_on_rank_0_and_gives_it_the_fewer_layers() -> None:
    """ZB-V places stages r and 2p − 1 − r on rank r, so rank 0 runs the output layer and the loss: 80 layers over 3
    ranks split 26/27/27 under it (27/27/26 under 1F1B), and the split the other way round is the slower, as rank 0
    then holds a layer more beside the output layer."""
    body = {"model": "llama-3-70b", "cluster": "h100-sxm-x192", "global_batch": 192}
    layout = {"tp": 8, "pp": 3, "recompute": "full", "zero": 1}
    zbv = plan_document({**body, "config": {**layout, "schedule": "zbv"}}).plans[0]
    one_f_one_b = plan_document({**body, "config": layout}).plans[0]
    assert zbv.config.layers_per_stage == (26, 27, 27) and one_f_one_b.config.layers_per_stage == (27, 27, 26)
    flipped = plan_document({**body, "config": {**layout, "schedule": "zbv", "layers_per_stage": [27, 27, 26]}})
    assert zbv.step is not None and flipped.plans[0].step is not None
    assert flipped.plans[0].step.total > zbv.step.total


def test_a_default_uneven_split_leaves_every_rank_a_layer_for_each_virtual_stage() -> None:
    """32 layers over 12 ranks: the two-ended split (1, 3 × 10, 1) leaves the end ranks one layer, too few for two
    virtual stages; under ZB-V or interleaved 1F1B the default split is the even one (3 × 8, 2 × 4; ZB-V's output
    rank 0 among the lighter), and the layouts run where they were refused."""
    body = {"model": "llama-3-8b", "cluster": "h100-sxm-x96", "global_batch": 384}
    zbv = plan_document({**body, "config": {"pp": 12, "tp": 1, "mbs": 1, "schedule": "zbv"}}).plans[0]
    assert zbv.config.layers_per_stage == (2,) * 4 + (3,) * 8 and zbv.step is not None, zbv.problems
    one_f_one_b = plan_document({**body, "config": {"pp": 12, "tp": 1, "mbs": 1}}).plans[0]
    assert one_f_one_b.config.layers_per_stage == (1,) + (3,) * 10 + (1,)
    held = plan_document({**body, "top": 5, "fixed": {"pp": 12, "schedule": "interleaved1f1b"}}).plans
    assert held and all(plan.config.layers_per_stage == (3,) * 8 + (2,) * 4 for plan in held)


def test_refusals_of_held_fields_name_the_field_and_the_reason_that_holds() -> None:
    """Each names the field the request holds and a reason true of it: a held vpp the held schedule cannot run with
    (not "give pp ≥ 2", the search picks pp), virtual stages no micro-batch count runs (not "no configuration"), a dp
    that does not divide the GPUs, a micro-batch the global batch does not split into whatever dp is."""
    body: dict[str, Any] = {"model": "llama-3-8b", "cluster": "h100-sxm-x32", "global_batch": 96}
    cases = [
        ({"vpp": 3, "schedule": "zbv"}, "fixed.vpp", "runs exactly 2 stages per rank, got 3"),
        ({"dp": 5}, "fixed.dp", "dp=5 does not divide the 32 GPUs"),
        ({"mbs": 5}, "fixed.mbs", "global batch 96 is not divisible by mbs = 5"),
    ]
    for fixed, field, words in cases:
        with pytest.raises(PlanInputError) as refused:
            plan_document({**body, "fixed": fixed})
        assert refused.value.field == field and words in refused.value.message, (fixed, refused.value)
    with pytest.raises(PlanInputError) as refused:
        plan_document(
            {"model": "llama-3-70b", "cluster": "h100-sxm-x48", "global_batch": 8, "fixed": {"pp": 3, "vpp": 4}}
        )
    assert refused.value.field == "fixed.vpp" and "divisible by p=3" in refused.value.message


def test_a_sequence_that_does_not_split_over_tp_runs_without_sequence_parallelism() -> None:
    """Sequence parallelism scatters each rank's share of the sequence over tp: 65,535 tokens do not split over 8
    ranks, so the search's tp > 1 layouts run without it, a configuration asking nothing is evaluated without it,
    and one asking for it is refused naming it."""
    model = {"preset": "llama-3-8b", "seq": 65535}
    plans = plan_document({"model": model, "cluster": "h100-sxm-x8", "global_batch": 8, "top": 100}).plans
    assert plans and not any(p.config.sequence_parallel for p in plans if p.config.tp > 1)
    alone = plan_document({"model": model, "cluster": "h100-sxm-x8", "global_batch": 8, "config": {"tp": 8}})
    assert alone.plans[0].config.sequence_parallel is False
    with pytest.raises(PlanInputError) as refused:
        plan_document({"model": model, "cluster": "h100-sxm-x8", "global_batch": 8, "config": {"tp": 8, "sp": True}})
    assert refused.value.field == "config.sequence_parallel"


def test_an_even_split_given_is_the_layout_without_one() -> None:
    """pp 4 over 32 layers with layers_per_stage 8/8/8/8 is pp 4 alone: the same plan, said the same way."""
    body = {"model": "llama-3-8b", "cluster": "h100-sxm-x32", "global_batch": 256}
    alone = plan_document({**body, "config": {"pp": 4, "tp": 8}}).plans[0]
    given = plan_document({**body, "config": {"pp": 4, "tp": 8, "layers_per_stage": [8, 8, 8, 8]}}).plans[0]
    assert given.config == alone.config and given.config.layers_per_stage == ()
    assert given.step is not None and alone.step is not None and given.step.total == alone.step.total


def test_the_search_finds_llama_3_1_405bs_published_layout_on_16k_gpus() -> None:
    """Llama 3.1 405B (126 layers) on 16,384 H100s at a global batch of 2,048 sequences: Meta trained it with TP 8,
    PP 16 and DP 128 (the Llama 3 paper, Table 4), 126 layers over 16 stages. The search tries that uneven split
    (7, 8 × 14, 7) and prices it within 10% of its best, ahead of every even layout; its best is uneven too."""
    plans = search(MODEL_PRESETS["llama-3.1-405b"], cluster_preset("h100-sxm-x16384"), 2048, top=100_000)
    metas = next(plan for plan in plans if (plan.config.tp, plan.config.pp, plan.config.dp) == (8, 16, 128))
    assert metas.config.layers_per_stage == (7,) + (8,) * 14 + (7,)
    best_even = next(plan for plan in plans if 126 % plan.config.pp == 0)
    assert plans[0].step is not None and metas.step is not None and best_even.step is not None
    assert plans[0].config.layers_per_stage, plans[0].config
    assert metas.step.total < 1.10 * plans[0].step.total
    assert metas.step.total < best_even.step.total
