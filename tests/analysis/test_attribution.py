"""Bubble attribution, stage imbalance and suggestions over plain data (no DB, no torch)."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from bubblescope.analysis.attribution import LayerMove, attribute_bubble, layer_moves, stage_imbalance
from bubblescope.analysis.pipeline_profile import MeasuredPipeline
from bubblescope.analysis.schedules import closed_form_bubble
from bubblescope.analysis.simulator import PipelineSetup, StageCost, simulate, uniform_costs
from bubblescope.analysis.suggestions import RunEvidence, StragglerNote, suggest, torchtitan_layer_split
from bubblescope.analysis.whatif import Change, predict

MS = 1e6


def measured(
    costs: tuple[StageCost, ...],
    schedule: str = "1f1b",
    m: int = 8,
    layers: tuple[int, ...] | None = None,
    p2p_ns: float = 0.0,
) -> MeasuredPipeline:
    setup = PipelineSetup(schedule, len(costs), m, costs, p2p_ns=p2p_ns, step_overhead_ns=5 * MS)
    return MeasuredPipeline(setup, layers, simulate(setup).step_ns, 10)


def test_causes_add_up_to_the_measured_bubble_and_name_each_part() -> None:
    costs = (StageCost(3 * MS, 6 * MS), StageCost(1 * MS, 2 * MS), StageCost(1 * MS, 2 * MS), StageCost(1 * MS, 2 * MS))
    run = measured(costs, p2p_ns=0.4 * MS)
    step = simulate(run.setup).step_ns
    attribution = attribute_bubble(run, measured_bubble_ns=45 * MS, step_ns=step)
    by_name = {c.name: c for c in attribution.causes}
    assert list(by_name) == ["schedule_inherent", "stage_imbalance", "communication_wait", "straggler_jitter"]
    # An identity (straggler/jitter is the remainder): that the causes are right, each against a
    # delay injected into a real job, is tests/analysis/test_injected_delays.py's
    assert sum(c.ns for c in attribution.causes) == pytest.approx(45 * MS)
    assert sum(c.fraction_of_step for c in attribution.causes) == pytest.approx(45 * MS / step)
    assert by_name["straggler_jitter"].ns > 0 and attribution.replay_excess_ns == 0
    # schedule-inherent: equal stages at the mean cost, so exactly the closed form's idle
    mean = simulate(PipelineSetup("1f1b", 4, 8, uniform_costs(4, 1.5 * MS, 3 * MS)))
    assert by_name["schedule_inherent"].ns == pytest.approx(
        closed_form_bubble("1f1b", 4, 8).fraction * mean.makespan_ns
    )
    assert by_name["stage_imbalance"].ns > 0
    assert by_name["communication_wait"].ns > 0
    assert attribution.closed_form_fraction == pytest.approx(3 / 11)
    assert attribution.simulated_floor_fraction > attribution.closed_form_fraction


def test_a_replay_above_the_measurement_is_cut_there_and_said_not_a_negative_cause() -> None:
    """The replay of this run idles 13.5 (schedule), 36.0 (with the stage costs) and 38.4 ms (with the
    transfers) per rank; 30 ms were measured. The causes fill up to the measurement in order and stop
    there: no negative straggler/jitter, and the 8.4 ms the replay overstates is reported on its own."""
    costs = (StageCost(3 * MS, 6 * MS), StageCost(1 * MS, 2 * MS), StageCost(1 * MS, 2 * MS), StageCost(1 * MS, 2 * MS))
    run = measured(costs, p2p_ns=0.4 * MS)
    attribution = attribute_bubble(run, measured_bubble_ns=30 * MS, step_ns=simulate(run.setup).step_ns)
    ns = {c.name: c.ns / MS for c in attribution.causes}
    assert ns["schedule_inherent"] == pytest.approx(13.5, abs=0.05)
    assert ns["stage_imbalance"] == pytest.approx(16.5, abs=0.05)  # 36.0 cut at 30
    assert ns["communication_wait"] == ns["straggler_jitter"] == 0
    assert sum(ns.values()) == pytest.approx(30)
    assert attribution.replay_excess_ns / MS == pytest.approx(8.4, abs=0.05)


def test_balanced_equal_stages_have_no_imbalance_or_communication_cause() -> None:
    run = measured(uniform_costs(4, 1 * MS, 2 * MS))
    floor = simulate(run.setup)
    attribution = attribute_bubble(run, measured_bubble_ns=sum(floor.idle_ns) / 4, step_ns=floor.step_ns)
    by_name = {c.name: c.ns for c in attribution.causes}
    assert by_name["stage_imbalance"] == pytest.approx(0, abs=1)
    assert by_name["communication_wait"] == pytest.approx(0, abs=1)
    assert by_name["straggler_jitter"] == pytest.approx(0, abs=1)


def test_imbalance_names_the_slowest_stage_and_the_moves() -> None:
    per_layer = StageCost(1 * MS, 2 * MS)
    run = measured((StageCost(3 * MS, 6 * MS), StageCost(1 * MS, 2 * MS)), m=4, layers=(3, 1))
    imbalance = stage_imbalance(run)
    assert imbalance.slowest_stage == 0
    assert imbalance.slowest_excess == pytest.approx(0.5)  # 9 ms vs a 6 ms mean
    assert imbalance.balanced_layers == (2, 2)
    assert imbalance.moves == (LayerMove(1, 0, 1),)
    balanced = simulate(
        PipelineSetup(
            "1f1b", 2, 4, (StageCost(2 * per_layer.forward_ns, 2 * per_layer.backward_ns),) * 2, step_overhead_ns=5 * MS
        )
    )
    assert imbalance.balanced_step_ns == pytest.approx(balanced.step_ns)


def test_a_move_that_cuts_less_than_the_stages_own_spread_is_not_named() -> None:
    """Layers move whole: after 3+3, stage 1 (3 layers of 1.6 ms) is 23% above the mean and the best split,
    4+2, leaves stage 0 at 3 + 1.6 = 4.6 ms: 0.2 ms off the slowest stage's 4.8. With the stage's median
    cost known to ±0.5 ms (its 95% range) that cut names no move and no rebalance is suggested; the
    split and its cut are still reported. Measured to ±0.1 ms, the same cut is a move."""
    costs = (StageCost(1 * MS, 2 * MS), StageCost(1.6 * MS, 3.2 * MS))
    run = measured(costs, m=8, layers=(3, 3))
    noisy = stage_imbalance(replace(run, stage_noise_ns=(0.5 * MS, 0.5 * MS)))
    assert noisy.slowest_stage == 1 and noisy.slowest_excess == pytest.approx(0.2308, abs=1e-4)
    assert noisy.balanced_layers == (4, 2) and noisy.balanced_cut_ns == pytest.approx(0.2 * MS)
    assert noisy.noise_ns == 0.5 * MS
    assert noisy.moves == () and noisy.balanced_step_ns is None
    found = suggest(evidence_for(replace(run, stage_noise_ns=(0.5 * MS, 0.5 * MS))))
    assert "rebalance_stages" not in {s.kind for s in found}

    quiet = stage_imbalance(replace(run, stage_noise_ns=(0.1 * MS, 0.1 * MS)))
    assert quiet.moves == (LayerMove(1, 1, 0),) and quiet.balanced_step_ns is not None
    assert quiet.balanced_cut_ns == pytest.approx(0.2 * MS)


def test_a_move_that_takes_half_the_excess_off_is_named_however_noisy_the_stage() -> None:
    """3+1 layers of 3 ms: stage 0 at 9 ms against a 6 ms mean; 2+2 takes the whole 3 ms excess off it. Even with
    its cost known only to ±5 ms the move is named: the hysteresis holds back small cuts, not large ones."""
    run = measured((StageCost(3 * MS, 6 * MS), StageCost(1 * MS, 2 * MS)), m=4, layers=(3, 1))
    noisy = stage_imbalance(replace(run, stage_noise_ns=(5 * MS, 5 * MS)))
    assert noisy.balanced_cut_ns == pytest.approx(3 * MS) and noisy.excess_ns == pytest.approx(3 * MS)
    assert noisy.moves == (LayerMove(1, 0, 1),)


def test_layer_moves_cross_every_boundary() -> None:
    assert layer_moves((4, 1, 1, 2), (2, 2, 2, 2)) == (LayerMove(2, 0, 1), LayerMove(1, 1, 2))
    assert layer_moves((1, 3), (2, 2)) == (LayerMove(1, 1, 0),)
    assert layer_moves((2, 2), (2, 2)) == ()


def evidence_for(run: MeasuredPipeline, **extra: object) -> RunEvidence:
    step = simulate(run.setup).step_ns
    floor = simulate(run.setup)
    attribution = attribute_bubble(run, sum(floor.idle_ns) / run.setup.ranks, step)
    return RunEvidence(
        config=extra.pop("config", {}),
        step_ns=step,
        measured=run,
        attribution=attribution,  # type: ignore[arg-type]
        imbalance=stage_imbalance(run),
        **extra,
    )  # type: ignore[arg-type]


def test_naive_model_parallelism_gets_pipelined_first() -> None:
    run = measured(uniform_costs(4, 8 * MS, 16 * MS), schedule="naive", m=1)
    found = suggest(evidence_for(run, config={"microbatch_size": 64}))
    top = found[0]
    assert top.kind == "pipeline_naive_split"
    assert top.apply["schedule"] == "1f1b" and 64 % top.apply["num_microbatches"] == 0
    assert top.apply["microbatch_size"] * top.apply["num_microbatches"] == 64
    assert top.predicted_step_ns < top.current_step_ns
    assert "Schedule1F1B" in (top.torch_pipelining or "")
    assert any(flag.startswith("--micro-batch-size") for flag in top.megatron)


def test_an_imbalanced_pipeline_gets_its_layers_moved() -> None:
    run = measured((StageCost(3 * MS, 6 * MS), StageCost(1 * MS, 2 * MS)), m=8, layers=(3, 1))
    found = suggest(evidence_for(run, config={"microbatch_size": 4}))
    rebalance = next(s for s in found if s.kind == "rebalance_stages")
    assert rebalance.apply == {"layers_per_stage": [2, 2]}
    assert "move 1 layer from stage 0 to stage 1" in rebalance.title
    # torchtitan's field is an int (layers per stage), valid to paste into its config
    assert rebalance.torchtitan["parallelism.pipeline_parallel_layers_per_stage"] == 2
    assert rebalance.gain_fraction > 0.1
    assert all(a.gain_fraction >= b.gain_fraction for a, b in itertools.pairwise(found))


def change_from_apply(apply: dict, config: dict) -> Change:
    """A suggestion's ``apply`` (run-config keys) as the replay's change, the way a user applies it."""
    size = apply.get("microbatch_size")
    return Change(
        schedule=apply.get("schedule"),
        microbatches=apply.get("num_microbatches"),
        microbatch_scale=size / config["microbatch_size"] if size else 1.0,
        stages_per_rank=apply.get("virtual_stages"),
        layers_per_stage=tuple(apply["layers_per_stage"]) if "layers_per_stage" in apply else None,
    )


def test_every_pipeline_suggestion_says_all_it_changes() -> None:
    # (5, 1) layers: the other schedules run 2 stages per rank, so the layers must be re-cut into 4;
    # a suggestion that left the split out could not be applied as predicted (seen in CI: zbv with 2 counts)
    imbalanced = measured((StageCost(5 * MS, 10 * MS), StageCost(1 * MS, 2 * MS)), m=4, layers=(5, 1))
    few_microbatches = measured(uniform_costs(2, 2 * MS, 4 * MS), m=2, layers=(3, 3))
    config = {"microbatch_size": 8}
    kinds = set()
    for run in (imbalanced, few_microbatches):
        for suggestion in suggest(evidence_for(run, config=config)):
            kinds.add(suggestion.kind)
            change = change_from_apply(suggestion.apply, config)
            replayed = predict(run, change)
            assert replayed.step_ns == pytest.approx(suggestion.predicted_step_ns), (suggestion.title, suggestion.apply)
            if change.stages_per_rank == 2:
                layers = suggestion.apply["layers_per_stage"]
                assert len(layers) == 4 and sum(layers) == 6, suggestion.apply
                assert ",".join(map(str, layers)) in suggestion.title
    assert {"more_microbatches", "better_schedule", "rebalance_stages"} <= kinds


def test_waits_inside_mesh_collectives_are_carved_out_of_the_unexplained_rest() -> None:
    """A DP×PP run's replicas wait for each other in the dp all-reduce, which the pipeline replay does not
    model: that wait is its own cause, taken from what the replay leaves unexplained and never more."""
    run = measured(uniform_costs(2, 1 * MS, 2 * MS), m=8)
    step = 40 * MS
    floor = attribute_bubble(run, 0.0, step).simulated_floor_ns
    measured_ns = floor + 10 * MS  # 10 ms the replay does not explain (no p2p cost here)
    plain = attribute_bubble(run, measured_ns, step)
    assert [c.name for c in plain.causes][-1] == "straggler_jitter"
    assert "mesh_collective_wait" not in [c.name for c in plain.causes]  # a run without mesh collectives
    split = {c.name: c.ns for c in attribute_bubble(run, measured_ns, step, mesh_wait_ns=6 * MS).causes}
    assert split["mesh_collective_wait"] == pytest.approx(6 * MS)
    assert split["straggler_jitter"] == pytest.approx(4 * MS)
    assert sum(split.values()) == pytest.approx(measured_ns)
    capped = {c.name: c.ns for c in attribute_bubble(run, measured_ns, step, mesh_wait_ns=25 * MS).causes}
    assert capped["mesh_collective_wait"] == pytest.approx(10 * MS) and capped["straggler_jitter"] == 0


def test_a_schedule_switch_says_why_the_replay_prefers_it() -> None:
    """Away from ZB-V on a runtime that costs 1 ms an action: Interleaved 1F1B idles longer but runs a
    third fewer actions (zero-bubble schedules split every backward in two), and the reason says both."""
    costs = uniform_costs(4, 1 * MS, 2 * MS)
    setup = PipelineSetup("zbv", 2, 4, costs, stages_per_rank=2, action_overhead_ns=1 * MS, step_overhead_ns=5 * MS)
    run = MeasuredPipeline(setup, None, simulate(setup).step_ns, 10)
    step = run.measured_step_ns
    evidence = RunEvidence(
        config={}, step_ns=step, measured=run, attribution=attribute_bubble(run, 0.3 * step, step), imbalance=None
    )
    switch = next(s for s in suggest(evidence) if s.apply.get("schedule") == "interleaved1f1b")
    today, other = predict(run, Change()), predict(run, Change(schedule="interleaved1f1b", stages_per_rank=2))
    assert other.step_ns < today.step_ns and sum(other.result.idle_ns) > sum(today.result.idle_ns)
    # 4 micro-batches x 2 stages: ZB-V runs F, I and W of each (24), Interleaved 1F1B F and B (16)
    assert "runs 16 actions a rank against 24" in switch.evidence, switch.evidence
    assert f"idles {sum(other.result.idle_ns) / 2 / 1e6:.1f} ms a rank" in switch.evidence
    assert f"against {sum(today.result.idle_ns) / 2 / 1e6:.1f} ms under" in switch.evidence
    assert "fitted 1.00 ms" in switch.evidence


def test_an_exposed_dp_reduction_of_a_dp_x_pp_run_prices_trading_dp_for_pp() -> None:
    """dp 4 × pp 2 with 20% of the step in the dp reduction: dp 2 × pp 4 replays 4 stages of half the
    cost with 2m micro-batches, and the reduction moves half the gradients over 2 replicas:
    ½ · (1 − ½) / (1 − ¼) = ⅓ of today's exposed time. The prediction is the measured step times the
    replay's ratio."""
    from dataclasses import replace

    from bubblescope.analysis.layout_fixes import trade_dp_for_pp

    setup = PipelineSetup("1f1b", 2, 4, uniform_costs(2, 2 * MS, 4 * MS), step_overhead_ns=10 * MS)
    run = MeasuredPipeline(setup, None, simulate(setup).step_ns, 10)
    step = run.measured_step_ns
    exposed = 0.2 * step
    evidence = RunEvidence(config={}, step_ns=step, measured=run, exposed_comm_ns={"dp": exposed})
    (trade,) = trade_dp_for_pp(evidence, {"dp": 4, "pp": 2})
    assert trade.apply == {"dp": 2, "pp": 4, "num_microbatches": 8}
    traded = replace(
        setup,
        ranks=4,
        microbatches=8,
        stage_costs=uniform_costs(4, 1 * MS, 2 * MS),
        step_overhead_ns=10 * MS - exposed + exposed / 3,
    )
    assert trade.predicted_step_ns == pytest.approx(step * simulate(traded).step_ns / simulate(setup).step_ns)
    assert f"{exposed / 1e6:.1f} ms per step" in trade.evidence and f"{exposed / 3e6:.1f} ms" in trade.evidence
    # nothing to trade: one replica, an odd dp, a reduction under 5% of the step
    assert trade_dp_for_pp(evidence, {"dp": 1, "pp": 2}) == []
    assert trade_dp_for_pp(evidence, {"dp": 3, "pp": 2}) == []
    quiet = RunEvidence(config={}, step_ns=step, measured=run, exposed_comm_ns={"dp": 0.01 * step})
    assert trade_dp_for_pp(quiet, {"dp": 4, "pp": 2}) == []


