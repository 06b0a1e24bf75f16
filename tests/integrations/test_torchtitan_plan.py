"""What a torchtitan run declares to the planner (``bubblescope.integrations.torchtitan_plan``), read from torchtitan
0.3.0's own configs as its command line builds them, and taken by the analysis as ``plan`` takes it
(``memory_fixes.declared_plan``). The run through the service is in test_torchtitan.py."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest

from bubblescope.analysis.memory_fixes import declared_plan, megatron_layout, memory_suggestions, torchtitan_layout
from bubblescope.analysis.planner import MODEL_PRESETS, evaluate, model_from
from bubblescope.analysis.planner.specs import ParallelConfig
from bubblescope.analysis.schedules import lookup
from bubblescope.integrations.torchtitan_plan import planner_declaration
from tests.integrations.test_torchtitan import assert_torchtitan_takes, require_torchtitan, torchtitan_parses

H100 = "NVIDIA H100 80GB HBM3"  # torch.cuda.get_device_name on an H100 SXM


def declared(module: str, flavor: str, *flags: str, gpus: int, **degrees: int) -> dict[str, Any]:
    """The declaration for torchtitan's ``--module``/``--config`` and flags on ``gpus`` ranks of ``degrees``."""
    require_torchtitan()
    from torchtitan.config import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims

    config = ConfigManager().parse_args(
        ["--module", module, "--config", flavor, "--training.disable_cuda_graphs", *flags]
    )
    sizes = {"dp_replicate": 1, "dp_shard": -1, "cp": 1, "tp": 1, "pp": 1, "ep": 1} | degrees
    dims = ParallelDims(**sizes, world_size=gpus)
    return planner_declaration(SimpleNamespace(config=config, parallel_dims=dims))


def test_llama3_8b_with_tp_and_cp_is_the_planners_llama_3_8b_laid_out_as_it_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BUBBLESCOPE_GPU", H100)
    tp_cp = ("--parallelism.tensor_parallel_degree=2", "--parallelism.context_parallel_degree=2")
    run = declared("llama3", "llama3_8b", *tp_cp, "--training.seq_len=32768", gpus=64, tp=2, cp=2)
    model = model_from(run["model"])
    # the architecture torchtitan builds is the published Llama 3 8B the planner's preset holds
    assert dataclasses.replace(model, name="llama-3-8b", seq=8192) == MODEL_PRESETS["llama-3-8b"]
    assert model.seq == 32768
    assert run["cluster"] == {"gpu": H100, "gpus": 64, "gpus_per_node": 8}
    assert run["global_batch"] == 16  # llama3_8b's local batch 1 on dp_shard 64 / (tp 2 · cp 2)
    plan = declared_plan(run)
    assert plan is not None and plan.cluster.gpu.name == "H100-SXM"
    cfg = plan.config
    assert (cfg.tp, cfg.pp, cfg.cp, cfg.mbs, cfg.zero) == (2, 1, 2, 1, 3)
    assert (cfg.cp_comm, cfg.recompute, cfg.attention_kernel, cfg.precision) == ("allgather", "op", "flash2", "bf16")
    assert cfg.sequence_parallel and not cfg.compile and cfg.grad_reduce == "fp32" and not cfg.kv_repeated
    assert cfg.projections == "fused_qkv"  # torchtitan 0.3's Llama 3: one wqkv, w1 and w3 apart
    priced = evaluate(plan.model, plan.cluster, cfg, plan.global_batch)
    assert priced.feasible and priced.step is not None and priced.step.total > 0


