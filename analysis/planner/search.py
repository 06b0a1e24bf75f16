"""Enumerate configurations, keep the runnable ones, rank them by predicted step time.

The space: t a power of two up to the GPUs of a node dividing the heads; c (context parallel) 1, and for sequences of
16k tokens or more every power of two keeping t·c inside a node; p any divisor of gpus/(t·c) up to the layers, where
it does not split them evenly with the middle stages ceil(L/p) layers each and the first and last the rest
(``two_ended_split``: 126 over 16, 7/8×14/7), said in the plan's layers_per_stage; d the rest; for a mixture of
experts, the experts' own tensor parallelism as t or 1, and e (expert parallel) any divisor of t·d·c over that degree
that divides the experts; micro-batch sizes powers of two dividing the per-replica batch; 1F1B, GPipe and interleaved
1F1B (every v up to 8 and the fewest layers a stage holds that makes the fullest stage's largest chunk smaller than
v − 1 does, ``_virtual_stage_counts``: 12 layers a stage, 2, 3, 4, 6; 9, 2, 3, 5); ZeRO 0–3 (0, 1 and 3 with
pipelining) wherever dp·cp > 1, the ranks it shards over; recompute none, selective, op (torchtitan's per-op), full;
sequence parallelism whenever t > 1 and the sequence splits over c·t (same communication volume, less memory);
flash attention on and bf16 unless fixed otherwise. Any field given in ``fixed`` is held at that value
(``layers_per_stage`` with its ``pp``; TP overlap on the layouts with t > 1).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any, Final

from bubblescope.analysis.planner.efficiencies import Efficiencies
from bubblescope.analysis.planner.evaluate import Plan, evaluate
from bubblescope.analysis.planner.specs import (
    RECOMPUTE,
    ClusterSpec,
    ModelSpec,
    ParallelConfig,
    overlap_param_gather_problem,
    two_ended_split,
)
from bubblescope.analysis.schedules import DEFAULT_SCHEDULE, GPIPE, INTERLEAVED_1F1B, ONE_F_ONE_B, Schedule

MAX_VPP = 8
LONG_SEQUENCE: Final = 16_384
SEARCHED: Final = (ONE_F_ONE_B, INTERLEAVED_1F1B, GPIPE)
"""Schedules the search tries; any other is evaluated when fixed or asked for."""


def _divisors(n: int) -> list[int]:
    """Every divisor of ``n`` in order, in O(sqrt(n)) (a 2^31-GPU cluster would take minutes in O(n))."""
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    return small + [n // k for k in reversed(small) if k * k != n]


def _powers_of_two(limit: int) -> list[int]:
    values, k = [], 1
    while k <= limit:
        values.append(k)
        k *= 2
    return values


def candidates(
    model: ModelSpec, cluster: ClusterSpec, global_batch: int, fixed: Mapping[str, Any] | None = None
) -> Iterator[ParallelConfig]:
    """Every configuration of the space above (not yet checked for memory or schedule rules)."""
    fix = dict(fixed or {})

    def choose(key: str, values: list[Any]) -> list[Any]:
        return [fix[key]] if key in fix else values

    for tp, cp, pp, dp in layouts(model, cluster, fix):
        split = tuple(fix.get("layers_per_stage", ()))  # else the schedule's own (ParallelConfig.stage_layers)
        per_replica = global_batch // dp if global_batch % dp == 0 else 0
        sequence_parallel = fix.get(
            "sequence_parallel", tp > 1 and ParallelConfig(tp=tp, cp=cp).splits_sequence(model.seq)
        )
        for etp, ep, mbs in (
            (x, e, b)
            for x in choose("etp", _expert_tp_degrees(model, tp))
            for e in choose("ep", _expert_degrees(model, tp * cp * dp // (x or tp)))
            for b in choose("mbs", [b for b in _powers_of_two(per_replica) if per_replica % b == 0])
        ):
            for schedule, vpp in _schedules(model, pp, fix, split):
                zeros = [0, 1, 3] if pp > 1 else [0, 1, 2, 3]
                for zero in choose("zero", zeros if dp * cp > 1 else [0]):  # ZeRO shards over dp·cp
                    for recompute in choose("recompute", list(RECOMPUTE)):
                        yield ParallelConfig(
                            tp,
                            pp,
                            dp,
                            vpp,
                            mbs,
                            schedule,
                            zero,
                            recompute,
                            bool(sequence_parallel),  # where each rank's share of the sequence splits over tp
                            bool(fix.get("flash_attention", True)),
                            str(fix.get("precision", "bf16")),
                            split,
                            bool(fix.get("tp_comm_overlap", False)) and tp > 1,  # where there is TP to hide
                            cp,
                            str(fix.get("cp_comm", "p2p")),
                            ep,
                            float(fix.get("capacity_factor", 1.0)),
                            str(fix.get("grad_reduce", "fp32")),
                            bool(fix.get("compile", True)),
                            bool(fix.get("fp8_all_gather", False)),
                            str(fix.get("attention_kernel", "cudnn")),
                            etp,
                            str(fix.get("dispatcher", "alltoall")),
                            bool(fix.get("kv_repeated", False)),
                            # where the layout gathers its weights once a step (ZeRO 1 or 2)
                            bool(fix.get("overlap_param_gather", False)) and overlap_param_gather_problem(zero) is None,
                            str(fix.get("projections", "fused")),
                        )


def layouts(model: ModelSpec, cluster: ClusterSpec, fixed: Mapping[str, Any]) -> Iterator[tuple[int, int, int, int]]:
    """The (tp, cp, pp, dp) degrees the search lays the GPUs out in, whatever the batch."""
    tps = [t for t in _powers_of_two(min(cluster.gpus_per_node, cluster.gpus)) if model.heads % t == 0]
    tps = [fixed["tp"]] if "tp" in fixed else tps
    for tp in tps:
        for cp in [fixed["cp"]] if "cp" in fixed else _context_degrees(model, cluster, tp):
            if cluster.gpus % (tp * cp):
                continue
            pps = [p for p in _divisors(cluster.gpus // (tp * cp)) if _splits(model, p, fixed)]
            for pp in [fixed["pp"]] if "pp" in fixed else pps:
                if cluster.gpus % (tp * cp * pp):
                    continue
                dp = cluster.gpus // (tp * cp * pp)
                if fixed.get("dp", dp) == dp:
                    yield tp, cp, pp, dp


def _splits(model: ModelSpec, pp: int, fix: Mapping[str, Any]) -> bool:
    """Whether the search tries ``pp`` stages: where they split the layers evenly, where the user gave the split, or
    where ``two_ended_split`` gives the first and last stages the rest (a held ``pp`` is tried as given)."""
    if pp > model.layers:
        return False
    return model.layers % pp == 0 or "layers_per_stage" in fix or two_ended_split(model.layers, pp) is not None


def _expert_tp_degrees(model: ModelSpec, tp: int) -> list[int]:
    """The experts' tensor-parallel degrees tried: as tp (0), and for a mixture of experts at tp > 1 also 1 (the two
    torchtitan takes; any other is evaluated when fixed or asked for)."""
    return [0, 1] if model.moe and tp > 1 else [0]


def _expert_degrees(model: ModelSpec, span: int) -> list[int]:
    """Expert-parallel degrees tried: the divisors of the ranks the experts are laid over that divide the experts."""
    return [e for e in _divisors(span) if model.experts % e == 0] if model.moe else [1]


def _context_degrees(model: ModelSpec, cluster: ClusterSpec, tp: int) -> list[int]:
    """Context-parallel degrees tried: 1, and from a sequence of ``LONG_SEQUENCE`` tokens on, the powers of two
    that keep tp·cp inside a node and split the sequence into 2·cp equal chunks (1 whatever the sequence: without
    context parallelism nothing is split)."""
    if model.seq < LONG_SEQUENCE:
        return [1]
    fits = max(1, cluster.gpus_per_node // tp)
    return [cp for cp in _powers_of_two(fits) if cp == 1 or model.seq % (2 * cp) == 0]


def _schedules(
    model: ModelSpec, pp: int, fix: Mapping[str, Any], split: tuple[int, ...] = ()
) -> Iterator[tuple[Schedule, int]]:
    """The schedules tried (``fix``: its ``schedule``, a registry entry), with their stages per rank (``split``: the
    stages' layers where they are uneven)."""
    if pp == 1:
        if pipeline_fields_without_pipeline(fix, pp) is None:  # a held schedule or vpp runs on pipelines alone
            yield fix.get("schedule", DEFAULT_SCHEDULE), 1
        return
    for schedule in [fix["schedule"]] if "schedule" in fix else SEARCHED:
        if schedule.placement != "loop":
            if fix.get("vpp", schedule.default_stages_per_rank) == schedule.default_stages_per_rank:
                yield schedule, schedule.default_stages_per_rank
            continue
        for vpp in [fix["vpp"]] if "vpp" in fix else _virtual_stage_counts(model.layers, pp, schedule, split):
            yield schedule, vpp


def _virtual_stage_counts(layers: int, pp: int, schedule: Schedule, split: tuple[int, ...]) -> list[int]:
    """The v > 1 tried on ``pp`` ranks (``split``: their layers where given, else each v's own default split,
    ``ParallelConfig.stage_layers``): up to ``MAX_VPP`` and a layer a virtual stage on the fewest, each where the
    fullest rank's largest chunk is smaller than at v − 1 (12 layers a rank: 2, 3, 4, 6; 9: 2, 3, 5). The fill and
    drain run at that chunk (``step_time.chunk_imbalance``): a larger v with the same chunk only adds transfers."""
    tried: list[int] = []
    chunk = layers + 1
    for vpp in range(2, MAX_VPP + 1):
        stages = split or ParallelConfig(pp=pp, vpp=vpp, schedule=schedule).stage_layers(layers)
        largest = -(-max(stages) // vpp)
        if min(stages) >= vpp and largest < chunk:
            tried.append(vpp)
            chunk = largest
    return tried


def pipeline_fields_without_pipeline(fields: Mapping[str, Any], pp: int) -> tuple[str, str] | None:
    """(field, why) where a configuration (or a search's fixed fields) asks for a pipeline schedule or virtual stages
    without a pipeline (pp 1), which would otherwise be read as plain gradient accumulation without a word."""
    if pp > 1:
        return None
    if fields.get("vpp", 1) > 1:
        return "vpp", f"vpp={fields['vpp']} virtual stages need a pipeline: give pp ≥ 2"
    schedule = fields.get("schedule")
    if schedule is not None:  # given, 1F1B too: held in a search, it asks for pipelined layouts
        return "schedule", f"{schedule.label} needs a pipeline: give pp ≥ 2 (without one a step accumulates plainly)"
    return None


def rank_key(plan: Plan) -> tuple[float, int, int, float]:
    """Fastest first; among equals the simpler (lower ZeRO stage, less recompute), then less memory. Steps equal to 12
    significant digits are equals: the same seconds summed in another order differ in their last bits."""
    assert plan.step is not None and plan.memory is not None
    step = float(f"{plan.step.total:.12g}")
    return (step, plan.config.zero, RECOMPUTE.index(plan.config.recompute), plan.memory.total)


def search(
    model: ModelSpec,
    cluster: ClusterSpec,
    global_batch: int,
    top: int = 10,
    fixed: Mapping[str, Any] | None = None,
    eff: Efficiencies | None = None,
) -> list[Plan]:
    """The ``top`` fastest configurations that run and fit in memory, fastest first."""
    runnable = [
        plan
        for plan in (
            evaluate(model, cluster, cfg, global_batch, eff) for cfg in candidates(model, cluster, global_batch, fixed)
        )
        if plan.feasible
    ]
    runnable.sort(key=rank_key)
    return runnable[:top]
