"""Memory-pressure fixes for a run that declares its model and cluster, priced by the planner.

The run's config names ``model`` (a planner preset or its fields) and ``cluster`` (a preset like
``a100-80gb-x64``, or {gpu, gpus, gpus_per_node}) and ``global_batch`` beside its parallel layout: every field
``bubblescope plan``'s ``config`` takes (``tp``, ``pp``, ``dp``, ``schedule``, ``zero``, ``recompute``, ``cp``, ``ep``,
``layers_per_stage``...), read as ``plan`` reads them and with its defaults, the collector's ``microbatch_size``,
``virtual_stages`` and ``pipeline_ranks`` (or ``num_stages``) standing for ``mbs``, ``vpp`` and ``pp``. When the
planner puts memory per GPU above 90% of what is usable (or over it), each of ZeRO one stage higher,
each recompute mode that keeps less than the run's (selective, torchtitan's per-op, full), twice the pipeline
stages, twice the context-parallel ranks (each sequence split further, data parallelism halved) and, for a mixture
of experts, twice the expert-parallel ranks is evaluated; those that fit and need less are offered
with the measured step scaled by the planner's ratio new/current (its absolute error cancels).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from bubblescope.analysis.memory_use import StageMemory
from bubblescope.analysis.planner import (
    ClusterSpec,
    ModelSpec,
    ParallelConfig,
    PlanInputError,
    cluster_preset,
    evaluate,
    make_cluster,
    memory_per_pipeline_rank,
    model_from,
    search,
    step_time,
)
from bubblescope.analysis.planner.evaluate import structural_problems
from bubblescope.analysis.planner.request import (
    CONFIG_ALIASES,
    CONFIG_FIELDS,
    config_fields,
    config_from,
    stage_layout,
    with_framework_etp,
)
from bubblescope.analysis.planner.specs import (
    RECOMPUTE,
    as_even,
    fp8_all_gather_problem,
    overlap_param_gather_problem,
    positive_int,
)
from bubblescope.analysis.schedules import DEFAULT_SCHEDULE
from bubblescope.analysis.suggestions import (
    TORCHTITAN_EVEN,
    RunEvidence,
    Suggestion,
    build_suggestion,
    megatron_layer_split,
    megatron_pipeline,
    megatron_recompute,
    megatron_sharding,
    torchtitan_batch,
    torchtitan_layer_split,
    torchtitan_pipeline,
    torchtitan_recompute,
    torchtitan_sharding,
)

PRESSURE = 0.9
#: A layout's switches that act only with tensor parallelism: a re-plan to tp 1 does not list them as changes.
TP_ONLY = ("sequence_parallel", "tp_comm_overlap")
GIB = 2**30


@dataclass(frozen=True)
class DeclaredPlan:
    """The model, cluster and layout a run's config declares, as the planner takes them."""

    model: ModelSpec
    cluster: ClusterSpec
    config: ParallelConfig
    global_batch: int


#: A run config's own names for the planner's fields (the collector's); every other field ``plan``'s ``config`` takes
#: (``request.CONFIG_FIELDS``: ``cp``, ``ep``, ``layers_per_stage``, ``tp_comm_overlap``...) under its own name.
RUN_CONFIG_NAMES = {"microbatch_size": "mbs", "virtual_stages": "vpp", "pipeline_ranks": "pp"}


