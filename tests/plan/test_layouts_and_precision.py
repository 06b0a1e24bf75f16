"""The planner's knobs for how large models are trained now (docs/planner.md): FP8 linear GEMMs, uneven pipeline
stages (Megatron's first/last-stage layers, torchtitan's fewer layers on the ends), flash attention on by default
and said, the GPU catalog with a source per row; each against a hand count from the documented formula, and each
refused by name when out of range."""

from __future__ import annotations

import csv
import math
from dataclasses import replace
from typing import Any

import pytest

from bubblescope.analysis.memory_fixes import declared_plan
from bubblescope.analysis.planner import GPU_CATALOG, ParallelConfig, evaluate, make_cluster, model_from
from bubblescope.analysis.planner.efficiencies import DEFAULT_EFFICIENCIES, efficiencies_for
from bubblescope.analysis.planner.memory import layer_params_on_gpu, memory_per_pipeline_rank
from bubblescope.analysis.planner.request import config_fields, plan_document
from bubblescope.analysis.planner.search import search
from bubblescope.analysis.planner.specs import DISPATCHERS, GPUS, PlanInputError
from bubblescope.analysis.planner.step_time import layer_cost, output_layer_cost
from bubblescope.analysis.schedules import INTERLEAVED_1F1B
from tests.support import LiveServer, assert_names

SXM = efficiencies_for("H100-SXM")  # the constants an H100 SXM prices with (fitted on its published runs)

LLAMA_405B = {  # Llama 3.1 405B (torchtitan's llama3 405B configuration)
    "name": "llama-3.1-405b",
    "layers": 126,
    "hidden": 16384,
    "heads": 128,
    "kv_heads": 8,
    "ffn_hidden": 53248,
    "seq": 8192,
    "vocab": 128256,
    "gated_mlp": True,
    "tied_embeddings": False,
    "learned_positions": False,
}


def test_fp8_gemms_run_at_nine_tenths_of_bf16s_efficiency_over_the_fp8_peak_and_pay_for_their_casts() -> None:
    """Llama 3 70B, tp 8 on 8 H100s, seq 8192: every linear GEMM is compute-bound at both precisions, so FP8 saves,
    per layer and pass, its FLOPs F = 2·tokens·h·((h + 2k) + h + 2f + f)/t times 1/(bf16·gemm) − 1/(fp8·0.9·gemm)
    (an FP8 GEMM reaches 0.9 of the fraction of its peak a bf16 one does, measured on an H200); a
    layer runs three passes (forward, two backward), 80 layers, 2 micro-batches. It pays for its dynamic scaling in
    HBM traffic: forward, 5 bytes an element of each GEMM's input and weight (read for the maximum, read to cast,
    written in one byte); backward, 5 of each output gradient and 2 of each input and weight (the FP8 transposes).
    Under sequence parallelism QKV's and the MLP's first inputs, and the projection's and the MLP's second output
    gradients, are cast on a rank's 1/t of the tokens before their FP8 all-gather (torchao's Float8ColwiseParallel and
    Float8RowwiseParallel)."""
    model = model_from("llama-3-70b")
    cluster = make_cluster("H100-SXM", 8)
    plans = {
        p: evaluate(model, cluster, ParallelConfig(tp=8, mbs=1, sequence_parallel=True, precision=p), 2)
        for p in ("bf16", "fp8")
    }
    h, k, f, t, tokens = model.hidden, model.kv_dim, model.ffn_hidden, 8, model.seq
    flops = 2 * tokens * h * ((h + 2 * k) + h + 2 * f + f) / t
    gemm = SXM.gemm
    saved_per_pass = flops * (1 / (989e12 * gemm) - 1 / (1979e12 * 0.9 * gemm))
    shapes = [(tokens, h, (h + 2 * k) / t), (tokens, h / t, h), (tokens, h, 2 * f / t), (tokens, f / t, h)]
    operands = sum(rows * inner + inner * out for rows, inner, out in shapes)
    gradients = sum(rows * out for rows, _, out in shapes)
    inputs_cast = operands - (1 - 1 / t) * tokens * h * 2  # QKV's and w1/w3's inputs, cast on the shard
    gradients_cast = gradients - (1 - 1 / t) * tokens * h * 2  # wo's and w2's output gradients, likewise
    cast_bytes = 5 * inputs_cast + 5 * gradients_cast + 2 * operands
    cast_s = cast_bytes / (3350e9 * SXM.hbm)
    expected = 2 * 80 * (3 * saved_per_pass - cast_s)
    bf16, fp8 = (plans[p].step for p in ("bf16", "fp8"))
    assert bf16 is not None and fp8 is not None
    assert bf16.compute - fp8.compute == pytest.approx(expected, rel=1e-9)
    assert bf16.optimizer == fp8.optimizer  # the GEMMs change, and the TP all-gathers move one byte (test below)
    assert fp8.tp_comm < bf16.tp_comm
    assert plans["fp8"].memory == plans["bf16"].memory  # weights and optimizer state stay as they were


def test_sequence_parallelism_casts_the_gathered_fp8_operands_on_a_ranks_share() -> None:
    """The same TP 8 layer with and without sequence parallelism: with it, QKV's and the MLP's first inputs are cast
    before the all-gather and the projection's and the MLP's second output gradients before theirs, each on 1/t of
    the tokens: 5 bytes an element less on (1 − 1/t)·2·tokens·h elements, forward and backward; the transposes stay."""
    from bubblescope.analysis.planner.step_time import fp8_cast_seconds

    model, t = model_from("llama-3-70b"), 8
    cfg = ParallelConfig(tp=t, precision="fp8")
    hbm, tokens = 3350e9 * SXM.hbm, model.seq
    whole = fp8_cast_seconds(model, cfg, hbm, tokens)
    shard = fp8_cast_seconds(model, replace(cfg, sequence_parallel=True), hbm, tokens)
    saved = 5 * (1 - 1 / t) * 2 * tokens * model.hidden / hbm
    assert whole[0] - shard[0] == pytest.approx(saved, rel=1e-9)
    assert whole[1] - shard[1] == pytest.approx(saved, rel=1e-9)
    assert fp8_cast_seconds(model, replace(cfg, tp=1, sequence_parallel=True), hbm, tokens) == fp8_cast_seconds(
        model, replace(cfg, tp=1), hbm, tokens
    )


def test_weights_gathered_in_fp8_are_cast_on_a_ranks_shard() -> None:
    """Llama 3 8B under FSDP over 8 ranks (zero 3), FP8: with ``fp8_all_gather`` each rank casts its 1/8 shard of the
    linear weights before the all-gather (torchao's FSDP float8 all-gather), so the forward casts 5 bytes an element
    less on 7/8 of a layer's linear weights, h·(h + 2k) + h·h + 2·h·f + f·h elements; the inputs' casts, the backward's
    output-gradient casts and the transposes stay. A mixture's routed experts are cast on their own replicas' share."""
    from bubblescope.analysis.planner.step_time import fp8_cast_seconds

    model = model_from("llama-3-8b")
    h, k, f = model.hidden, model.kv_dim, model.ffn_hidden
    cfg = ParallelConfig(dp=8, zero=3, precision="fp8")
    hbm, tokens = 3350e9 * SXM.hbm, 2 * model.seq
    whole = fp8_cast_seconds(model, cfg, hbm, tokens)
    shard = fp8_cast_seconds(model, replace(cfg, fp8_all_gather=True), hbm, tokens)
    weights = h * (h + 2 * k) + h * h + 2 * h * f + f * h
    assert whole[0] - shard[0] == pytest.approx(5 * weights * (1 - 1 / 8) / hbm, rel=1e-9)
    assert whole[1] == shard[1]
    moe = model_from("qwen3-30b-a3b")
    experts = replace(cfg, dp=16, ep=8, fp8_all_gather=True)  # 16 replicas of the dense weights, 2 of each expert
    ratio = (
        fp8_cast_seconds(moe, replace(experts, fp8_all_gather=False), hbm, tokens)[0]
        - fp8_cast_seconds(moe, experts, hbm, tokens)[0]
    )
    h, q, kv = moe.hidden, moe.q_dim, moe.kv_dim
    held = moe.experts / 8
    routed = held * 3 * h * moe.moe_ffn_hidden
    attention = h * (q + 2 * kv) + q * h
    assert ratio == pytest.approx(5 * (attention * (1 - 1 / 16) + routed * (1 - 1 / 2)) / hbm, rel=1e-9)