def test_a_declared_model_prices_the_dp_for_pp_trade_as_the_planner_does() -> None:
    """The same run declaring its model and cluster (GPT-7.5B on 64 A100s, dp 4 × pp 2 × tp 8): the trade is the
    measured step times the planner's ratio of the two layouts, the very figures ``plan`` gives for them, so a
    suggestion and ``bubblescope plan`` never disagree."""
    from bubblescope.analysis.layout_fixes import trade_dp_for_pp
    from bubblescope.analysis.planner import plan_document

    setup = PipelineSetup("1f1b", 2, 4, uniform_costs(2, 2 * MS, 4 * MS), step_overhead_ns=10 * MS)
    run = MeasuredPipeline(setup, None, simulate(setup).step_ns, 10)
    step = run.measured_step_ns
    declared = {"model": "gpt-7.5b", "cluster": "a100-80gb-x64", "tp": 8, "global_batch": 64, "microbatch_size": 1}
    evidence = RunEvidence(config=declared, step_ns=step, measured=run, exposed_comm_ns={"dp": 0.2 * step})
    (trade,) = trade_dp_for_pp(evidence, {"dp": 4, "pp": 2})

    def planned(pp: int, dp: int) -> float:
        body = {"model": "gpt-7.5b", "cluster": "a100-80gb-x64", "global_batch": 64}
        (plan,) = plan_document({**body, "config": {"tp": 8, "pp": pp, "dp": dp, "mbs": 1}}).plans
        assert plan.step is not None
        return plan.step.total

    assert trade.predicted_step_ns == pytest.approx(step * planned(4, 2) / planned(2, 4), rel=1e-9)
    assert (
        "priced by the planner" in trade.evidence and f"{planned(2, 4):.3f} → {planned(4, 2):.3f} s" in trade.evidence
    )


