"""A run that declares its model, cluster and layout is read as ``bubblescope plan`` reads a configuration (context
and expert parallelism, uneven stages, TP overlap included), and its memory fixes reach for context parallelism on a
long sequence and expert parallelism on a mixture of experts, each priced with the figures ``plan`` gives for the two
layouts, so a suggestion and ``plan`` never disagree."""

from __future__ import annotations

from typing import Any

import pytest

from bubblescope.analysis.memory_fixes import declared_plan, memory_suggestions
from bubblescope.analysis.planner import plan_document
from bubblescope.analysis.suggestions import Suggestion

STEP_NS = 10e9


def planned_seconds(model: Any, cluster: str, batch: int, config: dict[str, Any]) -> float:
    (plan,) = plan_document({"model": model, "cluster": cluster, "global_batch": batch, "config": config}).plans
    assert plan.step is not None, plan.problems
    return plan.step.total


def only(found: list[Suggestion], words: str) -> Suggestion:
    matching = [s for s in found if words in s.title]
    assert len(matching) == 1, [s.title for s in found]
    return matching[0]


def test_every_knob_plan_takes_is_read_from_the_runs_config_as_plan_reads_it() -> None:
    run = {"model": "llama-3-8b", "cluster": "h100-sxm-x64", "global_batch": 64, "microbatch_size": 1}
    layout = {"tp": 2, "pp": 4, "layers_per_stage": "7/9/9/7", "cp": 2, "cp_comm": "allgather", "tp_comm_overlap": True}
    layout |= {"zero": 1, "recompute": "op", "precision": "fp8", "grad_reduce": "bf16", "compile": False}
    declared = declared_plan(run | layout)
    assert declared is not None
    (plan,) = plan_document(
        {"model": "llama-3-8b", "cluster": "h100-sxm-x64", "global_batch": 64, "config": layout | {"mbs": 1}}
    ).plans
    assert declared.config.with_dp(declared.cluster.gpus) == plan.config
    assert (plan.config.cp, plan.config.layers_per_stage, plan.config.dp) == (2, (7, 9, 9, 7), 4)
    first_last = declared_plan(run | {"tp": 2, "pp": 4, "first_stage_layers": 7, "last_stage_layers": 7})
    assert first_last is not None and first_last.config.layers_per_stage == (7, 9, 9, 7)
    interleaved = declared_plan(run | {"tp": 2, "pp": 4, "vpp": 2, "layers_per_stage": "7/9/9/7"})
    assert interleaved is not None and interleaved.config.vpp == 2
    assert interleaved.config.layers_per_stage == (7, 9, 9, 7)  # uneven stages with virtual stages, as plan takes them
    # the collector's (and torchtitan's) count of every virtual stage, pp·v of them, summed onto the ranks running them
    looped = {"pp": 2, "schedule": "Interleaved1F1B", "virtual_stages": 2, "layers_per_stage": [5, 9, 10, 8]}
    folded = declared_plan(run | looped)
    assert folded is not None and (folded.config.layers_per_stage, folded.config.vpp) == ((15, 17), 2)
    v_shaped = declared_plan(run | {"pp": 2, "schedule": "ZBVZeroBubble", "layers_per_stage": [5, 9, 10, 8]})
    assert v_shaped is not None and v_shaped.config.layers_per_stage == (13, 19)  # rank 0 runs stages 0 and 3
    # counts that fit no placement are refused as before, never folded onto the wrong ranks
    for wrong in (
        {"pp": 2, "schedule": "ZBVZeroBubble", "layers_per_stage": [4] * 8},  # a V runs two stages a rank, not four
        {"pp": 2, "schedule": "1F1B", "layers_per_stage": [8] * 4},  # one stage a rank
        {"layers_per_stage": [8] * 4},  # no pipeline declared
        {"pp": 2, "vpp": 4, "schedule": "Interleaved1F1B", "layers_per_stage": [8] * 4},  # 2 a rank given, 4 said
    ):
        assert declared_plan(run | wrong) is None, wrong
    moe = declared_plan({**run, "model": "mixtral-8x7b", "ep": 4, "capacity_factor": 1.25})
    assert moe is not None and (moe.config.ep, moe.config.capacity_factor) == (4, 1.25)
    # what `plan` refuses prices nothing (and raises nothing): an unknown CP method, uneven stages that do not add up
    assert declared_plan(run | {"cp": 2, "cp_comm": "ring"}) is None
    assert declared_plan(run | {"pp": 4, "first_stage_layers": 6}) is None  # 26 over 3 stages
    assert declared_plan(run | {"pp": 2, "layers_per_stage": [1, 2]}) is None  # 3 layers of the model's 32
    assert declared_plan(run | {"pp": 4, "vpp": 8, "layers_per_stage": "7/9/9/7"}) is None  # 7 layers over 8 chunks
    assert declared_plan(run | {"pp": 10**6}) is None  # more stages than layers, refused before any is priced
    # the run config's own spellings: any case, plan's aliases, the collector's names; None is absent
    spelled = declared_plan(run | {"TP": 2, "sp": False, "pipeline_ranks": 2, "pp": None, "microbatch_size": None})
    assert spelled is not None and (spelled.config.tp, spelled.config.pp, spelled.config.mbs) == (2, 2, 1)
    assert not spelled.config.sequence_parallel
    staged = declared_plan(run | {"num_stages": 8, "virtual_stages": 2, "schedule": None})
    assert staged is not None and staged.config.pp == 4  # p = stages / stages per rank
    assert memory_suggestions(run | {"cp": 2, "cp_comm": "ring"}, STEP_NS) == []