def test_megatrons_first_and_last_stage_layers_split_126_layers_over_16_stages() -> None:
    """126 layers, pp 16, 7 on the first and the last: 8 on each of the 14 others; the slowest stage is a middle
    one (8 layers) or the last (7 layers, the output layer and the loss), whichever costs more."""
    answer = plan_document(
        {
            "model": LLAMA_405B,
            "cluster": {"gpu": "H100-SXM", "gpus": 512},
            "global_batch": 64,
            "config": {
                "tp": 8,
                "pp": 16,
                "zero": 1,
                "recompute": "full",
                "first_stage_layers": 7,
                "last_stage_layers": 7,
            },
        }
    )
    (plan,) = answer.plans
    assert plan.config.layers_per_stage == (7,) + (8,) * 14 + (7,)
    assert plan.feasible, plan.problems
    model, cluster = answer.model, answer.cluster
    layer, output = (cost(model, cluster, plan.config, SXM) for cost in (layer_cost, output_layer_cost))
    middle, last = layer.scale(8), layer.scale(7) + output
    slowest = max(middle, last, key=lambda c: c.compute + c.recompute + c.comm)
    assert plan.step is not None and plan.step.compute == pytest.approx(plan.step.microbatches * slowest.compute)
    stages = memory_per_pipeline_rank(model, cluster, plan.config, plan.step.microbatches)
    per_layer = stages[1].params_on_gpu / 8  # a middle stage: layers alone
    assert stages[0].params_on_gpu > 7 * per_layer and stages[-1].params_on_gpu > 7 * per_layer  # embedding, head
    assert all(s.params_on_gpu == stages[1].params_on_gpu for s in stages[1:-1])


def test_layers_per_stage_moves_the_slowest_stage() -> None:
    """GPT-1.7B's 24 layers on 4 stages: 9 on the first makes it the slowest (9 layers against the last's 5 and the
    output layer); the step's stage time is 9 layers' cost."""
    model = model_from("gpt-1.7b")
    cluster = make_cluster("A100-80GB", 4)
    config = ParallelConfig(pp=4, mbs=1, layers_per_stage=(9, 5, 5, 5))
    plan = evaluate(model, cluster, config, 8)
    layer = layer_cost(model, cluster, plan.config, DEFAULT_EFFICIENCIES)
    output = output_layer_cost(model, cluster, plan.config, DEFAULT_EFFICIENCIES)
    assert layer.compute * 9 > layer.compute * 5 + output.compute  # the hand count's premise
    assert plan.step is not None and plan.step.compute == pytest.approx(8 * 9 * layer.compute)
    even = evaluate(model, cluster, ParallelConfig(pp=4, mbs=1), 8)
    assert even.step is not None and even.step.total < plan.step.total


def test_uneven_stages_with_virtual_stages_price_the_fullest_rank_under_the_interleaved_bubble() -> None:
    """GPT-1.7B's 24 layers on 4 ranks of 2 virtual stages each, 8/6/6/4 layers a rank (NeMo's 405B and torchtitan's
    interleaved 405B split this way): the fullest rank's 8 layers set the stage time, the bubble is interleaved
    1F1B's closed form for p=4, m=8, v=2, (p − 1)/(v·m) of the busy time, as with even chunks."""
    model = model_from("gpt-1.7b")
    cluster = make_cluster("A100-80GB", 4)
    config = ParallelConfig(pp=4, vpp=2, mbs=1, schedule=INTERLEAVED_1F1B, layers_per_stage=(8, 6, 6, 4))
    plan = evaluate(model, cluster, config, 8)
    assert plan.step is not None, plan.problems
    layer = layer_cost(model, cluster, plan.config, DEFAULT_EFFICIENCIES)
    output = output_layer_cost(model, cluster, plan.config, DEFAULT_EFFICIENCIES)
    assert layer.compute * 8 > layer.compute * 4 + output.compute  # the hand count's premise: rank 0 is the fullest
    assert plan.step.compute == pytest.approx(8 * 8 * layer.compute)
    assert plan.step.bubble_fraction == pytest.approx(3 / (3 + 2 * 8))
    even = evaluate(model, cluster, replace(config, layers_per_stage=()), 8)  # 6 a rank, the last also the output
    assert even.step is not None and even.step.compute == pytest.approx(8 * (6 * layer.compute + output.compute))
    # the output layer and the fp32 loss over 51,200 words cost more than two layers: 8/6/6/4 balances better than 6 each
    assert output.seconds > 2 * layer.seconds and plan.step.total < even.step.total


def test_unequal_virtual_stages_fill_and_drain_the_pipeline_at_their_largest_chunk() -> None:
    """GPT-1.7B's 6 layers a rank in v = 4 virtual stages (torchtitan splits them 2, 2, 1, 1; Megatron refuses): the
    closed form's (p − 1)/(v·m) assumes chunks of 6/4 layers, but the fill and drain wait on the 2-layer chunk, so
    the lead is (p − 1)·2/(6·m) = 3·2/(6·8) = 1/8 of the busy time, the bubble 1/9 of the step: v = 3's (equal chunks
    of 2), with more transfers. v = 2's chunks of 3 leave 3/16."""
    model = model_from("gpt-1.7b")
    cluster = make_cluster("A100-80GB", 4)
    plans = {
        v: evaluate(model, cluster, ParallelConfig(pp=4, vpp=v, mbs=1, schedule=INTERLEAVED_1F1B), 8) for v in (2, 3, 4)
    }
    steps = {v: plan.step for v, plan in plans.items()}
    assert all(step is not None for step in steps.values()), {v: plan.problems for v, plan in plans.items()}
    four, three, two = steps[4], steps[3], steps[2]
    assert four is not None and three is not None and two is not None
    assert four.bubble_fraction == pytest.approx(1 / 9) and three.bubble_fraction == pytest.approx(1 / 9)
    assert two.bubble_fraction == pytest.approx((3 / 16) / (1 + 3 / 16))
    busy = four.compute + four.recompute + four.tp_comm + four.pp_comm
    assert four.bubble == pytest.approx(busy / 8)
    assert four.pp_comm > three.pp_comm and four.total > three.total