def declared_plan(config: Mapping[str, Any]) -> DeclaredPlan | None:
    """None where the run did not declare a model and a cluster the planner knows. The layout is read as
    ``bubblescope plan`` reads its ``config`` (``request.config_fields``, with its defaults), so a suggestion prices the
    very configuration ``plan`` would; ``pp`` may come as the run's ``num_stages`` over its stages per rank."""
    try:
        model = model_from(config["model"])
        cluster_spec = config["cluster"]
        cluster = (
            cluster_preset(cluster_spec)
            if isinstance(cluster_spec, str)
            else make_cluster(cluster_spec["gpu"], cluster_spec["gpus"], cluster_spec.get("gpus_per_node", 8))
        )
        fields = with_framework_etp(config_fields(_plan_fields(config)), config)
        if "pp" not in fields and config.get("num_stages") is not None:
            per_rank = fields.get("vpp") or fields.get("schedule", DEFAULT_SCHEDULE).default_stages_per_rank
            fields["pp"] = positive_int(config["num_stages"], "num_stages") // per_rank
            if fields["pp"] < 1:
                return None
        fields = stage_layout(_layers_per_rank(fields), model.layers)
        # torchtitan's flag does nothing without Float8 linears and weights to gather, Megatron's
        # --overlap-param-gather nothing without the distributed optimizer's gather: each kept only where it acts
        wanted = fields.pop("fp8_all_gather", False)
        hidden = fields.pop("overlap_param_gather", False)
        parallel = config_from(fields)
        acts = fp8_all_gather_problem(parallel.precision, parallel.zero) is None
        hides = overlap_param_gather_problem(parallel.zero) is None
        parallel = replace(parallel, fp8_all_gather=wanted and acts, overlap_param_gather=hidden and hides)
        batch = positive_int(config["global_batch"], "global_batch")
        problems = structural_problems(model, cluster, parallel.with_dp(cluster.gpus), batch)
        if any(field not in ("schedule", "vpp") for field, _ in problems):
            return None  # a layout `plan` refuses (stages that do not add up, more stages than layers) prices nothing;
            # a schedule without the planner's closed-form bubble still has its memory predicted
        return DeclaredPlan(model, cluster, parallel, batch)
    except (KeyError, TypeError, ValueError, PlanInputError):  # ScheduleError is a ValueError
        return None


def _layers_per_rank(fields: dict[str, Any]) -> dict[str, Any]:
    """A run's ``layers_per_stage`` counts every (virtual) stage, the planner's every pipeline rank: pp·v counts are
    summed onto the ranks that run them, as the schedule places its stages (looped, or in a V). Only where the counts
    are pp·v for the schedule (v 2 for a V, the given vpp or at least 2 for a looped one, never for one stage a rank);
    any other list is left as given, for the planner to refuse."""
    given, pp = fields.get("layers_per_stage"), fields.get("pp", 1)
    if not given or pp < 2 or len(given) % pp or len(given) == pp:
        return fields
    schedule = fields.get("schedule", DEFAULT_SCHEDULE)
    v = len(given) // pp
    if schedule.placement == "single" or (schedule.placement == "v" and v != 2) or fields.get("vpp", v) != v:
        return fields
    per_rank = [0] * pp
    for stage, count in enumerate(given):
        per_rank[schedule.stage_rank(pp, stage)] += count
    return {**fields, "layers_per_stage": tuple(per_rank), "vpp": v}


def _plan_fields(config: Mapping[str, Any]) -> dict[str, Any]:
    """The run config's planner fields under ``plan``'s names: any case, ``plan``'s aliases (not the one-letter ones,
    which other keys of a run's config may use) and the collector's names; a field given as None is absent, and the
    field's own name wins over an alias."""
    fields: dict[str, Any] = {}
    for key, value in config.items():
        given = str(key).lower()
        alias = CONFIG_ALIASES.get(given) if len(given) > 1 else None
        name = RUN_CONFIG_NAMES.get(given) or alias or given
        if name in CONFIG_FIELDS and value is not None and (name not in fields or given == name):
            fields[name] = value
    return fields


def predicted_memory_per_pipeline_rank(config: Mapping[str, Any]) -> list[float] | None:
    """The planner's bytes per GPU of each pipeline rank for the run's declared model; None if undeclared."""
    declared = declared_plan(config)
    if declared is None:
        return None
    cfg = declared.config.with_dp(declared.cluster.gpus)
    microbatches = declared.global_batch // max(1, cfg.dp * cfg.mbs)
    try:
        per_rank = memory_per_pipeline_rank(declared.model, declared.cluster, cfg, max(1, microbatches))
    except (ValueError, ZeroDivisionError):
        return None
    return [part.total for part in per_rank]