def test_communication_placement_and_stragglers_are_suggested() -> None:
    run = measured(uniform_costs(2, 1 * MS, 2 * MS), m=8)
    step = simulate(run.setup).step_ns
    found = suggest(
        evidence_for(
            run,
            exposed_comm_ns={"dp": 0.2 * step, "tp": 0.1 * step},
            tp_hosts_per_group=2,
            stragglers=[StragglerNote(1, "node-7", 1.4, "rank 1 is 1.4x its peers on 9 of 10 steps")],
        )
    )
    kinds = {s.kind: s for s in found}
    assert kinds["overlap_dp_communication"].predicted_step_ns == pytest.approx(0.8 * step)
    assert "--overlap-grad-reduce" in kinds["overlap_dp_communication"].megatron
    assert kinds["tp_inside_node"].gain_fraction > 0
    assert "node-7" in kinds["drain_straggler"].title


def test_a_healthy_run_gets_no_suggestion() -> None:
    run = measured(uniform_costs(2, 1 * MS, 2 * MS), m=64)
    assert suggest(evidence_for(run, exposed_comm_ns={"dp": 0.001 * MS})) == []


def test_memory_pressure_is_priced_by_the_planner() -> None:
    from bubblescope.analysis.memory_fixes import memory_suggestions
    from bubblescope.analysis.planner import ParallelConfig, cluster_preset, evaluate, model_from

    config = {
        "model": "gpt-22b",
        "cluster": "a100-80gb-x8",
        "tp": 8,
        "pp": 1,
        "microbatch_size": 4,
        "global_batch": 4,
        "flash_attention": False,  # stores the attention scores, which selective recompute drops
    }
    found = memory_suggestions(config, 2e9)
    model, cluster = model_from("gpt-22b"), cluster_preset("a100-80gb-x8")
    now = evaluate(model, cluster, ParallelConfig(tp=8, mbs=4, sequence_parallel=True, flash_attention=False), 4)
    assert found and all(s.kind == "memory_pressure" for s in found)
    selective = next(s for s in found if s.apply == {"recompute": "selective"})
    after = evaluate(
        model,
        cluster,
        ParallelConfig(tp=8, mbs=4, recompute="selective", sequence_parallel=True, flash_attention=False),
        4,
    )
    assert after.fits and after.memory.total < now.memory.total
    assert selective.predicted_step_ns == pytest.approx(2e9 * after.step.total / now.step.total)
    assert "--recompute-granularity selective" in selective.megatron
    pressed = {**config, "flash_attention": True, "sequence_parallel": False}  # still under pressure, no scores
    with_flash = memory_suggestions(pressed, 2e9)  # no scores stored: selective recompute has nothing to drop
    assert with_flash and not any(s.apply == {"recompute": "selective"} for s in with_flash), with_flash
    per_op = next(s for s in with_flash if s.apply == {"recompute": "op"})  # torchtitan's: keeps half the matmuls
    assert per_op.torchtitan == {"activation-checkpoint:selective": True}  # torchtitan 0.3.0's SelectiveAC
    assert not any("--recompute-granularity" in flag for flag in per_op.megatron), per_op.megatron
    assert memory_suggestions({**config, "microbatch_size": 1, "recompute": "full"}, 2e9) == []  # no pressure
    assert memory_suggestions({"schedule": "1f1b"}, 2e9) == []  # no model declared