def test_a_search_holding_uneven_stages_tries_virtual_stages_up_to_the_fewest_layers_a_stage_holds() -> None:
    """An uneven 405B split held (3 layers on the first rank, 18 on each middle one, 15 on the last): interleaved 1F1B
    is searched too, every v from 2 to 3 (the first rank's 3 layers bound it), and ranks first (a smaller bubble for
    the same stage time)."""
    fixed = {"tp": 8, "pp": 8, "layers_per_stage": [3, 18, 18, 18, 18, 18, 18, 15], "recompute": "full", "zero": 1}
    body = {"model": "llama-3.1-405b", "cluster": "h100-sxm-x512", "global_batch": 256, "top": 100, "fixed": fixed}
    plans = plan_document(body).plans
    tried = {(plan.config.schedule, plan.config.vpp) for plan in plans}
    assert {vpp for schedule, vpp in tried if schedule is INTERLEAVED_1F1B} == {2, 3}, tried
    assert all(plan.config.layers_per_stage == tuple(fixed["layers_per_stage"]) for plan in plans)
    assert plans[0].config.schedule is INTERLEAVED_1F1B


def test_flash_attention_is_on_unless_asked_off_and_the_answer_says_what_it_assumed() -> None:
    body: dict[str, Any] = {"model": "llama-3-8b", "cluster": "h100-sxm-x8", "global_batch": 8, "config": {"tp": 1}}
    answer = plan_document(body)
    assert answer.plans[0].config.flash_attention is True
    assert any(said.startswith("flash_attention: true") for said in answer.assumed), answer.assumed
    off = plan_document({**body, "config": {"tp": 1, "flash": False}})
    assert off.plans[0].config.flash_attention is False
    assert not any(said.startswith("flash_attention") for said in off.assumed)
    on_memory, off_memory = (a.plans[0].memory for a in (answer, off))
    assert on_memory is not None and off_memory is not None and on_memory.activations < off_memory.activations


@pytest.mark.parametrize(
    ("config", "field", "words"),
    [
        ({"precision": "fp16"}, "config.precision", "expected one of bf16, fp8"),
        ({"tp": 8, "pp": 4, "layers_per_stage": [8, 8, 8]}, "config.layers_per_stage", "3 stages given for pp=4"),
        ({"tp": 8, "pp": 2, "layers_per_stage": [20, 20]}, "config.layers_per_stage", "hold 40 layers, the model 32"),
        ({"tp": 8, "pp": 2, "layers_per_stage": [16, 0]}, "config.layers_per_stage[1]", "must be at least 1"),
        ({"tp": 8, "pp": 2, "vpp": 4, "layers_per_stage": [29, 3]}, "config.layers_per_stage", "at least vpp=4"),
        ({"first_stage_layers": 4}, "config.first_stage_layers", "needs a pipeline: give pp ≥ 2"),
        ({"tp": 8, "pp": 4, "first_stage_layers": 3}, "config.first_stage_layers", "do not split evenly"),
        ({"pp": 2, "first_stage_layers": 3, "layers_per_stage": [3, 29]}, "config.layers_per_stage", "not both"),
        ({"tp": 8, "pp": 4, "vpp": 9}, "config.vpp", "leave a stage 8, fewer than its vpp=9 virtual stages"),
        ({"cp": 0}, "config.cp", "must be at least 1"),
        ({"cp": 2, "cp_comm": "ring"}, "config.cp_comm", "expected one of p2p, allgather"),
        ({"tp": 8, "cp": 16}, "config.cp", "does not divide the 64 GPUs"),
        ({"tp": 8, "pp": 4, "last_stage_layers": 3}, "config.last_stage_layers", "do not split evenly"),
        (
            {"tp": 8, "pp": 4, "first_stage_layers": 20, "last_stage_layers": 20},
            "config.last_stage_layers",
            "first_stage_layers 20 + last_stage_layers 20: 40 layers, more than the model's 32",
        ),
        (
            {"tp": 8, "pp": 4, "first_stage_layers": 31},
            "config.first_stage_layers",
            "1 of the model's 32 layers left for 3 other stages; every stage needs at least one",
        ),
        ({"tp": 1, "tp_comm_overlap": True}, "config.tp_comm_overlap", "needs tp > 1"),
        ({"zero": 3, "fp8_all_gather": True}, "config.fp8_all_gather", "needs precision fp8"),
        ({"precision": "fp8", "fp8_all_gather": True}, "config.fp8_all_gather", "needs zero ≥ 1"),
        ({"fp8_all_gather": "sometimes"}, "config.fp8_all_gather", "true or false"),
        ({"attention_kernel": "fa3"}, "config.attention_kernel", "expected one of cudnn, flash2"),
        ({"kv_repeated": "grouped"}, "config.kv_repeated", "true or false"),
        ({"overlap_param_gather": True}, "config.overlap_param_gather", "needs zero 1 or 2"),
        ({"zero": 3, "overlap_param_gather": True}, "config.overlap_param_gather", "under the forward already"),
        ({"zero": 1, "overlap_param_gather": "hidden"}, "config.overlap_param_gather", "true or false"),
    ],
)
def test_each_new_knob_out_of_range_is_refused_by_name(config: dict[str, Any], field: str, words: str) -> None:
    body = {"model": "llama-3-8b", "cluster": "h100-sxm-x64", "global_batch": 64, "config": config}
    with pytest.raises(PlanInputError) as refused:
        plan_document(body)
    assert refused.value.field == field and words in refused.value.message, (refused.value.field, refused.value)


def test_a_search_holding_tp_overlap_sets_it_where_there_is_tp_and_refuses_it_with_tp_1() -> None:
    """TP overlap hides tensor-parallel collectives: a search holding it turns it on for its t > 1 layouts and runs the
    t = 1 ones without it (nothing to hide, as SP); held with tp 1 it is refused by name."""
    body = {"model": "llama-3-8b", "cluster": "h100-sxm-x8", "global_batch": 64, "top": 1000}
    plans = plan_document({**body, "fixed": {"tp_comm_overlap": True}}).plans
    assert {plan.config.tp for plan in plans} >= {1, 8}
    assert all(plan.config.tp_comm_overlap == (plan.config.tp > 1) for plan in plans)
    with pytest.raises(PlanInputError) as refused:
        plan_document({**body, "fixed": {"tp": 1, "tp_comm_overlap": True}})
    assert refused.value.field == "fixed.tp_comm_overlap" and "needs tp > 1" in refused.value.message


def test_the_attention_kernel_said_is_the_one_the_gpu_is_priced_with() -> None:
    """Off Hopper FlashAttention-2's forward is priced as cuDNN's: an A100's answer says that, not Hopper's 0.55."""
    said = {
        gpu: next(
            words
            for words in plan_document(
                {"model": "llama-3-8b", "cluster": f"{gpu}-x8", "global_batch": 8, "config": {"tp": 8}}
            ).assumed
            if words.startswith("attention_kernel")
        )
        for gpu in ("a100-80gb", "h100-sxm", "b200")
    }
    assert "0.55 of it on Hopper" in said["h100-sxm"]
    assert all("off Hopper flash2" in said[gpu] and "0.55" not in said[gpu] for gpu in ("a100-80gb", "b200")), said


def test_a_search_holding_fp8_all_gather_needs_fp8_and_keeps_to_zero_stages_that_gather() -> None:
    body = {"model": "llama-3-8b", "cluster": "h100-sxm-x64", "global_batch": 64, "fixed": {"fp8_all_gather": True}}
    with pytest.raises(PlanInputError) as refused:
        plan_document(body)
    assert refused.value.field == "fixed.fp8_all_gather" and "precision=fp8" in refused.value.message
    no_zero = {**body, "fixed": {"fp8_all_gather": True, "precision": "fp8", "zero": 0}}
    with pytest.raises(PlanInputError) as refused:
        plan_document(no_zero)
    assert refused.value.field == "fixed.fp8_all_gather" and "zero ≥ 1" in refused.value.message
    found = plan_document({**body, "fixed": {"fp8_all_gather": True, "precision": "fp8"}, "top": 50}).plans
    assert found and all(plan.config.fp8_all_gather and plan.config.zero >= 1 for plan in found)