def memory_suggestions(
    config: Mapping[str, Any], step_ns: float, measured: StageMemory | None = None
) -> list[Suggestion]:
    """The planner's memory fixes, when its model of the run, or the stage ``measured`` nearest its
    limit, is at 90% of what may be used or more."""
    declared = declared_plan(config)
    if declared is None:
        return []  # the run did not declare model and cluster: no memory model to price fixes with
    model, cluster, current_config, batch = declared.model, declared.cluster, declared.config, declared.global_batch
    current = evaluate(model, cluster, current_config, batch)
    if current.memory is None:
        return []
    try:  # a run the planner thinks does not fit still ran: price it anyway
        current_step = current.step.total if current.step else step_time(model, cluster, current.config, batch).total
    except (ValueError, ZeroDivisionError):
        return []
    used = current.memory.total / current.memory.available
    measured_fraction = measured.fraction_of_limit if measured is not None else None
    if used < PRESSURE and (measured_fraction is None or measured_fraction < PRESSURE):
        return []
    why = f"the planner puts memory per GPU at {current.memory.total / GIB:.1f} GiB of {current.memory.available / GIB:.1f} GiB usable ({used:.0%})"
    if measured is not None and measured_fraction is not None and measured_fraction >= PRESSURE:
        where = "" if measured.stage is None else f"stage {measured.stage}'s "
        why = (
            f"{where}rank {measured.peak_rank} peaked at {measured.peak_bytes / GIB:.1f} GiB of "
            f"{(measured.limit_bytes or 0) / GIB:.1f} GiB ({measured_fraction:.0%}); {why}"
        )
    evidence = RunEvidence(config=config, step_ns=step_ns)
    out = []
    for title, change, torchtitan, megatron in _candidates(current.config, model):
        plan = evaluate(model, cluster, change, batch)
        if not plan.feasible or not plan.fits or plan.step is None or plan.memory is None:
            continue
        if plan.memory.total >= current.memory.total:  # saves nothing here (selective under flash attention)
            continue
        predicted = step_ns * plan.step.total / current_step
        out.append(
            build_suggestion(
                evidence,
                "memory_pressure",
                predicted,
                plan.step.bubble_fraction,
                title,
                why,
                f"memory per GPU {current.memory.total / GIB:.1f} → {plan.memory.total / GIB:.1f} GiB",
                # a field the change leaves to its default (null: the stages' split) is not one to apply
                {k: v for k, v in change.as_dict().items() if v is not None and current.config.as_dict().get(k) != v},
                None,
                torchtitan,
                megatron,
            )
        )
    if not out:  # no single change fits: the planner's fastest layout that does, with the run's own numerics and code
        kept = (
            "precision",
            "fp8_all_gather",
            "flash_attention",
            "compile",
            "grad_reduce",
            "attention_kernel",
            "dispatcher",
            "cp_comm",
            "kv_repeated",
            "overlap_param_gather",
            "projections",
            "tp_comm_overlap",  # the run's code (async TP, Transformer Engine's overlap); acts only where tp > 1
        )
        runs_own = current.config.as_dict()
        fixed = {field: runs_own[field] for field in kept}
        for plan in search(model, cluster, batch, top=1, fixed=fixed):
            if plan.step is not None and plan.memory is not None:
                out.append(
                    build_suggestion(
                        evidence,
                        "memory_pressure",
                        step_ns * plan.step.total / current_step,
                        plan.step.bubble_fraction,
                        "Re-plan the layout: " + _layout_changes(runs_own, plan.config.as_dict()),
                        f"{why}, and no single change (ZeRO, recompute, more PP, CP or EP) fits and saves memory",
                        f"memory per GPU {current.memory.total / GIB:.1f} → {plan.memory.total / GIB:.1f} GiB",
                        plan.config.as_dict(),
                        None,
                        torchtitan_layout(plan.config, model, batch),
                        megatron_layout(plan.config, model.layers),
                    )
                )
    return out