def test_a_re_planned_layout_keeps_the_runs_own_numerics() -> None:
    """Llama 3.1 405B on 128 H100s at tp 1 with ZeRO-3 and full recompute: no single change fits, so the planner's
    fastest layout is suggested, searched with the run's FP8 linears and FP8 weight gathers held (a layout in bf16
    would be a different job); its Megatron-LM flags say so. A run that declares torchtitan's flag without Float8 is
    still planned, the flag dropped (it does nothing there). A run with Megatron's ``--overlap-param-gather`` keeps it
    in a re-plan that still gathers once a step."""
    from bubblescope.analysis.memory_fixes import declared_plan, memory_suggestions

    run = {"model": "llama-3.1-405b", "cluster": "h100-sxm-x128", "tp": 1, "zero": 3, "recompute": "full"}
    run |= {"precision": "fp8", "fp8_all_gather": True, "microbatch_size": 1, "global_batch": 128}
    found = memory_suggestions(run, 2e9)
    replanned = [s for s in found if s.title.startswith("Re-plan the layout")]
    assert replanned, [s.title for s in found]
    assert replanned[0].apply["precision"] == "fp8" and replanned[0].apply["fp8_all_gather"] is True
    assert "--fp8-param-gather" in replanned[0].megatron
    in_bf16 = declared_plan({**run, "precision": "bf16"})
    assert in_bf16 is not None and not in_bf16.config.fp8_all_gather
    # Megatron's --overlap-param-gather with the distributed optimizer (Llama 3 8B on 16 H100s, ZeRO-1 at tp 1,
    # micro-batches of 4, nothing recomputed): the re-plan, at ZeRO-2 and tp 2, keeps it, and its flags say so
    megatron = {"model": "llama-3-8b", "cluster": "h100-sxm-x16", "tp": 1, "zero": 1, "recompute": "none"}
    megatron |= {"microbatch_size": 4, "global_batch": 64, "overlap_param_gather": True}
    found = memory_suggestions(megatron, 2e9)
    replanned = [s for s in found if s.title.startswith("Re-plan the layout")]
    assert replanned and replanned[0].apply["zero"] in (1, 2), [(s.title, s.apply) for s in found]
    assert replanned[0].apply["overlap_param_gather"] is True and "--overlap-param-gather" in replanned[0].megatron