def test_fp8_on_a_gpu_without_fp8_is_refused_by_the_api(server: LiveServer) -> None:
    body = {"model": "gpt-1.7b", "cluster": "a100-80gb-x8", "global_batch": 8, "config": {"precision": "fp8"}}
    with server.client() as client:
        assert_names(client.post("/api/v1/plan", json=body), 422, ["body", "config", "precision"], "no FP8")
        body["config"] = {"precision": "fp8"}
        body["cluster"] = "b200-x8"
        answer = client.post("/api/v1/plan", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["plans"][0]["config"]["precision"] == "fp8"


def test_every_gpu_in_the_catalog_carries_its_source() -> None:
    with GPUS.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert {row["name"].lower() for row in rows} == set(GPU_CATALOG)
    assert {"h100-sxm", "h100-pcie", "h100-hbm2e-500w", "h200", "b200"} <= set(GPU_CATALOG)
    for spec in GPU_CATALOG.values():
        assert len(spec.source) > 40 and spec.peak_tflops > 0, spec
        assert spec.fp8_tflops == 0 or spec.fp8_tflops == pytest.approx(2 * spec.peak_tflops, rel=0.01), spec


def test_a_gpu_is_found_by_the_name_torch_gives_the_device_and_an_unknown_one_is_refused() -> None:
    """What an integration declares for its cluster (``torch.cuda.get_device_name``), any case."""
    assert make_cluster("NVIDIA H100 80GB HBM3", 8).gpu == GPU_CATALOG["h100-sxm"]
    assert make_cluster("nvidia h200", 8).gpu == GPU_CATALOG["h200"]
    with pytest.raises(PlanInputError) as refused:
        make_cluster("NVIDIA H100 NVL", 8)  # 94 GB, a different part: not priced as an SXM
    assert refused.value.field == "cluster.gpu"


def test_context_parallelism_splits_the_sequence_and_prices_its_key_value_exchange() -> None:
    """Llama 3 8B at 32k tokens on 8 H100s, cp 4 (dp 2) against cp 1 (dp 8), global batch 8, ZeRO-1: each GPU holds a
    quarter of the sequence, so a layer's activations are a quarter and the replica's work per step the same (4
    micro-batches of a quarter against 1 whole). The keys and values, 4·32768·1024 bytes, gathered over NVLink, hide
    under attention either way here: ring attention (``p2p``) under each block, torch's ``allgather`` under the first
    of its 4 blocks; what ``allgather`` leaves exposed is the last of its key and value gradients' fp32 steps, 2·bytes/4,
    a layer and micro-batch: 10 µs + 2·(4·32768·1024)/4 / (450 GB/s · the H100 SXM's NVLink efficiency)."""
    model = model_from({"preset": "llama-3-8b", "seq": 32768})
    cluster = make_cluster("H100-SXM", 8)
    base = {"tp": 1, "mbs": 1, "zero": 1, "recompute": "none"}
    one, ring, gathered = (
        evaluate(model, cluster, ParallelConfig(**base, **extra), 8)  # type: ignore[arg-type]
        for extra in ({"cp": 1}, {"cp": 4}, {"cp": 4, "cp_comm": "allgather"})
    )
    assert one.step and ring.step and gathered.step and one.memory and ring.memory
    assert (one.config.dp, ring.config.dp, ring.step.microbatches) == (8, 2, 4)
    assert ring.step.compute == pytest.approx(one.step.compute, rel=1e-9)
    assert ring.memory.activations == pytest.approx(one.memory.activations / 4, rel=1e-9)
    assert ring.memory.optimizer == pytest.approx(one.memory.optimizer)  # ZeRO-1 over dp·cp = 8 ranks either way
    last_gradient_step = 10e-6 + 2 * (4 * 32768 * 1024) / 4 / (450e9 * SXM.nvlink)
    assert gathered.step.cp_comm == pytest.approx(4 * 32 * last_gradient_step, rel=1e-9)
    assert ring.step.cp_comm == 0.0 and one.step.cp_comm == 0.0
    assert gathered.step.total > ring.step.total


def test_torchs_context_parallelism_hides_its_gathers_under_the_first_block_and_its_gradients_under_the_next() -> None:
    """``cp_seconds`` for ``allgather`` (torch's ``_templated_ring_attention`` and its backward), by hand: Llama 3 8B at
    128k tokens, cp 4 over NVLink (450 GB/s · 0.822, NCCL's published figure), the keys and values repeated to its 32
    heads (``kv_repeated``, torchtitan's Llama until 2026): 4·131072·4096 bytes, a gather (3/4 of them) 10 µs + 4.35 ms.
    With attention 6 ms forward and 16 ms backward, a block is 1.5 and 4 ms: each gather shows 2.86 ms beyond its first
    block forward (twice with full recompute) and 0.36 ms backward; a gradient step (2·bytes/4 in fp32: 10 µs + 2.90 ms)
    hides under the next block's backward, three times, and the last one shows whole. Without ``kv_repeated`` a quarter
    of the bytes (1,024 wide): every gather hides too, and only the last gradient step shows (10 µs + 0.73 ms)."""
    from bubblescope.analysis.planner.step_time import cp_seconds

    model = model_from({"preset": "llama-3-8b", "seq": 131072})
    cluster = make_cluster("H100-SXM", 8)
    link = 450e9 * SXM.nvlink
    kv_bytes = 4 * 131072 * 4096
    gather = 10e-6 + 0.75 * kv_bytes / link
    step = 10e-6 + 2 * kv_bytes / 4 / link
    attention, backward = 6e-3, 16e-3
    assert SXM.nvlink == 0.822 and step < 4e-3 < gather  # the numbers the docstring works with
    for recompute, forwards in (("none", 1), ("full", 2)):
        cfg = ParallelConfig(cp=4, cp_comm="allgather", kv_repeated=True, recompute=recompute)
        expected = forwards * (gather - 1.5e-3) + (gather - 4e-3) + step
        assert cp_seconds(model, cluster, cfg, SXM, attention, backward) == pytest.approx(expected, rel=1e-9)
    grouped = ParallelConfig(cp=4, cp_comm="allgather", recompute="full")
    hidden_but_last = 10e-6 + 2 * (kv_bytes / 4) / 4 / link
    assert cp_seconds(model, cluster, grouped, SXM, attention, backward) == pytest.approx(hidden_but_last, rel=1e-9)


def test_a_long_sequence_is_searched_with_context_parallelism() -> None:
    """128k tokens, 8 H100s, 2 sequences a step. On torchtitan's own 96 GB parts the layout torchtitan ran (FSDP 2 ×
    CP 4, full AC) is among the ten fastest, within 0.1% of the fastest with full AC (per-op AC, which the planner
    finds fits with the whole sequence a rank's ZeRO sharded over CP 8, leads), and each of them splits the sequence,
    over CP or over TP with sequence parallelism. On 80 GB parts that layout does not fit: the loss's buffers alone
    are 12 bytes × 32k tokens × 128,256 logits a GPU, 47 GiB."""
    model = {"preset": "llama-3-8b", "seq": 131072}
    torchtitans = {"tp": 1, "cp": 4, "zero": 3, "recompute": "full"}
    answer = plan_document(
        {"model": model, "cluster": {"gpu": "H100-HBM2e-500W", "gpus": 8}, "global_batch": 2, "top": 10}
    )
    layouts = [(p.config.tp, p.config.cp, p.config.dp, p.config.zero, p.config.recompute) for p in answer.plans]
    assert (1, 4, 2, 3, "full") in layouts, layouts
    steps = {layout: p.step.total for layout, p in zip(layouts, answer.plans, strict=True) if p.step is not None}
    fastest_full = min(step for layout, step in steps.items() if layout[-1] == "full")
    assert steps[(1, 4, 2, 3, "full")] == pytest.approx(fastest_full, rel=1e-3), steps
    assert all(cp > 1 or tp > 1 for tp, cp, *_ in layouts), layouts
    on_80gb = plan_document({"model": model, "cluster": "h100-sxm-x8", "global_batch": 2, "config": torchtitans})
    memory = on_80gb.plans[0].memory
    assert memory is not None and not memory.fits and memory.loss / 2**30 == pytest.approx(47.0, abs=0.1), memory
    refused = {"model": "llama-3-8b", "cluster": "h100-sxm-x8", "global_batch": 8, "config": {"cp": 3}}
    with pytest.raises(PlanInputError) as error:
        plan_document(refused)
    assert error.value.field == "config.cp", error.value


def test_a_long_sequence_no_context_degree_splits_is_still_searched_without_context_parallelism() -> None:
    """An odd 65,535-token sequence splits into 2·cp equal chunks for no cp > 1; the search still tries cp 1 (it
    found nothing and blamed the layouts). The same sequence one token longer is tried with cp 2 too."""
    body = {"model": {"preset": "llama-3-8b", "seq": 65535}, "cluster": "h100-sxm-x8", "global_batch": 8, "top": 50}
    odd = plan_document(body)
    assert odd.plans and {plan.config.cp for plan in odd.plans} == {1}, odd.why_none
    even = plan_document({**body, "model": {"preset": "llama-3-8b", "seq": 65536}, "top": 1000})
    assert {1, 2} <= {plan.config.cp for plan in even.plans}


def test_a_gpu_given_by_its_fields_needs_memory_past_the_reserve_and_all_its_figures() -> None:
    """A GPU of 4 GiB or less has nothing left after the 4 GiB every plan keeps free (it priced "-1.0 GiB
    available"); a GPU object missing several figures names them all at once."""
    figures = {"peak_tflops": 900, "hbm_gbps": 3000, "nvlink_gbps": 450, "network_gbps": 50}
    body: dict[str, Any] = {"model": "llama-3-8b", "global_batch": 8}
    with pytest.raises(PlanInputError) as error:
        plan_document({**body, "cluster": {"gpu": {**figures, "memory_gib": 4}, "gpus": 8}})
    assert error.value.field == "cluster.gpu.memory_gib" and "4 GiB kept free" in error.value.message
    assert plan_document({**body, "cluster": {"gpu": {**figures, "memory_gib": 4.5}, "gpus": 8}}).why_none
    # named as a catalog part, it is still the request's own figures (priced with the defaults), and said so
    named = plan_document({**body, "cluster": {"gpu": {**figures, "memory_gib": 80, "name": "H100-SXM"}, "gpus": 8}})
    assert named.cluster.gpu.name == "H100-SXM (given figures)"
    with pytest.raises(PlanInputError) as error:
        plan_document({**body, "cluster": {"gpu": {"peak_tflops": 900}, "gpus": 8}})
    assert error.value.field == "cluster.gpu.hbm_gbps"
    assert "also missing: memory_gib, network_gbps, nvlink_gbps" in error.value.message


def test_expert_parallelism_splits_the_experts_and_prices_the_all_to_alls() -> None:
    """Mixtral 8x7B (8 experts of 3·4096·14336 weights a layer, 2 per token) on 16 H100s, ep 8 of dp 16, ZeRO-2: a
    GPU holds one expert a layer, and its optimizer state and fp32 gradients are sharded over the 2 ranks holding that
    expert while the dense part's are sharded 16 ways (with ZeRO-1's whole fp32 gradients it needs 75 of 72 GiB).
    Each layer sends a token's two routed copies, 4096·2·4096·2 bytes, 7/8 of them away, four times (dispatch and combine, forward and backward) and twice more for the recomputed forward (full recompute,
    so that it fits): (7/8)·bytes / (450 GB/s·0.65) + 10 µs each."""
    model = model_from("mixtral-8x7b")
    assert model.params == pytest.approx(46.7e9, rel=0.01) and model.active_params == pytest.approx(12.9e9, rel=0.01)
    cluster = make_cluster("H100-SXM", 16)
    plan = evaluate(model, cluster, ParallelConfig(tp=1, mbs=1, zero=2, ep=8, recompute="full"), 16)
    assert plan.feasible and plan.memory is not None and plan.step is not None, plan.problems
    expert = 3 * 4096 * 14336
    experts_on_gpu = 32 * expert  # one of 8 experts a layer
    dense_on_gpu = plan.memory.params_on_gpu - experts_on_gpu
    assert model.params == pytest.approx(dense_on_gpu + 32 * 8 * expert, rel=1e-9)
    assert plan.memory.optimizer == pytest.approx(12 * (dense_on_gpu / 16 + experts_on_gpu / 2), rel=1e-9)
    assert plan.memory.gradients == pytest.approx(4 * (dense_on_gpu / 16 + experts_on_gpu / 2), rel=1e-9)
    routed_bytes = 4096 * 2 * 4096 * 2
    one = 10e-6 + 7 / 8 * routed_bytes / (450e9 * SXM.nvlink)
    assert plan.step.ep_comm == pytest.approx(1 * 32 * 6 * one, rel=1e-9)  # 1 micro-batch, 32 layers, recomputed
    tokens = 16 * 4096  # model FLOPs count the active parameters, not all 46.7 B
    assert plan.mfu == pytest.approx(
        tokens * (6 * model.active_params + 12 * 32 * 4096 * 4096) / (plan.step.total * 16 * 989e12), rel=1e-9
    )
    replicated = evaluate(model, cluster, ParallelConfig(tp=1, mbs=1, zero=2, ep=1, recompute="full"), 16)
    assert replicated.memory is not None and replicated.memory.total > plan.memory.total


def test_an_expert_group_over_two_nodes_sends_the_other_nodes_share_over_the_network_beside_nvlink() -> None:
    """Qwen3 30B-A3B on 16 H100s in two nodes, ep 16 (Megatron-Bridge's DGX H100 run): each GPU's routed copies,
    4096·8·2048·2 bytes, go 1/16 to each rank: 7/16 over NVLink to its node's other seven, 8/16 over its own NIC to
    the other node, both at once, so the NIC's share sets each all-to-all's time (four a layer). Sent all over the
    network, as when the group was priced as one link, they would take twice as long."""
    model, cluster = model_from("qwen3-30b-a3b"), make_cluster("H100-SXM", 16)
    plan = evaluate(model, cluster, ParallelConfig(tp=1, mbs=1, zero=1, ep=16, precision="fp8"), 1024)
    assert plan.step is not None, plan.problems
    routed_bytes = 4096 * 8 * 2048 * 2
    gpu = cluster.gpu
    nvlink = 7 / 16 * routed_bytes / (gpu.nvlink_gbps * 1e9 * SXM.nvlink)
    network = 8 / 16 * routed_bytes / (gpu.network_gbps * 1e9 * SXM.network)
    assert network > nvlink  # the premise: the NIC is the slower path
    microbatches = 1024 // 16
    assert plan.step.ep_comm == pytest.approx(microbatches * 48 * 4 * (10e-6 + network), rel=1e-9)
    one_link = 15 / 16 * routed_bytes / (gpu.network_gbps * 1e9 * SXM.network)
    assert plan.step.ep_comm < 0.6 * microbatches * 48 * 4 * (10e-6 + one_link)


def test_experts_own_tensor_parallelism_keeps_the_flops_and_drops_the_routed_copies_tensor_parallel_collectives() -> (
    None
):
    """Qwen3 30B-A3B on 16 H100s in two nodes at tp 2: etp 1, ep 16 (Megatron's ``--expert-tensor-parallel-size 1``)
    against the experts split like the rest (etp 2, ep 8). The routed FLOPs a GPU computes are the same (half the
    rows each twice as wide), so in bf16 the compute is equal; the all-gather and reduce-scatter of the routed copies
    over the experts' tensor-parallel pair go (8 copies a token, 2·4096·2048·8 bytes a ring, twice a layer); ep 16 over
    etp 1 puts 8 expert ranks in a node (not 8/2 = 4): the all-to-all sends 8/16 of a GPU's routed copies,
    4096/2·8·2048·2 bytes (its sequence-parallel share), over its NIC and 7/16 over NVLink, four a layer."""
    model, cluster = model_from("qwen3-30b-a3b"), make_cluster("H100-SXM", 16)
    base = ParallelConfig(tp=2, mbs=1, zero=1, sequence_parallel=True)
    narrow = evaluate(model, cluster, replace(base, ep=16, etp=1), 64)
    wide = evaluate(model, cluster, replace(base, ep=8), 64)
    assert narrow.step is not None and wide.step is not None, (narrow.problems, wide.problems)
    assert narrow.config.expert_replicas == 1 and wide.config.expert_replicas == 1  # 2·8 ranks over etp·ep = 16
    assert narrow.step.compute == pytest.approx(wide.step.compute, rel=1e-12)
    routed_ring = 2 * (
        SXM.collective_latency_s + 1 / 2 * 2 * 4096 * 2048 * 8 / (cluster.gpu.nvlink_gbps * 1e9 * SXM.nvlink)
    )
    microbatches = 64 // 8
    expected = microbatches * 48 * 2 * routed_ring  # forward and backward, an all-gather + reduce-scatter pair each
    assert wide.step.tp_comm - narrow.step.tp_comm == pytest.approx(expected, rel=1e-9) and narrow.step.tp_comm > 0
    routed_bytes = 4096 / 2 * 8 * 2048 * 2
    network = 8 / 16 * routed_bytes / (cluster.gpu.network_gbps * 1e9 * SXM.network)
    nvlink = 7 / 16 * routed_bytes / (cluster.gpu.nvlink_gbps * 1e9 * SXM.nvlink)
    assert network > nvlink
    assert narrow.step.ep_comm == pytest.approx(microbatches * 48 * 4 * (10e-6 + network), rel=1e-9)
    assert narrow.as_dict()["config"]["etp"] == 1 and wide.as_dict()["config"]["etp"] is None  # null: as tp
    # context parallelism is folded into the expert ranks: at cp 2 (tp 1), ep 16 still has 8 ranks in a node
    folded = evaluate(model, cluster, ParallelConfig(mbs=1, zero=1, cp=2, ep=16), 64).step
    assert folded is not None
    routed_cp = 4096 / 2 * 8 * 2048 * 2
    network_cp = 8 / 16 * routed_cp / (cluster.gpu.network_gbps * 1e9 * SXM.network)
    assert folded.ep_comm == pytest.approx(64 // 8 * 48 * 4 * (10e-6 + network_cp), rel=1e-9)


def test_experts_split_over_fewer_ranks_weigh_more_and_cast_more_fp8_weights() -> None:
    """Qwen3 30B-A3B on 16 H100s at tp 2, ep 8: etp 1 holds each of its 16 experts whole, etp 2 half of each, so a GPU
    holds twice the routed weights (2 bytes each, ZeRO-1 leaves them whole) and in FP8 casts 7 bytes of each extra
    weight a layer and micro-batch (forward 5, backward 2): 16·(2,048·768 + 384·2,048) more weights a layer."""
    model, cluster = model_from("qwen3-30b-a3b"), make_cluster("H100-SXM", 16)
    base = ParallelConfig(tp=2, mbs=1, zero=1, ep=8, sequence_parallel=True, precision="fp8")
    whole, halved = (evaluate(model, cluster, replace(base, etp=etp), 64) for etp in (1, 2))
    assert whole.step is not None and halved.step is not None and whole.memory and halved.memory
    per_layer = [layer_params_on_gpu(model, 2, 8, etp)[1] for etp in (1, 2)]
    assert per_layer[0] == pytest.approx(2 * per_layer[1], rel=1e-12)
    extra_weights = model.layers * (per_layer[0] - per_layer[1])
    assert whole.memory.weights - halved.memory.weights == pytest.approx(2 * extra_weights, rel=1e-9)
    extra_cast = 16 * (2048 * 768 + 384 * 2048)
    expected = 64 // 8 * 48 * 7 * extra_cast / (cluster.gpu.hbm_gbps * 1e9 * SXM.hbm)
    assert whole.step.compute - halved.step.compute == pytest.approx(expected, rel=1e-9)
    # the search tries the experts whole: held at tp 2 with ep 16, every layout it returns has etp 1
    found = search(model, cluster, 64, top=3, fixed={"tp": 2, "ep": 16})
    assert found and all(plan.config.etp == 1 for plan in found)


def test_a_dispatcher_that_crosses_the_network_once_a_node_sends_each_token_once_to_each_other_node() -> None:
    """Qwen3 30B-A3B on 16 H100s in two nodes, ep 16, dispatched by HybridEP (Megatron-Bridge's H100 recipe): each
    GPU's 4,096 tokens cross to the other node once if any of their 8 experts (of 128, 64 a node) sits there,
    1 − C(64, 8)/C(128, 8) of them, 2,048·2 bytes each; 7/8 of its routed copies (4096·8·2048·2 bytes) are fanned out
    over NVLink; the slower of the two, four times a layer. DeepEP prices the same; inside one node it is the
    all-to-all."""
    model, cluster = model_from("qwen3-30b-a3b"), make_cluster("H100-SXM", 16)
    base = ParallelConfig(tp=1, mbs=1, zero=1, ep=16, precision="fp8")
    plans = {way: evaluate(model, cluster, replace(base, dispatcher=way), 1024) for way in DISPATCHERS}
    steps = {way: plan.step for way, plan in plans.items()}
    assert all(steps.values()), {way: plan.problems for way, plan in plans.items()}
    crossing = 1 - math.comb(64, 8) / math.comb(128, 8)
    network = 4096 * crossing * 2048 * 2 / (cluster.gpu.network_gbps * 1e9 * SXM.network)
    nvlink = 7 / 8 * 4096 * 8 * 2048 * 2 / (cluster.gpu.nvlink_gbps * 1e9 * SXM.nvlink)
    expected = 1024 // 16 * 48 * 4 * (10e-6 + max(network, nvlink))
    hybrid, deep, plain = steps["hybridep"], steps["deepep"], steps["alltoall"]
    assert hybrid is not None and deep is not None and plain is not None
    assert hybrid.ep_comm == pytest.approx(expected, rel=1e-9) and deep.ep_comm == hybrid.ep_comm
    assert hybrid.ep_comm < plain.ep_comm / 3  # about one network copy a token instead of four
    one_node = make_cluster("H100-SXM", 8)
    inside = [evaluate(model, one_node, replace(base, ep=8, dispatcher=way), 64).step for way in DISPATCHERS]
    assert inside[0] is not None and all(step is not None and step.ep_comm == inside[0].ep_comm for step in inside)


def test_the_qwen3_235b_recipe_is_asked_with_etp_and_refused_without_naming_it() -> None:
    """Megatron-Bridge's DGX H100 Qwen3 235B-A22B recipe (256 GPUs, TP 2, PP 8, VP 4, EP 32, expert TP 1): EP 32
    comes out of tp·dp = 32 ranks only with the experts' own tensor parallelism at 1; without it the refusal says so."""
    document = {"model": "qwen3-235b-a22b", "cluster": "h100-sxm-x256", "global_batch": 8192}
    recipe = {"tp": 2, "pp": 8, "vpp": 4, "ep": 32, "mbs": 1, "zero": 1, "precision": "fp8"}
    recipe["layers_per_stage"] = [11, 12, 12, 12, 12, 12, 12, 11]  # 94 layers + embedding + loss over 32 chunks
    with pytest.raises(PlanInputError) as refused:
        plan_document({**document, "config": recipe})
    assert refused.value.field == "config.ep" and "etp below tp" in refused.value.message, refused.value
    (plan,) = plan_document({**document, "config": {**recipe, "etp": 1}}).plans
    assert plan.step is not None and plan.config.expert_replicas == 1 and plan.step.ep_comm > 0
    # a run registered with that layout, under Megatron's name for it, is priced as `plan` prices it
    run = {**document, **recipe, "expert_tensor_parallel_size": 1}
    declared = declared_plan(run)
    assert declared is not None and declared.config.with_dp(256) == plan.config
    assert declared_plan({**document, **recipe}) is None  # a layout `plan` refuses prices nothing


def test_ep_under_torchtitans_name_takes_torchtitans_default_etp_of_1() -> None:
    """torchtitan's expert_tensor_parallel_degree defaults to 1, Megatron's --expert-tensor-parallel-size to the
    layout's tp: ep named either way, with no etp, is priced at its framework's default; an etp given wins."""
    assert config_fields({"tp": 2, "expert_parallel_degree": 8})["etp"] == 1
    assert "etp" not in config_fields({"tp": 2, "expert_model_parallel_size": 8})
    assert "etp" not in config_fields({"tp": 2, "ep": 8})
    assert "etp" not in config_fields(
        {"tp": 2, "expert_parallel_degree": 1}
    )  # torchtitan's default ep: no experts split
    assert config_fields({"tp": 2, "expert_parallel_degree": 8, "expert_tensor_parallel_degree": 2})["etp"] == 2
    run = {"model": "mixtral-8x7b", "cluster": "h100-sxm-x16", "global_batch": 64, "tp": 2, "zero": 1}
    titan, megatron = (
        declared_plan({**run, name: 8}) for name in ("expert_parallel_degree", "expert_model_parallel_size")
    )
    assert titan is not None and megatron is not None
    titan_layout, megatron_layout = titan.config.with_dp(16), megatron.config.with_dp(16)
    assert (titan_layout.expert_tp, titan_layout.expert_replicas) == (1, 2)
    assert (megatron_layout.expert_tp, megatron_layout.expert_replicas) == (2, 1)


@pytest.mark.parametrize(
    ("model", "config", "field", "words"),
    [
        ("llama-3-8b", {"ep": 2}, "config.ep", "needs a mixture of experts"),
        ("llama-3-8b", {"tp": 2, "etp": 1}, "config.etp", "needs a mixture of experts"),
        ("mixtral-8x7b", {"tp": 2, "etp": 4}, "config.etp", "above tp=2 is not modelled"),
        ("mixtral-8x7b", {"tp": 4, "ep": 8, "etp": 2}, "config.ep", "ep·etp = 8·2 does not divide tp·dp·cp = 8"),
        ("mixtral-8x7b", {"etp": 0}, "config.etp", "must be at least 1"),
        ("mixtral-8x7b", {"dispatcher": "nccl"}, "config.dispatcher", "expected one of alltoall, deepep, hybridep"),
        ({"preset": "mixtral-8x7b", "moe_ffn_hidden": 14337}, {"tp": 2, "etp": 2}, "config.etp", "width 14337"),
        ("mixtral-8x7b", {"ep": 16}, "config.ep", "does not divide the 8 experts"),
        ("mixtral-8x7b", {"tp": 4, "ep": 4}, "config.ep", "does not divide dp·cp = 2"),
        ("mixtral-8x7b", {"capacity_factor": 0}, "config.capacity_factor", "expected a positive number"),
        ({"preset": "llama-3-8b", "top_k": 2}, {}, "model.experts", "need experts > 0"),
        ({"preset": "mixtral-8x7b", "top_k": 9}, {}, "model.top_k", "more than the 8 experts"),
    ],
)
def test_expert_parallelism_out_of_range_is_refused_by_name(
    model: Any, config: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(PlanInputError) as refused:
        plan_document({"model": model, "cluster": "h100-sxm-x8", "global_batch": 8, "config": config})
    assert refused.value.field == field and words in refused.value.message, refused.value


def test_scale_terms_are_named_and_grow_with_the_ranks() -> None:
    """The same per-GPU work on 1,024 and 16,384 GPUs (Llama 3 70B, tp 8, pp 4, a 4-sequence share per replica): the
    wait for the slowest rank is σ·√(2 ln n) of the step (σ 0.2 %), the reduction's tree latency grows with
    log2 of the replicas, and a 4:1 oversubscribed leaf uplink slows the data-parallel reduction once the group
    spans leaves."""
    model = model_from("llama-3-70b")
    config = ParallelConfig(tp=8, pp=4, mbs=1, zero=1, recompute="full")
    small, big = (evaluate(model, make_cluster("H100-SXM", gpus), config, gpus // 32 * 4) for gpus in (1024, 16384))
    assert small.step and big.step and small.feasible and big.feasible, (small.problems, big.problems)
    for plan, gpus in ((small, 1024), (big, 16384)):
        assert plan.step is not None
        before = plan.step.total - plan.step.straggler
        assert plan.step.straggler == pytest.approx(before * 0.002 * math.sqrt(2 * math.log(gpus)), rel=1e-9)
    assert big.step.straggler / (big.step.total - big.step.straggler) > small.step.straggler / (
        small.step.total - small.step.straggler
    )
    assert big.step.dp_comm >= small.step.dp_comm
    parts = big.as_dict()["step_time_parts_s"]
    assert parts is not None and {"straggler", "dp_comm", "cp_comm", "ep_comm"} <= set(parts)
    crowded = evaluate(
        model, make_cluster("H100-SXM", 16384, oversubscription=4.0), replace(config, recompute="none"), 2048
    )
    flat = evaluate(model, make_cluster("H100-SXM", 16384), replace(config, recompute="none"), 2048)
    assert crowded.step is not None and flat.step is not None
    assert crowded.step.dp_comm > flat.step.dp_comm  # the reduction's bytes cross the shared uplinks


def test_a_reduction_over_thousands_of_replicas_pays_a_tree_of_network_steps_per_bucket() -> None:
    """10 GB of gradients in 100 MB buckets over 2,048 replicas: 100 buckets, each all-reduce (two passes) a tree
    of 2·log2(2048) = 22 network steps of 5 µs; none inside one node."""
    from bubblescope.analysis.planner.step_time import dp_latency_seconds

    eff = DEFAULT_EFFICIENCIES
    assert dp_latency_seconds(10e9, 2048, False, eff, passes=2) == pytest.approx(100 * 22 * 5e-6)
    assert dp_latency_seconds(10e9, 2048, False, eff, passes=3) == pytest.approx(1.5 * 100 * 22 * 5e-6)  # ZeRO-3
    assert dp_latency_seconds(10e9, 8, True, eff, passes=2) == 0.0


def test_what_a_review_found_now_evaluates_or_is_refused_by_name() -> None:
    """One stage given its layers (pp 1), uneven stages at a global batch past the schedule's action limit, a
    capacity factor typed on the command line, and a custom GPU's figures out of any GPU's reach."""
    body = {"model": "llama-2-7b", "cluster": "h100-sxm-x8", "global_batch": 8}
    (one,) = plan_document({**body, "config": {"pp": 1, "layers_per_stage": [32]}}).plans
    assert one.step is not None, one.problems
    (big,) = plan_document(
        {**body, "global_batch": 8192, "config": {"pp": 8, "layers_per_stage": [3, 4, 4, 4, 4, 4, 4, 5]}}
    ).plans
    assert big.step is not None and big.memory is not None, big.problems
    typed = {"model": "mixtral-8x7b", "cluster": "h100-sxm-x16", "global_batch": 16}
    (moe,) = plan_document({**typed, "config": {"ep": "8", "capacity_factor": "1.25", "recompute": "full"}}).plans
    assert moe.config.capacity_factor == 1.25 and moe.config.ep == 8
    for figure in (1e300, 5e-324):
        gpu = {
            "name": "x",
            "peak_tflops": figure,
            "memory_gib": 80,
            "hbm_gbps": 3000,
            "nvlink_gbps": 450,
            "network_gbps": 50,
        }
        with pytest.raises(PlanInputError) as refused:
            plan_document({**body, "cluster": {"gpu": gpu, "gpus": 8}})
        assert refused.value.field == "cluster.gpu.peak_tflops", refused.value


def test_a_stage_of_tp_times_cp_gpus_sends_its_pipeline_messages_over_the_network() -> None:
    """tp 2 × cp 4 fills an 8-GPU node, so pp 2's two stages sit in different nodes: the message, 2·b·(s/cp)·h/t
    bytes, goes over the network at 50 GB/s · 0.8, not NVLink."""
    from bubblescope.analysis.planner.step_time import p2p_seconds

    model = model_from({"preset": "llama-3-8b", "seq": 32768})
    cluster = make_cluster("H100-SXM", 16)
    cfg = ParallelConfig(tp=2, cp=4, pp=2, dp=1, sequence_parallel=True)
    message = 2 * 32768 / 4 * 4096 / 2
    one = DEFAULT_EFFICIENCIES.collective_latency_s + message / (50e9 * DEFAULT_EFFICIENCIES.network)
    assert p2p_seconds(model, cluster, cfg, DEFAULT_EFFICIENCIES) == pytest.approx(2 * one)


def test_the_search_tries_every_expert_degree_that_divides_the_experts() -> None:
    six = {"preset": "mixtral-8x7b", "experts": 6, "top_k": 2}
    answer = plan_document(
        {"model": six, "cluster": "h100-sxm-x24", "global_batch": 24, "fixed": {"tp": 1, "cp": 1, "pp": 1}, "top": 50}
    )
    assert {3, 6} <= {plan.config.ep for plan in answer.plans}, sorted({plan.config.ep for plan in answer.plans})


def test_tensor_parallel_overlap_hides_its_collectives_under_the_linear_gemms_and_no_more() -> None:
    """Llama 3 70B, tp 8 on 8 H100s, seq 8192: a layer's TP collectives, two ring all-reduces of 2·s·h bytes a pass
    (forward and backward), each 2·(10 µs + 7/8 · bytes / (450 GB/s · 0.65)); overlapped, up to 0.8 of the
    linear GEMMs' time (forward once, backward twice: 3×) hides them: what is hidden is the smaller of the two."""
    model = model_from("llama-3-70b")
    cluster = make_cluster("H100-SXM", 8)
    plans = {
        overlap: evaluate(
            model, cluster, ParallelConfig(tp=8, mbs=1, sequence_parallel=True, tp_comm_overlap=overlap), 2
        )
        for overlap in (False, True)
    }
    eff = SXM
    ring = 2 * (eff.collective_latency_s + 7 / 8 * 2 * 8192 * 8192 / (450e9 * eff.nvlink))
    tp_pass = 2 * ring  # two all-reduces a pass
    h, k, f, tokens = model.hidden, model.kv_dim, model.ffn_hidden, model.seq
    linear = 2 * tokens * h * ((h + 2 * k) + h + 2 * f + f) / 8 / (989e12 * eff.gemm)  # compute-bound here
    hidden = min(2 * tp_pass, eff.tp_overlap * 3 * linear)
    exposed, overlapped = (plans[o].step for o in (False, True))
    assert exposed is not None and overlapped is not None
    assert exposed.tp_comm - overlapped.tp_comm == pytest.approx(2 * 80 * hidden, rel=1e-9)  # 2 micro-batches
    assert overlapped.tp_comm > 0  # the output layer's collectives are not overlapped


def test_fp8_with_sequence_parallelism_gathers_its_activations_in_one_byte() -> None:
    """Llama 3 70B, 8k tokens, tp 8 with sequence parallelism over NVLink (450 GB/s · its efficiency), no recompute: a pass
    runs two all-gather + reduce-scatter pairs (attention's and the MLP's) of 8192·8192 activations, two passes a
    layer. In bf16 each collective moves 2 bytes an element; in FP8 the all-gathers move the FP8 input (forward) or
    output gradient (backward), 1 byte, and the reduce-scatters bf16, 2 (torchao's Float8ColwiseParallel and
    Float8RowwiseParallel under torchtitan's Float8 with TP): a pair 10 µs + (7/8)·(1 + 2)·8192·8192 / link a phase
    pair, where bf16 has (7/8)·(2 + 2)·8192·8192. Without sequence parallelism (all-reduces) nothing changes."""
    model = model_from({"preset": "llama-3-70b", "seq": 8192})
    cluster = make_cluster("H100-SXM", 8)
    link = 450e9 * SXM.nvlink
    elements = 8192 * 8192

    def pair(bytes_per_element: float) -> float:  # one all-gather + reduce-scatter pair: two ring phases
        return 2 * (10e-6 + 7 / 8 * bytes_per_element / 2 * elements / link)

    for precision, bytes_per_element in (("bf16", 4.0), ("fp8", 3.0)):
        cfg = ParallelConfig(tp=8, sequence_parallel=True, precision=precision)
        assert layer_cost(model, cluster, cfg, SXM).comm == pytest.approx(2 * 2 * pair(bytes_per_element), rel=1e-9)
    no_sp = [layer_cost(model, cluster, ParallelConfig(tp=8, precision=p), SXM).comm for p in ("bf16", "fp8")]
    assert no_sp[0] == pytest.approx(no_sp[1], rel=1e-12)
