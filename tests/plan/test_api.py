"""POST /api/v1/plan on a real server (SQLite and PostgreSQL): the same answers as the planner,
ranked searches, and 422s that name the field."""

from __future__ import annotations

from typing import Any

import pytest

from bubblescope.analysis.planner import MODEL_PRESETS, ParallelConfig, cluster_preset, evaluate
from bubblescope.analysis.schedules import lookup
from tests.support import LiveServer, assert_names

GIB = 2**30


def test_evaluate_one_configuration(server: LiveServer) -> None:
    body = {
        "model": "gpt-175b",
        "cluster": "a100-80gb-x64",
        "global_batch": 64,
        "config": {"tp": 8, "pp": 8, "vpp": 3, "recompute": "selective", "flash_attention": False},  # as measured
    }
    with server.client() as client:
        response = client.post("/api/v1/plan", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["mode"] == "evaluate" and answer["model"]["params"] == MODEL_PRESETS["gpt-175b"].params
    (plan,) = answer["plans"]
    assert plan["config"] == {
        "tp": 8,
        "pp": 8,
        "dp": 1,
        "vpp": 3,
        "mbs": 1,
        "schedule": "interleaved1f1b",
        "zero": 0,
        "recompute": "selective",
        "sequence_parallel": True,
        "flash_attention": False,
        "precision": "bf16",
        "layers_per_stage": None,
        "tp_comm_overlap": False,
        "cp": 1,
        "cp_comm": "p2p",
        "ep": 1,
        "etp": None,  # as tp
        "dispatcher": "alltoall",
        "capacity_factor": 1.0,
        "grad_reduce": "fp32",
        "compile": True,
        "fp8_all_gather": False,
        "attention_kernel": "cudnn",
        "kv_repeated": False,
        "overlap_param_gather": False,
        "projections": "fused",
    }
    assert answer["assumed"] == [  # what the request left to the defaults, in words
        "precision: bf16 (fp8 runs the linear GEMMs in FP8)",
        "sequence_parallel: on when tp > 1",
        "grad_reduce: fp32 (gradients reduced in fp32, as Megatron-LM and torchtitan do by default)",
        "attention_kernel: cudnn (cuDNN's fused attention, Transformer Engine's; off Hopper flash2, FlashAttention-2, is"
        " priced alike forward, its backward 2.7× the forward where cuDNN's is 3.1×)",  # an A100: not Hopper's words
        "overlap_param_gather: false (ZeRO-1/2 gather the updated weights after the optimizer's step, in the open, as"
        " Megatron-LM and DeepSpeed do by default; true hides it under the next forward)",
        "compile: true (element-wise kernels fused: torch.compile, Megatron's fused kernels)",
        "tp_comm_overlap: false (tensor-parallel collectives in the open between the GEMMs)",
        "projections: fused (Q, K and V in one GEMM and a gated MLP's w1 and w3 in one, as Megatron-LM and Transformer"
        " Engine run them; separate: torchtitan's Llama before fuse_qkv, Hugging Face's)",
        "constants: the defaults, chosen on 18 published A100-80GB runs",  # and which constants priced it
    ]
    p, v, m = 8, 3, 64
    assert plan["bubble_fraction"] == pytest.approx(((p - 1) / v) / (m + (p - 1) / v))
    # the service answers what the pure planner answers for the same configuration
    local = evaluate(
        MODEL_PRESETS["gpt-175b"],
        cluster_preset("a100-80gb-x64"),
        ParallelConfig(
            tp=8,
            pp=8,
            vpp=3,
            schedule=lookup("interleaved1f1b"),
            recompute="selective",
            sequence_parallel=True,
            flash_attention=False,
        ),
        64,
    )
    assert plan["step_time_s"] == pytest.approx(local.step.total)  # type: ignore[union-attr]
    assert plan["memory_gib_per_gpu"] == pytest.approx(local.memory.total / GIB)  # type: ignore[union-attr]
    assert plan["fits"] is True
    # Korthikanti et al. measured 13.75 s for this run
    assert plan["step_time_s"] == pytest.approx(13.75, rel=0.10)


def test_search_is_ranked_and_feasible(server: LiveServer) -> None:
    body = {
        "model": {"preset": "llama-3-8b", "seq": 4096},
        "cluster": {"gpu": "H100-SXM", "gpus": 16},
        "global_batch": 64,
        "fixed": {"flash_attention": True},
        "top": 5,
    }
    with server.client() as client:
        response = client.post("/api/v1/plan", json=body)
    assert response.status_code == 200, response.text
    plans = response.json()["plans"]
    assert len(plans) == 5
    assert [p["step_time_s"] for p in plans] == sorted(p["step_time_s"] for p in plans)
    for plan in plans:
        c = plan["config"]
        assert plan["fits"] and c["flash_attention"] and c["tp"] * c["pp"] * c["dp"] == 16
        assert 64 % (c["dp"] * c["mbs"]) == 0


def test_an_empty_search_answers_why(server: LiveServer) -> None:
    """A search that finds nothing is a 200 with no plans and ``why_none``: here the global batch, which no layout of
    the search splits (3 sequences; 405B on 1,024 GPUs keeps at least 2 replicas)."""
    body = {"model": "llama-3.1-405b", "cluster": "h100-sxm-x1024", "global_batch": 3}
    with server.client() as client:
        empty = client.post("/api/v1/plan", json=body)
        found = client.post("/api/v1/plan", json={**body, "global_batch": 4, "top": 1})
    assert empty.status_code == 200, empty.text
    assert empty.json()["plans"] == [] and "the fewest replicas, 2, are 1024 GPUs" in empty.json()["why_none"]
    assert found.status_code == 200 and len(found.json()["plans"]) == 1 and found.json()["why_none"] is None


BAD: list[tuple[str, dict[str, Any], list[Any], str]] = [
    (
        "unknown model",
        {"model": "gpt-9z", "cluster": "a100-80gb-x8", "global_batch": 4},
        ["body", "model"],
        "unknown model",
    ),
    (
        "model field",
        {
            "model": {"layers": 0, "hidden": 64, "heads": 4, "seq": 8, "vocab": 10},
            "cluster": "a100-80gb-x8",
            "global_batch": 4,
        },
        ["body", "model"],
        "greater than or equal to 1",
    ),
    (
        "missing model field",
        {"model": {"hidden": 64, "heads": 4, "seq": 8, "vocab": 10}, "cluster": "a100-80gb-x8", "global_batch": 4},
        ["body", "model", "fields", "layers"],
        "field required",
    ),
    (
        "unknown gpu",
        {"model": "gpt-22b", "cluster": {"gpu": "V100", "gpus": 8}, "global_batch": 4},
        ["body", "cluster", "fields", "gpu"],
        "unknown GPU",
    ),
    (
        "batch zero",
        {"model": "gpt-22b", "cluster": "a100-80gb-x8", "global_batch": 0},
        ["body", "global_batch"],
        "greater than or equal to 1",
    ),
    (
        "batch string",
        {"model": "gpt-22b", "cluster": "a100-80gb-x8", "global_batch": "4"},
        ["body", "global_batch"],
        "valid integer",
    ),
    (
        "tp not dividing heads",
        {"model": "gpt-22b", "cluster": "a100-80gb-x8", "global_batch": 4, "config": {"tp": 3}},
        ["body", "config", "tp"],
        "attention heads",
    ),
    (
        "recompute",
        {"model": "gpt-22b", "cluster": "a100-80gb-x8", "global_batch": 4, "config": {"recompute": "most"}},
        ["body", "config", "recompute"],
        "Input should be",
    ),
    (
        "extra field",
        {"model": "gpt-22b", "cluster": "a100-80gb-x8", "global_batch": 4, "gpus": 8},
        ["body", "gpus"],
        "Extra inputs",
    ),
    (
        "experts split finer than tp",
        {"model": "qwen3-30b-a3b", "cluster": "h100-sxm-x16", "global_batch": 16, "config": {"tp": 2, "etp": 4}},
        ["body", "config", "etp"],
        "above tp=2 is not modelled",
    ),
    (
        "attention kernel",
        {"model": "gpt-22b", "cluster": "h100-sxm-x8", "global_batch": 4, "config": {"attention_kernel": "fa3"}},
        ["body", "config", "attention_kernel"],
        "Input should be 'cudnn' or 'flash2'",
    ),
    (
        "repeated keys and values",
        {"model": "gpt-22b", "cluster": "h100-sxm-x8", "global_batch": 4, "config": {"kv_repeated": "yes"}},
        ["body", "config", "kv_repeated"],
        "Input should be a valid boolean",
    ),
    (
        "weights gathered under the forward without the distributed optimizer",
        {"model": "gpt-22b", "cluster": "h100-sxm-x8", "global_batch": 8, "config": {"overlap_param_gather": True}},
        ["body", "config", "overlap_param_gather"],
        "needs zero 1 or 2",
    ),
    (
        "a fixed field no layout runs with",
        {"model": "llama-3-8b", "cluster": "a100-80gb-x8", "global_batch": 8, "fixed": {"precision": "fp8"}},
        ["body", "fixed", "precision"],
        "has no FP8 tensor cores",
    ),
    (
        "virtual stages without a pipeline",
        {"model": "gpt-22b", "cluster": "h100-sxm-x8", "global_batch": 8, "config": {"vpp": 2}},
        ["body", "config", "vpp"],
        "need a pipeline",
    ),
    (
        # 24 stages of Llama 3 8B's 32 layers: no two-ended split (the first and last would hold none), so stages of 1
        # and 2 layers, and a stage of 1 layer holds no two virtual stages
        "an interleaved schedule held where no virtual stage count splits the layers",
        {
            "model": "llama-3-8b",
            "cluster": "h100-sxm-x24",
            "global_batch": 48,
            "fixed": {"pp": 24, "schedule": "interleaved1f1b"},
        },
        ["body", "fixed", "schedule"],
        "32 layers over 24 stages leave a stage 1, fewer than its vpp=2 virtual stages",
    ),
    (
        "a split given as first-stage layers that holds too few",
        {
            "model": "llama-3-8b",
            "cluster": "h100-sxm-x8",
            "global_batch": 8,
            "config": {"pp": 2, "vpp": 2, "first_stage_layers": 1},
        },
        ["body", "config", "first_stage_layers"],
        "every stage needs at least vpp=2 layers",
    ),
    (
        "a held dp the global batch does not split over",
        {"model": "llama-3-8b", "cluster": "h100-sxm-x4096", "global_batch": 2048, "fixed": {"pp": 1, "dp": 4096}},
        ["body", "fixed", "dp"],
        "global batch 2048 is not divisible by dp = 4096",
    ),
    (
        "a held dp the global batch does not split over, a micro-batch held too",
        {"model": "llama-3-8b", "cluster": "h100-sxm-x8", "global_batch": 12, "fixed": {"dp": 8, "mbs": 2}},
        ["body", "fixed", "dp"],
        "global batch 12 is not divisible by dp·mbs = 8·2",
    ),
    (
        "first and last stage layers given, the last too few",
        {
            "model": "llama-3-8b",
            "cluster": "h100-sxm-x24",
            "global_batch": 24,
            "config": {"pp": 3, "vpp": 2, "first_stage_layers": 15, "last_stage_layers": 1},
        },
        ["body", "config", "last_stage_layers"],
        "every stage needs at least vpp=2 layers",
    ),
    (
        "a GPU with no memory past the reserve",
        {
            "model": "llama-3-8b",
            "cluster": {
                "gpu": {"peak_tflops": 900, "memory_gib": 4, "hbm_gbps": 3000, "nvlink_gbps": 450, "network_gbps": 50},
                "gpus": 8,
            },
            "global_batch": 8,
        },
        ["body", "cluster", "fields", "gpu", "fields", "memory_gib"],
        "more than the 4 GiB kept free on every GPU",
    ),
    (
        "experts without top_k",
        {"model": {"preset": "llama-3-8b", "experts": 8}, "cluster": "h100-sxm-x8", "global_batch": 8},
        ["body", "model", "fields", "top_k"],
        "a mixture of experts needs top_k",
    ),
    (
        "config and fixed",
        {"model": "gpt-22b", "cluster": "a100-80gb-x8", "global_batch": 4, "config": {"tp": 8}, "fixed": {"tp": 8}},
        ["body", "fixed"],
        "not both",
    ),
]


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_requests_name_the_field(server: LiveServer, case: tuple[str, dict[str, Any], list[Any], str]) -> None:
    _name, body, loc, words = case
    with server.client() as client:
        assert_names(client.post("/api/v1/plan", json=body), 422, loc, words)


def test_a_key_given_twice_is_refused_naming_it(server: LiveServer) -> None:
    """JSON lets an object name a key twice and keeps the last; a plan request that does (``"tp": 2, "tp": 4``) is
    refused naming the key and the objects leading to it, not answered for tp 4."""
    body = '{"model": "gpt-22b", "cluster": "a100-80gb-x8", "global_batch": 4, "config": {"tp": 2, "tp": 4}}'
    with server.client() as client:
        answer = client.post("/api/v1/plan", content=body, headers={"content-type": "application/json"})
        assert_names(answer, 422, ["body", "config", "tp"], "given twice")
        once = body.replace('"tp": 2, ', "")
        assert (
            client.post("/api/v1/plan", content=once, headers={"content-type": "application/json"}).status_code == 200
        )
        # inside a model object: the path to the object is said, not the key alone
        nested = (
            '{"model": {"preset": "llama-3-8b", "seq": 4096, "seq": 8192}, "cluster": "h100-sxm-x8", "global_batch": 8}'
        )
        answer = client.post("/api/v1/plan", content=nested, headers={"content-type": "application/json"})
        assert_names(answer, 422, ["body", "model", "seq"], "given twice")
        listed = '{"model": "llama-3-8b", "cluster": "h100-sxm-x8", "global_batch": 8, "config": {"tp": 2}, "x": [{}, {"a": 1, "a": 2}]}'
        answer = client.post("/api/v1/plan", content=listed, headers={"content-type": "application/json"})
        assert_names(answer, 422, ["body", "x", 1, "a"], "given twice")  # a list's index as a number, as pydantic's


def test_a_model_cluster_or_gpu_given_as_fields_is_refused_for_its_fields_alone(server: LiveServer) -> None:
    """``model``, ``cluster`` and ``cluster.gpu`` are a name or an object of fields: a bad object is refused for its
    fields, under ``fields`` (``model.fields.head_dim``), with no second error saying it is not a string; neither a
    string nor an object (a number, a list) is one error naming the field and both forms."""
    body: dict[str, Any] = {"model": "llama-3-8b", "cluster": "h100-sxm-x8", "global_batch": 8}
    cases: list[tuple[dict[str, Any], list[Any], str]] = [
        ({"model": {"preset": "llama-3-8b", "head_dim": 0}}, ["body", "model", "fields", "head_dim"], "greater than"),
        ({"model": 5}, ["body", "model"], "model must be a name or an object of fields"),
        ({"cluster": {"gpu": "H100-SXM", "gpus": 0}}, ["body", "cluster", "fields", "gpus"], "greater than"),
        ({"cluster": ["h100-sxm-x8"]}, ["body", "cluster"], "cluster must be a name or an object of fields"),
        (
            {
                "cluster": {
                    "gpu": {
                        "peak_tflops": -1,
                        "memory_gib": 80,
                        "hbm_gbps": 3350,
                        "nvlink_gbps": 450,
                        "network_gbps": 50,
                    },
                    "gpus": 8,
                }
            },
            ["body", "cluster", "fields", "gpu", "fields", "peak_tflops"],
            "greater than 0",
        ),
        ({"cluster": {"gpu": 7, "gpus": 8}}, ["body", "cluster", "fields", "gpu"], "gpu must be a name or an object"),
        # the planner's own refusals of an object's fields sit under fields too, as the schema's do
        ({"model": {"layers": 32, "hidden": 4096}}, ["body", "model", "fields", "heads"], "also missing: seq, vocab"),
        ({"cluster": {"gpu": "H100-SXM", "gpus": 12}}, ["body", "cluster", "fields", "gpus"], "12 GPUs is not"),
        ({"cluster": {"gpu": "H100 NVL", "gpus": 8}}, ["body", "cluster", "fields", "gpu"], "unknown GPU"),
    ]
    with server.client() as client:
        for change, loc, words in cases:
            response = client.post("/api/v1/plan", json=body | change)
            assert_names(response, 422, loc, words)
            assert len(response.json()["detail"]) == 1, response.json()  # the other form's error is not listed
