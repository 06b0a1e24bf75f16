"""A re-planned layout said in torchtitan's and Megatron-LM's flags (``memory_fixes.torchtitan_layout``,
``megatron_layout``): each field the planner prices, in each framework's terms, with a line where a framework has
no flag. torchtitan's own parser and stage splitter take the result in tests/integrations/test_torchtitan_plan.py;
every Megatron flag is one Megatron defines (test_megatron_flags.py)."""

from __future__ import annotations

from bubblescope.analysis.memory_fixes import megatron_layout, torchtitan_layout, torchtitan_stages
from bubblescope.analysis.planner import MODEL_PRESETS
from bubblescope.analysis.planner.specs import ParallelConfig
from bubblescope.analysis.schedules import lookup
from bubblescope.analysis.suggestions import megatron_pipeline

LLAMA_8B = MODEL_PRESETS["llama-3-8b"]  # 32 blocks


def module_counts(snippet: dict[str, object]) -> list[int]:
    """Each stage's blocks in a torchtitan split given as module names."""
    parts = snippet["parallelism.module_fqns_per_model_part"]
    assert isinstance(parts, list)
    return [sum(name.startswith("layers.") for name in part) for part in parts]


def test_a_given_split_over_virtual_stages_puts_each_ranks_layers_on_its_own_stages() -> None:
    """(20, 12) over 2 ranks of 2 stages each: interleaved places stages 0, 2 on rank 0 and 1, 3 on rank 1; the V
    schedule 0, 3 and 1, 2. Each rank holds its given layers, halved over its stages."""
    uneven = {"pp": 2, "vpp": 2, "layers_per_stage": (20, 12)}
    interleaved = torchtitan_stages(ParallelConfig(schedule=lookup("interleaved1f1b"), **uneven), 32)
    assert module_counts(interleaved) == [10, 6, 10, 6]
    assert interleaved["parallelism.pipeline_parallel_schedule"] == "Interleaved1F1B"
    v_shaped = torchtitan_stages(ParallelConfig(schedule=lookup("zbv"), **uneven), 32)
    assert module_counts(v_shaped) == [10, 6, 6, 10]
    # one stage a rank, the split given: the module names; none given, torchtitan's even split
    assert module_counts(torchtitan_stages(ParallelConfig(pp=2, layers_per_stage=(20, 12)), 32)) == [20, 12]
    assert "parallelism.module_fqns_per_model_part" not in torchtitan_stages(ParallelConfig(pp=3), 32)
    assert torchtitan_stages(ParallelConfig(pp=1), 32) == {}


def test_sharding_past_the_distributed_optimizer_is_megatron_fsdp_and_a_weight_gather_overlap_brings_its_pair() -> None:
    flags = megatron_layout(ParallelConfig(tp=2, dp=4, zero=2, overlap_param_gather=True))
    assert flags[:3] == ["--tensor-model-parallel-size 2", "--pipeline-model-parallel-size 1", "--micro-batch-size 1"]
    assert {"--use-megatron-fsdp", "--data-parallel-sharding-strategy optim_grads"} <= set(flags)
    assert {"--overlap-grad-reduce", "--overlap-param-gather"} <= set(flags)  # Megatron refuses the one alone
    assert "--use-distributed-optimizer" in megatron_layout(ParallelConfig(dp=4, zero=1))
    assert not [f for f in megatron_layout(ParallelConfig(dp=4)) if "optimizer" in f or "fsdp" in f]


def test_switches_of_tensor_parallelism_are_said_only_with_it_and_a_schedule_megatron_lacks_is_a_line() -> None:
    on = {"sequence_parallel": True, "tp_comm_overlap": True}
    alone = megatron_layout(ParallelConfig(tp=1, **on))
    assert "--sequence-parallel" not in alone and "--tp-comm-overlap" not in alone
    assert {"--sequence-parallel", "--tp-comm-overlap"} <= set(megatron_layout(ParallelConfig(tp=4, **on)))
    eager = torchtitan_layout(ParallelConfig(tp=4, compile=False, **on), LLAMA_8B, 64)
    assert "compile.enable_async_tensor_parallel" not in eager  # torchtitan overlaps TP under torch.compile only
    assert eager["parallelism.enable_sequence_parallel"] is True
    gpipe = megatron_layout(ParallelConfig(pp=4, schedule=lookup("gpipe")))
    assert "(Megatron-LM runs 1F1B: it has no GPipe schedule flag)" in gpipe
    interleaved = megatron_layout(ParallelConfig(pp=4, vpp=2, schedule=lookup("interleaved1f1b")))
    assert "--num-virtual-stages-per-pipeline-rank 2" in interleaved
    assert not [f for f in megatron_layout(ParallelConfig(pp=4)) if f.startswith("(")]  # 1F1B: Megatron's own
    # 32 layers over 4 ranks in 3 virtual stages each: chunks of 3, 3, 2, which Megatron refuses and says so
    unequal = megatron_layout(ParallelConfig(pp=4, vpp=3, schedule=lookup("interleaved1f1b")), 32)
    assert any(f.startswith("(virtual stages of unequal layers, 8/8/8/8 over v = 3") for f in unequal), unequal
    assert not [
        f
        for f in megatron_layout(ParallelConfig(pp=4, vpp=2, schedule=lookup("interleaved1f1b")), 32)
        if "unequal" in f
    ]


def test_looped_bfs_is_megatrons_interleaved_schedule_taking_every_micro_batch_a_virtual_stage() -> None:
    looped = lookup("loopedbfs")
    flags = megatron_pipeline(looped, 2, None, 16)
    assert flags == [
        "--num-virtual-stages-per-pipeline-rank 2",
        "--microbatch-group-size-per-virtual-pipeline-stage 16",
    ]
    unknown = megatron_layout(ParallelConfig(pp=4, vpp=2, schedule=looped))  # a re-plan knows no step's count
    assert "--num-virtual-stages-per-pipeline-rank 2" in unknown
    assert "(--microbatch-group-size-per-virtual-pipeline-stage: the step's micro-batches)" in unknown
    interleaved = megatron_pipeline(lookup("interleaved1f1b"), 2, None, 16)
    assert interleaved == ["--num-virtual-stages-per-pipeline-rank 2"]  # the default group: depth-first