def torchtitan_layout(config: ParallelConfig, model: ModelSpec, batch: int) -> dict[str, Any]:
    """A whole layout in torchtitan 0.3.0's flags, every field the planner's search sets (a re-planned layout);
    Megatron's selective recompute, which torchtitan has not, is left as the run set it."""
    snippet: dict[str, Any] = {
        "parallelism.tensor_parallel_degree": config.tp,
        "parallelism.context_parallel_degree": config.cp,
    }
    snippet |= torchtitan_sharding(config.dp, config.zero) | torchtitan_batch(config.mbs, config.pp, config.dp, batch)
    snippet |= torchtitan_pipeline(config.pp) | torchtitan_recompute(config.recompute)
    snippet |= torchtitan_stages(config, model.layers)
    if config.tp > 1:
        snippet["parallelism.enable_sequence_parallel"] = config.sequence_parallel
    if acts(config, "tp_comm_overlap") and config.compile:  # torchtitan's async TP runs under torch.compile only
        snippet |= {"compile.enable": True, "compile.enable_async_tensor_parallel": True}
    # torchtitan 0.3.0 has no expert tensor parallelism to set (its experts' tp is 1)
    return snippet | ({"parallelism.expert_parallel_degree": config.ep} if model.moe else {})


def torchtitan_stages(config: ParallelConfig, layers: int) -> dict[str, Any]:
    """A pipeline's schedule and split in torchtitan 0.3.0's flags: each rank's layers (as given, else as even as
    they go) over its ``vpp`` stages, each stage at its index as the schedule places it; torchtitan's own even split
    where that is the planner's (one stage a rank, none given)."""
    if config.pp == 1:
        return {}
    name = config.schedule.torchtitan_name
    snippet: dict[str, Any] = {"parallelism.pipeline_parallel_schedule": name} if name else {}
    if config.vpp == 1 and not config.layers_per_stage:
        return snippet | TORCHTITAN_EVEN  # one stage a rank, none given: torchtitan's own, nothing counted apart
    chunks = [as_even(count, config.vpp) for count in config.stage_layers(layers)]
    virtual = []
    for stage in range(config.pp * config.vpp):
        rank = config.schedule.stage_rank(config.pp, stage)
        virtual.append(chunks[rank][config.schedule.local_stages(rank, config.pp, config.vpp).index(stage)])
    return snippet | torchtitan_layer_split(virtual)


def acts(config: ParallelConfig, switch: str) -> bool:
    """Whether a layout's boolean ``switch`` is on where it acts (``TP_ONLY``'s only with tensor parallelism)."""
    return bool(getattr(config, switch)) and (config.tp > 1 or switch not in TP_ONLY)


