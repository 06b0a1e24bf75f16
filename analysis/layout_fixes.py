"""Layout changes of a hybrid run: trade data parallelism for pipeline stages.

When a DP×PP run's data-parallel gradient reduction is exposed (at least ``EXPOSED_COMM_MARGIN`` of
the step), halving ``dp`` and doubling ``pp`` at the same global batch is priced with the replay:

- each rank holds half its layers: every stage's cost less its fixed part halves, and each stage
  becomes two consecutive stages (on 2p ranks);
- each pipeline replica takes twice the samples: 2m micro-batches of the same size;
- the reduction moves half the gradients a rank holds, over dp/2 replicas: a ring all-reduce sends
  2(n − 1)/n of them, so the exposed time scales by ½ · (1 − 2/dp) / (1 − 1/dp), and vanishes at dp = 2.

The prediction is the measured step times the replay's ratio (traded over today's), so that the
replay's own error cancels as for every other fix. It assumes the new stages' transfers cost today's. Where the
run declares its model and cluster, the ratio is the planner's instead (``planner_ratio``): the suggestion and
``bubblescope plan`` then price the trade alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from bubblescope.analysis.memory_fixes import declared_plan
from bubblescope.analysis.planner import evaluate
from bubblescope.analysis.schedules import lookup
from bubblescope.analysis.simulator import StageCost, simulate
from bubblescope.analysis.suggestions import (
    DP_GROUPS,
    EXPOSED_COMM_MARGIN,
    RunEvidence,
    Suggestion,
    build_suggestion,
    torchtitan_pipeline,
)


def trade_dp_for_pp(evidence: RunEvidence, mesh_sizes: Mapping[str, int]) -> list[Suggestion]:
    measured = evidence.measured
    dp, pp = mesh_sizes.get("dp", 1), mesh_sizes.get("pp", 1)
    exposed = sum(evidence.exposed_comm_ns.get(group, 0.0) for group in DP_GROUPS)
    step = evidence.step_ns
    if measured is None or dp < 2 or dp % 2 or pp < 2 or not step or exposed / step < EXPOSED_COMM_MARGIN:
        return []
    setup = measured.setup
    if setup.stages_per_rank != 1 or lookup(setup.schedule).placement != "single" or setup.ranks != pp:
        return []
    fixed = measured.fixed_cost
    halves = tuple(half for cost in setup.stage_costs for half in (_halved(cost, fixed),) * 2)
    new_dp = dp // 2
    scale = 0.5 * (1 - 1 / new_dp) / (1 - 1 / dp)
    outside = max(0.0, setup.step_overhead_ns - exposed) + exposed * scale
    traded = replace(
        setup, ranks=2 * pp, microbatches=2 * setup.microbatches, stage_costs=halves, step_overhead_ns=outside
    )
    today, after = simulate(setup), simulate(traded)
    predicted = step * after.step_ns / today.step_ns
    priced = f"{2 * setup.microbatches} micro-batches (replayed)"
    planned = planner_ratio(evidence.config, dp, pp)
    if planned is not None:  # the run declares its model: the planner prices both layouts, as `bubblescope plan` does
        ratio, now_s, traded_s = planned
        priced += (
            f"; priced by the planner for the declared model, as `bubblescope plan` prices both layouts: "
            f"{now_s:.3f} → {traded_s:.3f} s a step (the replay alone said {predicted / 1e6:.1f} ms)"
        )
        predicted = step * ratio
    return [
        build_suggestion(
            evidence,
            "trade_dp_for_pp",
            predicted,
            sum(after.idle_ns) / len(after.idle_ns) / after.step_ns,
            f"Trade data parallelism for pipeline stages: dp {dp} → {new_dp}, pp {pp} → {2 * pp}",
            f"exposed data-parallel reduction {exposed / 1e6:.1f} ms per step ({exposed / step:.0%} of the step); "
            f"with half the layers a rank it moves half the gradients over {new_dp} replica(s) "
            f"({exposed * scale / 1e6:.1f} ms), while the pipeline runs {2 * pp} stages and {priced}",
            "each rank holds half the layers' weights, gradients and optimizer state; the first stage holds "
            "twice the micro-batches of half as many layers: about today's activation bytes",
            {"dp": new_dp, "pp": 2 * pp, "num_microbatches": 2 * setup.microbatches},
            None,
            {"parallelism.data_parallel_shard_degree": new_dp} | torchtitan_pipeline(2 * pp),
            [f"--pipeline-model-parallel-size {2 * pp}", "(data-parallel size follows: world / (tp × pp))"],
        )
    ]


def planner_ratio(config: Mapping[str, Any], dp: int, pp: int) -> tuple[float, float, float] | None:
    """(traded / today, today's seconds, traded seconds) of halving dp and doubling pp, by the planner, for a run
    whose config declares its model and cluster (``memory_fixes.declared_plan``); None where it does not, or where
    the planner cannot run the traded layout (memory included)."""
    declared = declared_plan(config)
    if declared is None:
        return None
    today_cfg = replace(declared.config, dp=dp, pp=pp, layers_per_stage=())
    traded_cfg = replace(today_cfg, dp=dp // 2, pp=2 * pp)
    today = evaluate(declared.model, declared.cluster, today_cfg, declared.global_batch)
    traded = evaluate(declared.model, declared.cluster, traded_cfg, declared.global_batch)
    if today.step is None or traded.step is None or not traded.feasible:
        return None
    return traded.step.total / today.step.total, today.step.total, traded.step.total


def _halved(cost: StageCost, fixed: StageCost) -> StageCost:
    """A stage of half the layers: the fixed part per action stays, the rest halves."""
    weight = None if cost.weight_ns is None else cost.weight_ns / 2
    return StageCost(
        fixed.forward_ns + (cost.forward_ns - fixed.forward_ns) / 2,
        fixed.backward_ns + (cost.backward_ns - fixed.backward_ns) / 2,
        weight,
    )