def test_a_pipeline_declares_torchtitans_own_split_and_full_recompute(monkeypatch: pytest.MonkeyPatch) -> None:
    """70B over 8 stages: torchtitan's split weighs the embedding and the output layer as a layer each
    (``pipeline_parallel_first/last_stage_less_layers`` 1): 82 over 8, the last stage one block short. Async TP is
    the planner's TP overlap; a global batch of 128 over dp 4 at a local batch of 16 is two accumulation steps, each
    its own pipeline flush, so the planner prices one (64)."""
    monkeypatch.setenv("BUBBLESCOPE_GPU", "H200")
    pp = ("--parallelism.pipeline_parallel_degree=8", "--parallelism.pipeline_parallel_schedule=1F1B")
    batch = ("--training.local_batch_size=16", "--training.global_batch_size=128")
    compiled = ("--compile.enable", "--compile.enable_async_tensor_parallel")
    flags = (*pp, "--parallelism.tensor_parallel_degree=8", *batch, *compiled)
    run = declared("llama3", "llama3_70b", *flags, "activation-checkpoint:full", gpus=256, tp=8, pp=8)
    assert run["layers_per_stage"] == [10, 11, 10, 10, 10, 10, 10, 9]
    assert (run["pp"], run["microbatch_size"], run["recompute"], run["compile"]) == (8, 1, "full", True)
    assert run["tp_comm_overlap"] and run["global_batch"] == 16 * 4  # dp_shard 256 / (tp 8 · pp 8)
    plan = declared_plan(run)
    assert plan is not None and plan.config.layers_per_stage == (10, 11, 10, 10, 10, 10, 10, 9)
    assert plan.config.zero == 3 and plan.config.tp_comm_overlap


def test_sliding_window_attention_declares_no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """gpt-oss 20B: a 128-token window on every other block, which the planner would price as full attention."""
    monkeypatch.setenv("BUBBLESCOPE_GPU", "H100-SXM")
    run = declared("gpt_oss", "gpt_oss_20b", gpus=8)
    assert "model" not in run and run["zero"] == 3


def test_memory_fixes_for_a_torchtitan_run_are_said_in_flags_torchtitan_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Llama 3 8B on 8 H100s without activation checkpointing, local batch 4: at 4k tokens with FSDP the planner's
    single fixes fit (per-op or full recompute, CP 2); at 16k tokens with replicas (no sharding) none does, and it
    re-plans the layout (sharding, CP, the micro-batch accumulated to the same global batch). Every fix is said in
    flags torchtitan 0.3.0's own parser takes, with the effect it names."""
    monkeypatch.setenv("BUBBLESCOPE_GPU", H100)
    local = ("--training.local_batch_size=4", "activation-checkpoint:none")  # a choice: after the flags
    sharded = declared("llama3", "llama3_8b", "--training.seq_len=4096", *local, gpus=8)
    replicas = ("--parallelism.data_parallel_replicate_degree=8", "--parallelism.data_parallel_shard_degree=1")
    replicated = declared(
        "llama3", "llama3_8b", *replicas, "--training.seq_len=16384", *local, gpus=8, dp_replicate=8, dp_shard=1
    )
    assert (sharded["zero"], replicated["zero"], sharded["recompute"]) == (3, 0, "none")
    found = memory_suggestions(sharded, 10e9) + memory_suggestions(replicated, 10e9)
    titles = [suggestion.title for suggestion in found]
    assert {"Recompute activations (op)", "Recompute activations (full)"} <= set(titles), titles
    assert any(title.startswith("Re-plan the layout") for title in titles), titles
    for suggestion in found:
        assert suggestion.torchtitan, suggestion.title
        assert_torchtitan_takes(suggestion.torchtitan)
    replanned = next(s.torchtitan for s in found if s.title.startswith("Re-plan"))
    assert replanned["training.global_batch_size"] == replicated["global_batch"]  # the batch kept, accumulated


def test_torchtitans_default_interleaved_split_is_priced_per_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """debugmodel's own schedule, Interleaved1F1B: 2 stages a rank, 6 blocks split 1/2/2/1 (the embedding and the
    output layer weigh a block each); with what the collector adds from the schedule (``collector.describe``), the
    planner holds 3 blocks on each rank in 2 chunks."""
    monkeypatch.setenv("BUBBLESCOPE_GPU", "H100-SXM")
    run = declared("llama3", "llama3_debugmodel", "--parallelism.pipeline_parallel_degree=2", gpus=2, pp=2)
    assert run["layers_per_stage"] == [1, 2, 2, 1]
    plan = declared_plan(run | {"schedule": "ScheduleInterleaved1F1B", "num_stages": 4, "virtual_stages": 2})
    assert plan is not None and (plan.config.layers_per_stage, plan.config.vpp) == ((3, 3), 2)