def megatron_layout(config: ParallelConfig, layers: int | None = None) -> list[str]:
    """A whole layout in Megatron-LM's flags, every field the planner's search sets (a re-planned layout); a line
    where a rank's layers (its ``layers_per_stage``, else the model's ``layers`` over pp) do not split into its
    virtual stages evenly, which Megatron refuses."""
    stages = config.layers_per_stage or (config.stage_layers(layers) if layers else ())
    unequal = config.vpp > 1 and any(count % config.vpp for count in stages)
    flags = [
        f"--tensor-model-parallel-size {config.tp}",
        f"--pipeline-model-parallel-size {config.pp}",
        f"--micro-batch-size {config.mbs}",
        # the planner's split is per pipeline rank, as Megatron's first/last-stage flags are
        *(megatron_layer_split(config.layers_per_stage) if config.layers_per_stage else []),
        (
            f"(virtual stages of unequal layers, {'/'.join(map(str, stages))} over v = "
            f"{config.vpp}: Megatron-LM needs each rank's layers divisible by v; torchtitan runs them)"
            if unequal
            else ""
        ),
        *megatron_pipeline(config.schedule, config.vpp, None),
        *megatron_sharding(config.zero),
        *megatron_recompute(config.recompute),
        "--sequence-parallel" if acts(config, "sequence_parallel") else "",
        "--tp-comm-overlap" if acts(config, "tp_comm_overlap") else "",
        "--fp8-param-gather" if config.fp8_all_gather else "",
        # Megatron gathers the weights under the forward only with the gradients' reduction overlapped too
        *(["--overlap-grad-reduce", "--overlap-param-gather"] if config.overlap_param_gather else []),
        f"--context-parallel-size {config.cp}" if config.cp > 1 else "",
        f"--expert-model-parallel-size {config.ep}" if config.ep > 1 else "",
        f"--expert-tensor-parallel-size {config.etp}" if config.etp else "",
    ]
    return [flag for flag in flags if flag]


def _layout_changes(now: Mapping[str, Any], then: Mapping[str, Any]) -> str:
    """The fields a re-planned layout changes, each as run → planned (``tp 1 → 8``; a field the run left unset,
    ``etp`` say, as its planned value alone): what an on-call engineer has to change, not the whole layout."""
    moot = TP_ONLY if then.get("tp") == 1 else ()  # switches of tensor parallelism, moot without it
    changed = [(k, now.get(k), v) for k, v in then.items() if v is not None and now.get(k) != v and k not in moot]
    return ", ".join(f"{k} {old} → {new}" if old is not None else f"{k} {new}" for k, old, new in changed)


def _candidates(
    config: ParallelConfig, model: ModelSpec
) -> list[tuple[str, ParallelConfig, dict[str, Any], list[str]]]:
    out: list[tuple[str, ParallelConfig, dict[str, Any], list[str]]] = []
    if config.zero < 3:
        zero = config.zero + 1
        out.append(
            (
                f"Shard optimizer state with ZeRO-{zero}",
                # the weights' gather hidden under the forward stays where the new stage still gathers once a step
                replace(
                    config,
                    zero=zero,
                    overlap_param_gather=config.overlap_param_gather and overlap_param_gather_problem(zero) is None,
                ),
                torchtitan_sharding(config.dp, zero),
                megatron_sharding(zero),
            )
        )
    for mode in RECOMPUTE[RECOMPUTE.index(config.recompute) + 1 :]:  # each keeps less than the one before
        out.append(
            (
                f"Recompute activations ({mode})",
                replace(config, recompute=mode),
                torchtitan_recompute(mode),
                megatron_recompute(mode),
            )
        )
    if config.dp % 2 == 0:
        out.append(
            (
                f"Double pipeline stages to {config.pp * 2} (data parallel {config.dp // 2})",
                replace(config, pp=config.pp * 2, dp=config.dp // 2, layers_per_stage=()),
                torchtitan_pipeline(config.pp * 2),
                [f"--pipeline-model-parallel-size {config.pp * 2}"],
            )
        )
        cp = config.cp * 2  # each rank holds half the sequence's activations; ZeRO still shards over dp·cp ranks
        out.append(
            (
                f"Split each sequence over {cp} context-parallel ranks (data parallel {config.dp // 2})",
                replace(config, cp=cp, dp=config.dp // 2),
                {"parallelism.context_parallel_degree": cp},
                [f"--context-parallel-size {cp}"],
            )
        )
    if model.moe:  # each rank holds half as many experts (``evaluate`` refuses an ep the experts or ranks don't divide)
        ep = config.ep * 2
        out.append(
            (
                f"Spread the experts over {ep} expert-parallel ranks",
                replace(config, ep=ep),
                {"parallelism.expert_parallel_degree": ep},
                [f"--expert-model-parallel-size {ep}"],
            )
        )
    return out