def test_a_long_sequence_under_memory_pressure_is_offered_context_parallelism_priced_as_plan_prices_it() -> None:
    """torchtitan's Table 2 case: Llama 3 8B at 32k tokens on 8 H100s, FSDP and full recompute. ZeRO is at its last
    stage and recompute at its most; splitting each sequence over two ranks halves the activations."""
    model = {"preset": "llama-3-8b", "seq": 32768}
    run = {"model": model, "cluster": "h100-sxm-x8", "global_batch": 8, "microbatch_size": 1}
    layout = {"zero": 3, "recompute": "full"}
    found = memory_suggestions(run | layout, STEP_NS)
    split = only(found, "context-parallel")
    assert split.apply == {"cp": 2, "dp": 4}, split.apply
    assert split.torchtitan == {"parallelism.context_parallel_degree": 2}
    assert split.megatron == ["--context-parallel-size 2"]
    now = planned_seconds(model, "h100-sxm-x8", 8, layout | {"mbs": 1})
    after = planned_seconds(model, "h100-sxm-x8", 8, layout | {"mbs": 1, "cp": 2, "dp": 4})
    assert split.predicted_step_ns == pytest.approx(STEP_NS * after / now, rel=1e-9)
    # a run that already splits its sequences is offered the next degree, from its own cp
    deeper = memory_suggestions(run | layout | {"model": {"preset": "llama-3-8b", "seq": 65536}, "cp": 2}, STEP_NS)
    assert only(deeper, "context-parallel").apply == {"cp": 4, "dp": 2}
    # with no single change fitting (128k tokens on 16 GPUs), the re-planned layout's own CP degree is in its flags
    longest = {"model": {"preset": "llama-3-8b", "seq": 131072}, "cluster": "h100-sxm-x16", "global_batch": 16}
    (replanned,) = memory_suggestions(run | layout | longest, STEP_NS)
    cp = replanned.apply["cp"]
    assert replanned.title.startswith("Re-plan the layout") and cp > 1, replanned.title
    # the title names what changes, from the run's value to the planned one; the apply is the whole layout
    assert f"cp 1 → {cp}" in replanned.title and "zero" not in replanned.title, replanned.title
    assert replanned.apply["zero"] == 3 and replanned.apply["precision"] == "bf16"
    assert replanned.torchtitan["parallelism.context_parallel_degree"] == cp
    assert f"--context-parallel-size {cp}" in replanned.megatron
    # the flags say the whole layout priced, its sharding and recompute too (Megatron-FSDP for ZeRO 3, per-op
    # checkpointing torchtitan's: said as lines in Megatron's), not only what the title lists
    assert replanned.apply["recompute"] == "op" and "recompute full → op" in replanned.title, replanned.title
    assert replanned.torchtitan["activation-checkpoint:selective"] is True
    assert {"--use-megatron-fsdp", "--data-parallel-sharding-strategy optim_grads_params"} <= set(replanned.megatron)
    assert "(per-op checkpointing is torchtitan's; Megatron-LM has no flag for it)" in replanned.megatron
    # re-planned to tp 1, the title lists no switch of TP's (moot there); a run with TP overlap keeps it (its code)
    # and is priced with it, so TP stays in its layout and its flags
    widest = run | layout | longest | {"model": {"preset": "llama-3-8b", "seq": 262144}, "tp": 2}
    (to_cp,) = memory_suggestions(widest, STEP_NS)
    assert to_cp.title == "Re-plan the layout: tp 2 → 1, dp 8 → 2, cp 1 → 8", to_cp.title
    (overlapped,) = memory_suggestions(widest | {"tp_comm_overlap": True}, STEP_NS)
    assert overlapped.apply["tp"] > 1 and overlapped.apply["tp_comm_overlap"] is True, overlapped.apply
    assert {"--tp-comm-overlap", "--sequence-parallel"} <= set(overlapped.megatron), overlapped.megatron
    assert overlapped.torchtitan["compile.enable_async_tensor_parallel"] is True


def test_a_mixture_of_experts_under_memory_pressure_is_offered_more_expert_parallelism_priced_as_plan_prices_it() -> (
    None
):
    run = {"model": "mixtral-8x7b", "cluster": "h100-sxm-x32", "global_batch": 64, "microbatch_size": 1}
    layout = {"tp": 4, "zero": 1, "recompute": "full"}
    found = memory_suggestions(run | layout, STEP_NS)
    spread = only(found, "expert-parallel")
    assert spread.apply == {"ep": 2} and spread.megatron == ["--expert-model-parallel-size 2"]
    assert spread.torchtitan == {"parallelism.expert_parallel_degree": 2}
    now = planned_seconds("mixtral-8x7b", "h100-sxm-x32", 64, layout | {"mbs": 1})
    after = planned_seconds("mixtral-8x7b", "h100-sxm-x32", 64, layout | {"mbs": 1, "ep": 2})
    assert spread.predicted_step_ns == pytest.approx(STEP_NS * after / now, rel=1e-9)
    dense = memory_suggestions({**run, "model": "llama-3-8b"} | layout, STEP_NS)
    assert not any("expert" in s.title for s in dense)  # a dense model has no experts to spread