def test_float8_linears_declare_fp8(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchtitan's Float8 converter (emulated here, as its CPU tests run it) swaps the blocks' linears."""
    monkeypatch.setenv("BUBBLESCOPE_GPU", "H100-SXM")
    require_torchtitan()
    from torchtitan.components.quantization.float8 import Float8LinearConverter
    from torchtitan.config import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.models.llama3 import model_registry

    config = ConfigManager().parse_args(["--module", "llama3", "--config", "llama3_8b"])
    plain = planner_declaration(SimpleNamespace(config=config, parallel_dims=ParallelDims(1, -1, 1, 1, 1, 1, 8)))
    config.model_spec = model_registry("8B", converters=[Float8LinearConverter.Config(emulate=True)])
    fp8 = planner_declaration(SimpleNamespace(config=config, parallel_dims=ParallelDims(1, -1, 1, 1, 1, 1, 8)))
    assert (plain["precision"], fp8["precision"]) == ("bf16", "fp8")
    assert fp8["model"] == plain["model"]
    plan = declared_plan(fp8)
    assert plan is not None and plan.config.precision == "fp8" and not plan.config.fp8_all_gather


def test_qwen3_30b_a3b_is_the_planners_mixture_of_experts_with_torchtitans_expert_layout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """128 experts of 768, 8 a token, in each of 48 blocks: the planner's Qwen3 30B-A3B preset (its dense
    ``ffn_hidden`` unused where no block is dense); torchtitan's experts are not tensor-parallel (etp 1) and travel
    all-to-all."""
    monkeypatch.setenv("BUBBLESCOPE_GPU", "H100-SXM")
    ep = ("--parallelism.expert_parallel_degree=8", "--parallelism.tensor_parallel_degree=2")
    run = declared("qwen3", "qwen3_30b_a3b", *ep, gpus=16, ep=8, tp=2)
    model = model_from(run["model"])
    preset = MODEL_PRESETS["qwen3-30b-a3b"]
    assert dataclasses.replace(model, name=preset.name, seq=preset.seq, ffn_hidden=preset.ffn_hidden) == preset
    assert (run["ep"], run["etp"], run["dispatcher"]) == (8, 1, "alltoall")
    plan = declared_plan(run)
    assert plan is not None and (plan.config.ep, plan.config.expert_tp, plan.config.tp) == (8, 1, 2)
    priced = evaluate(plan.model, plan.cluster, plan.config, plan.global_batch)
    assert priced.feasible and priced.step is not None and priced.step.ep_comm > 0


def test_blocks_that_differ_declare_the_layout_but_no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """DeepSeek V3: dense first blocks, then experts, and latent attention: not one shape the planner takes, so the
    run is not priced rather than priced as some other model."""
    monkeypatch.setenv("BUBBLESCOPE_GPU", "H100-SXM")
    run = declared("deepseek_v3", "deepseek_v3_16b_hybridep", gpus=8)
    assert "model" not in run and run["tp"] == 1 and run["zero"] == 3
    assert run["dispatcher"] == "hybridep"  # its experts' dispatcher, read past the dense first blocks
    assert declared_plan(run) is None


def test_a_head_width_apart_from_hidden_over_heads_is_declared(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BUBBLESCOPE_GPU", "H100-SXM")
    run = declared("qwen3", "qwen3_0_6b", gpus=8)
    model = run["model"]
    assert model["head_dim"] * model["heads"] != model["hidden"], model  # Qwen3 0.6B: 16 heads of 128 on 1,024
    assert model_from(model).head_width == model["head_dim"]


def test_the_projections_are_declared_as_the_blocks_run_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchtitan runs a gated MLP's w1 and w3 as two GEMMs, and Q, K and V as one (``FusedQKVLinear``, its flavors'
    default since ``fuse_qkv``) or three (``QKVLinear``): the planner prices the layer's GEMMs and the backward's
    gradient sums as laid out."""
    monkeypatch.setenv("BUBBLESCOPE_GPU", "H100-SXM")
    fused = declared("qwen3", "qwen3_debugmodel", gpus=8)
    apart = declared("qwen3", "qwen3_debugmodel_non_fused_qkv", gpus=8)
    assert (fused["projections"], apart["projections"]) == ("fused_qkv", "separate")
    planned = declared_plan(apart)
    assert planned is not None and planned.config.projections == "separate"


