"""The planner's knobs for how large models are trained now (docs/planner.md): FP8 linear GEMMs, uneven pipeline
stages (Megatron's first/last-stage layers, torchtitan's fewer layers on the ends), flash attention on by default
and said, the GPU catalog with a source per row; each against a hand count from the documented formula, and each
refused by name when out of range."""

from __future__ import annotations

import csv
from typing import Any

import pytest

from bubblescope.analysis.planner import GPU_CATALOG, ParallelConfig, evaluate, make_cluster, model_from
from bubblescope.analysis.planner.memory import memory_per_pipeline_rank
from bubblescope.analysis.planner.request import plan_document
from bubblescope.analysis.planner.specs import GPUS, PlanInputError
from bubblescope.analysis.planner.step_time import DEFAULT_EFFICIENCIES, layer_cost, output_layer_cost
from tests.support import LiveServer, assert_names

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


def test_fp8_runs_the_four_linear_gemms_at_the_fp8_peak_and_nothing_else() -> None:
    """Llama 3 70B, tp 8 on 8 H100s, seq 8192: every linear GEMM is compute-bound at both precisions, so FP8 saves,
    per layer and pass, its FLOPs F = 2·tokens·h·((h + 2k) + h + 2f + f)/t times 1/(bf16·gemm) − 1/(fp8·gemm); a
    layer runs three passes (forward, two backward), 80 layers, 2 micro-batches."""
    model = model_from("llama-3-70b")
    cluster = make_cluster("H100-SXM", 8)
    plans = {
        p: evaluate(model, cluster, ParallelConfig(tp=8, mbs=1, sequence_parallel=True, precision=p), 2)
        for p in ("bf16", "fp8")
    }
    h, k, f, t, tokens = model.hidden, model.kv_dim, model.ffn_hidden, 8, model.seq
    flops = 2 * tokens * h * ((h + 2 * k) + h + 2 * f + f) / t
    gemm = DEFAULT_EFFICIENCIES.gemm
    saved_per_pass = flops * (1 / (989e12 * gemm) - 1 / (1979e12 * gemm))
    expected = 2 * 80 * 3 * saved_per_pass
    bf16, fp8 = (plans[p].step for p in ("bf16", "fp8"))
    assert bf16 is not None and fp8 is not None
    assert bf16.compute - fp8.compute == pytest.approx(expected, rel=1e-9)
    assert bf16.tp_comm == fp8.tp_comm and bf16.optimizer == fp8.optimizer  # only the GEMMs change
    assert plans["fp8"].memory == plans["bf16"].memory  # weights and optimizer state stay as they were


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
    layer, output = (
        cost(model, cluster, plan.config, DEFAULT_EFFICIENCIES) for cost in (layer_cost, output_layer_cost)
    )
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
        ({"tp": 8, "pp": 2, "vpp": 2, "layers_per_stage": [16, 16]}, "config.layers_per_stage", "vpp"),
        ({"first_stage_layers": 4}, "config.pp", "need a pipeline"),
        ({"tp": 8, "pp": 4, "first_stage_layers": 3}, "config.first_stage_layers", "do not split evenly"),
        ({"pp": 2, "first_stage_layers": 3, "layers_per_stage": [3, 29]}, "config.layers_per_stage", "not both"),
        ({"tp": 8, "pp": 4, "vpp": 3}, "config.vpp", "layers_per_stage"),
    ],
)
def test_each_new_knob_out_of_range_is_refused_by_name(config: dict[str, Any], field: str, words: str) -> None:
    body = {"model": "llama-3-8b", "cluster": "h100-sxm-x64", "global_batch": 64, "config": config}
    with pytest.raises(PlanInputError) as refused:
        plan_document(body)
    assert refused.value.field == field and words in refused.value.message, (refused.value.field, refused.value)


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
