"""The planner's memory formulas against hand computations (docs/planner.md, Korthikanti et al. 2022),
step-time structure, search results feasible and ranked, input errors that name the field."""

from __future__ import annotations

import math

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
    assert mem.gradients == pytest.approx(2 * params)
    assert mem.optimizer == pytest.approx(12 * params)
    assert mem.activations == pytest.approx(L * 34 * s * b * h / t)  # 34·s·b·h/t per layer, all layers
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


@pytest.mark.parametrize("zero,shards", [(0, (1, 1, 1)), (1, (1, 1, 8)), (2, (1, 8, 8)), (3, (8, 8, 8))])
def test_zero_stages_shard_12_14_16_bytes_over_dp(zero: int, shards: tuple[int, int, int]) -> None:
    model = MODEL_PRESETS["gpt-1.7b"]
    config = ParallelConfig(tp=1, pp=1, dp=8, mbs=1, zero=zero)
    mem = memory_per_gpu(model, A100_X8, config, microbatches=4)
    n = model.params
    assert (mem.weights, mem.gradients, mem.optimizer) == pytest.approx(
        (2 * n / shards[0], 2 * n / shards[1], 12 * n / shards[2])
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


def test_search_reports_nothing_when_nothing_fits() -> None:
    assert search(MODEL_PRESETS["gpt-1t"], cluster_preset("a100-40gb-x8"), 8) == []


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
