"""Heads whose width is not hidden/heads (Hugging Face's ``head_dim``, Megatron's ``--kv-channels``): Qwen3's 32 heads of
128 over a hidden size of 2,048. The presets against the parameter counts Qwen published, the linear GEMMs, the stored
activations and the model FLOPs against hand counts, and the request field on a real server."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bubblescope.analysis.planner import ParallelConfig, model_from
from bubblescope.analysis.planner.evaluate import model_flops_per_step
from bubblescope.analysis.planner.memory import activation_bytes_per_layer
from bubblescope.analysis.planner.request import plan_document
from bubblescope.analysis.planner.specs import PlanInputError
from bubblescope.analysis.planner.step_time import linear_shapes
from tests.support import LiveServer, assert_names

QWEN3_30B = model_from("qwen3-30b-a3b")


@pytest.mark.parametrize(
    ("preset", "total_b", "active_b"),
    [("qwen3-30b-a3b", 30.5, 3.3), ("qwen3-235b-a22b", 235.0, 22.0)],  # Qwen3 Technical Report, Table 2
)
def test_the_qwen3_presets_hold_the_parameters_qwen_published(preset: str, total_b: float, active_b: float) -> None:
    """Total within 0.5%, active within 2% (the report rounds 3.35 B down to 3.3 B); priced with a head as wide as
    hidden/heads, the same models would miss the active count by more than 5%."""
    model = model_from(preset)
    assert model.head_dim == 128 and model.q_dim == model.heads * 128 != model.hidden
    assert model.params == pytest.approx(total_b * 1e9, rel=0.005)
    assert model.active_params == pytest.approx(active_b * 1e9, rel=0.02)
    narrow = replace(model, head_width=0)
    assert abs(narrow.active_params - active_b * 1e9) > 0.05 * active_b * 1e9


def test_linear_gemms_activations_and_flops_take_the_query_width() -> None:
    """Qwen3 30B-A3B at tp 2, one micro-batch of 4,096 tokens: QKV is 2,048 → (4,096 + 2·512)/2 = 2,560 wide, the
    projection (4,096/2 = 2,048) → 2,048; the stored activations grow by 4·(q − h) + 4·(k − k₀) bytes a token over a
    copy with heads of hidden/heads (q = h = 2,048, k₀ = 256), split by tp with sequence parallelism; the model FLOPs'
    attention term is 12·L·q·s a token."""
    cfg = ParallelConfig(tp=2, mbs=1, sequence_parallel=True)
    tokens = QWEN3_30B.seq
    qkv, projection, *_ = linear_shapes(QWEN3_30B, cfg, tokens)
    assert qkv[:3] == (tokens, 2048, 2560) and projection[:3] == (tokens, 2048, 2048)
    narrow = replace(QWEN3_30B, head_width=0)
    assert (narrow.q_dim, narrow.kv_dim) == (2048, 256)
    wide_bytes = activation_bytes_per_layer(QWEN3_30B, 1, 2, True, "none", True)
    narrow_bytes = activation_bytes_per_layer(narrow, 1, 2, True, "none", True)
    assert wide_bytes - narrow_bytes == pytest.approx(tokens * (4 * 2048 + 4 * 256) / 2)
    flops = model_flops_per_step(QWEN3_30B, 1) - model_flops_per_step(narrow, 1)
    active = QWEN3_30B.active_params - narrow.active_params
    assert flops == pytest.approx(tokens * (6 * active + 12 * QWEN3_30B.layers * (4096 - 2048) * tokens))


def test_a_request_gives_head_dim_and_is_refused_by_name_without_it() -> None:
    body = {"cluster": {"gpu": "H100-SXM", "gpus": 16}, "global_batch": 64, "config": {"ep": 16, "zero": 1}}
    fields = {"layers": 48, "hidden": 2048, "heads": 32, "kv_heads": 4, "seq": 4096, "vocab": 151936}
    moe = {"experts": 128, "top_k": 8, "moe_ffn_hidden": 768, "gated_mlp": True, "tied_embeddings": False}
    given = plan_document(body | {"model": fields | moe | {"head_dim": 128, "learned_positions": False}})
    preset = plan_document(body | {"model": "qwen3-30b-a3b"})
    assert given.as_dict()["plans"][0]["step_time_s"] == preset.as_dict()["plans"][0]["step_time_s"]
    assert given.as_dict()["model"]["head_dim"] == 128
    with pytest.raises(PlanInputError) as refused:
        model_from(fields | {"hidden": 2000})
    assert refused.value.field == "model.heads" and "head_dim" in str(refused.value)
    assert model_from(fields | {"hidden": 2000, "head_dim": 128}).q_dim == 4096
    with pytest.raises(PlanInputError) as zero:
        model_from(fields | {"head_dim": 0})
    assert zero.value.field == "model.head_dim"


def test_the_api_takes_head_dim_and_names_it_when_bad(server: LiveServer) -> None:
    body = {"cluster": "h100-sxm-x16", "global_batch": 64, "config": {"ep": 16, "zero": 1}}
    with server.client() as client:
        good = client.post("/api/v1/plan", json=body | {"model": {"preset": "qwen3-30b-a3b", "head_dim": 64}})
        assert good.status_code == 200, good.text
        assert good.json()["model"]["head_dim"] == 64
        assert good.json()["model"]["params"] < model_from("qwen3-30b-a3b").params
        bad = client.post("/api/v1/plan", json=body | {"model": {"preset": "qwen3-30b-a3b", "head_dim": 0}})
        assert_names(bad, 422, ["body", "model", "fields", "head_dim"], "greater than or equal to 1")