def test_memory_pressure_of_a_v_shaped_run_is_priced_at_its_stages_per_rank() -> None:
    """A ZB-V run reports num_stages = p·v: the planner must see p ranks holding two stages each
    (at one stage per rank the registry refuses ZB-V and no fix would be priced)."""
    from bubblescope.analysis.memory_fixes import memory_suggestions

    run = {
        "model": "gpt-22b",
        "cluster": "a100-80gb-x8",
        "tp": 4,
        "microbatch_size": 1,
        "global_batch": 8,
        "flash_attention": False,  # the attention scores stored: memory pressure to price
        "sequence_parallel": False,
    }
    zbv = {**run, "schedule": "ScheduleZBVZeroBubble", "num_stages": 4, "virtual_stages": 2, "pipeline_ranks": 2}
    found = memory_suggestions(zbv, 2e9)
    assert found and all(s.kind == "memory_pressure" for s in found)
    assert all(s.predicted_step_ns > 0 for s in found)


def test_more_microbatches_are_offered_only_where_the_schedule_accepts_them() -> None:
    """Interleaved 1F1B on 3 ranks at m=5: torch refuses m=10 and m=20 (not multiples of their rounds)."""
    costs = tuple(StageCost(1 * MS, 2 * MS) for _ in range(6))
    setup = PipelineSetup("interleaved1f1b", 3, 5, costs, stages_per_rank=2, step_overhead_ns=1 * MS)
    run = MeasuredPipeline(setup, None, simulate(setup).step_ns, 10)
    step = simulate(setup).step_ns
    found = suggest(
        RunEvidence(config={}, step_ns=step, measured=run, attribution=attribute_bubble(run, 0.3 * step, step))
    )
    assert found and not [s for s in found if s.kind == "more_microbatches"]
    four = PipelineSetup("interleaved1f1b", 3, 6, costs, stages_per_rank=2, step_overhead_ns=1 * MS)  # 12, 24 fine
    run_four = MeasuredPipeline(four, None, simulate(four).step_ns, 10)
    step_four = simulate(four).step_ns
    offered = suggest(
        RunEvidence(
            config={},
            step_ns=step_four,
            measured=run_four,
            attribution=attribute_bubble(run_four, 0.3 * step_four, step_four),
        )
    )
    assert sorted(s.apply["num_microbatches"] for s in offered if s.kind == "more_microbatches") == [12, 24]