def test_without_a_gpu_no_cluster_is_declared_and_nothing_is_priced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BUBBLESCOPE_GPU", raising=False)  # this machine's torch has no CUDA
    run = declared("llama3", "llama3_debugmodel", gpus=2)
    assert "cluster" not in run and run["model"]["layers"] == 6
    assert declared_plan(run) is None


def test_an_unreadable_config_declares_nothing_and_does_not_raise(caplog: pytest.LogCaptureFixture) -> None:
    assert planner_declaration(SimpleNamespace(config=object(), parallel_dims=None)) == {}
    assert "not declared to the planner" in caplog.text


def torchtitans_stages(snippet: dict[str, Any], pp: int) -> list[int]:
    """Each stage's blocks as torchtitan 0.3.0 splits Llama 3 8B (32 blocks) over ``pp`` ranks from a snippet: its
    own parser, then its own stage count and splitter (``torchtitan.distributed.pipeline_parallel``)."""
    from torchtitan.distributed import pipeline_parallel

    config = torchtitan_parses(snippet, "llama3_8b")
    metadata = pipeline_parallel._get_pipeline_metadata(
        SimpleNamespace(pp=pp), config.parallelism, config.model_spec.model
    )
    stages, blocks, before, after = metadata
    parts = pipeline_parallel._generate_llm_fqn_per_model_part(stages, blocks, before, after)
    return [sum(name.startswith("layers.") for name in part) for part in parts]


@pytest.mark.parametrize(
    ("schedule", "pp", "vpp", "planned"),
    [("interleaved1f1b", 4, 2, [4] * 8), ("1f1b", 3, 1, [11, 11, 10]), ("1f1b", 4, 1, [8] * 4)],
)
def test_a_replanned_layout_is_the_layout_torchtitan_builds_from_its_flags(
    schedule: str, pp: int, vpp: int, planned: list[int]
) -> None:
    """A re-planned layout (``memory_fixes.torchtitan_layout``, the memory fix that re-plans a run) given to
    torchtitan's own parser and stage splitter: its stages hold the planner's blocks (the embedding and the output
    counted as none, as the planner splits), its schedule, recompute, sharding and async TP are the plan's; Megatron's
    flags say the same layout."""
    require_torchtitan()
    model = MODEL_PRESETS["llama-3-8b"]
    config = ParallelConfig(
        tp=2,
        pp=pp,
        dp=2,
        vpp=vpp,
        schedule=lookup(schedule),
        zero=1,
        recompute="full",
        sequence_parallel=True,
        tp_comm_overlap=True,
    )
    snippet = torchtitan_layout(config, model, 64)
    assert_torchtitan_takes(snippet)
    assert torchtitans_stages(snippet, pp) == planned
    assert [*config.stage_layers(model.layers)] == [sum(planned[r::pp]) for r in range(pp)]  # each rank's chunks
    parsed = torchtitan_parses(snippet, "llama3_8b")
    assert parsed.parallelism.pipeline_parallel_schedule == config.schedule.torchtitan_name
    assert type(parsed.activation_checkpoint).__qualname__ == "FullAC.Config"
    assert parsed.parallelism.fsdp_reshard_after_forward == "never"  # ZeRO 1: gathered once, kept to the backward
    assert parsed.compile.enable_async_tensor_parallel and parsed.parallelism.tensor_parallel_degree == 2
    flags = megatron_layout(config)
    assert {"--use-distributed-optimizer", "--recompute-granularity full", "--sequence-parallel"} <= set(flags)
    assert "--tp-comm-overlap" in flags and f"--pipeline-model-parallel-size {pp}" in flags
    assert ("--num-virtual-stages-per-pipeline-rank 2" in flags) == (vpp == 2), flags