def test_fixed_part_of_an_action_is_kept_when_layers_move_or_micro_batches_shrink() -> None:
    from bubblescope.analysis.model import TimedSpan
    from bubblescope.analysis.pipeline_profile import StepSpans, measure_pipeline
    from bubblescope.analysis.whatif import Change, predict

    # stage 0: 3 layers, stage 1: 1 layer; each action costs 1 ms fixed + 1 ms (F) / 2 ms (B) per layer
    spans = []
    for stage, layers, start in ((0, 3, 0), (1, 1, 50 * MS)):
        f, b = (1 + layers) * MS, (1 + 2 * layers) * MS
        spans += [
            TimedSpan(stage, "forward", int(start), int(start + f), stage, 0),
            TimedSpan(stage, "backward", int(start + f), int(start + f + b), stage, 0),
        ]
    windows = {0: (0, int(100 * MS)), 1: (0, int(100 * MS))}
    config = {"schedule": "gpipe", "num_stages": 2, "num_microbatches": 1, "layers_per_stage": [3, 1]}
    run = measure_pipeline([StepSpans(1, spans, windows)], config)
    assert run.fixed_cost == StageCost(1 * MS, 1 * MS)
    assert run.layer_costs == (StageCost(1 * MS, 2 * MS),) * 4
    moved = predict(run, Change(layers_per_stage=(2, 2)))
    forwards = {t.rank: t.end_ns - t.start_ns for t in moved.result.timeline if t.action.kind == "F"}
    assert forwards == {
        0: pytest.approx(3 * MS + run.setup.action_overhead_ns),
        1: pytest.approx(3 * MS + run.setup.action_overhead_ns),
    }
    halved = predict(run, Change(microbatches=2, microbatch_scale=0.5))
    first_forward = next(t for t in halved.result.timeline if t.rank == 0 and t.action.kind == "F")
    assert first_forward.end_ns - first_forward.start_ns == pytest.approx(
        1 * MS + 1.5 * MS + run.setup.action_overhead_ns
    )


def test_step_overhead_follows_the_layers_of_the_rank_holding_the_most_when_layers_move() -> None:
    from bubblescope.analysis.model import TimedSpan
    from bubblescope.analysis.pipeline_profile import StepSpans, measure_pipeline

    # Each rank: 2 ms of data loading and 3 ms per layer of clipping + optimizer outside its
    # pipeline work, and a 4 ms gradient-norm all-reduce (communication: not its own work).
    # Rank 0 holds 5 layers, rank 1 one; rank 0's 15 ms ends the step.
    spans, windows = [], {}
    for rank, layers, start, end in ((0, 5, 2, 60), (1, 1, 10, 70)):
        spans += [
            TimedSpan(rank, "forward", int(start * MS), int((start + 10) * MS), rank, 0),
            TimedSpan(rank, "backward", int((start + 10) * MS), int(end * MS), rank, 0),
            TimedSpan(rank, "all_reduce", int(end * MS), int((end + 4) * MS)),
        ]
        windows[rank] = (0 if rank == 0 else int(8 * MS), int((end + 4 + 3 * layers) * MS))
    config = {"schedule": "gpipe", "num_stages": 2, "num_microbatches": 1, "layers_per_stage": [5, 1]}
    run = measure_pipeline([StepSpans(1, spans, windows)], config)
    assert run.overhead_per_layer_ns == pytest.approx(3 * MS)
    assert run.rank_layers([3, 3]) == (3, 3) and run.rank_layers([2, 1, 1, 2], "interleaved1f1b") == (3, 3)
    balanced = predict(run, Change(layers_per_stage=(3, 3)))
    same = predict(run, Change(microbatches=2))
    assert same.result.step_ns - same.result.makespan_ns == pytest.approx(run.setup.step_overhead_ns)
    # 5 -> 3 layers on the largest rank: 6 ms less outside the pipeline
    assert balanced.result.step_ns - balanced.result.makespan_ns == pytest.approx(run.setup.step_overhead_ns - 6 * MS)


def test_an_uneven_layer_split_is_given_to_torchtitan_as_module_names_per_stage() -> None:
    assert torchtitan_layer_split((3, 2, 2, 1)) == {
        "parallelism.module_fqns_per_model_part": [
            ["tok_embeddings", "layers.0", "layers.1", "layers.2"],
            ["layers.3", "layers.4"],
            ["layers.5", "layers.6"],
            ["layers.7", "norm", "lm_head"],
        ]
    }
    assert torchtitan_layer_split([4, 4]) == {  # the embedding and the output counted as no layer: 2 stages, not 3
        "parallelism.pipeline_parallel_layers_per_stage": 4,
        "parallelism.pipeline_parallel_first_stage_less_layers": 0,
        "parallelism.pipeline_parallel_last_stage_less_layers": 0,
    }
