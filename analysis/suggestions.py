"""Ranked fixes for a measured run, each with its evidence, predicted step time and the concrete change.

Every pipeline fix is priced by replaying the run with the change (``whatif.predict``); fixes
outside the pipeline (overlap, TP placement, stragglers, memory) by removing the measured time they
address. Each suggestion carries ``apply`` — the run-config keys that change (what a re-run uses) —
and the change in the user's terms: torch.distributed.pipelining, torchtitan and Megatron-LM.
Rules (thresholds are fractions of the measured step):
- naive layer-wise model parallelism → pipeline it (1F1B) with m = p micro-batches (more, priced
  from the pipelined run once it is measured);
- bubble > 5% above the closed-form floor of a pipelined run → more micro-batches (same global
  batch), interleaving, zero-bubble schedules — each with its activations in flight;
- a stage ≥ 10% costlier than the mean → move layers (when the run reports layers per stage);
- exposed data-parallel communication ≥ 5% → overlap it with backward / larger buckets / accumulation;
- a TP group spread over hosts → keep TP inside the node, pipeline across nodes;
- a persistent straggler → drain its host;
- memory (from the planner, when the run declares model and cluster) → ZeRO, recompute, more PP.
Fixes the replay predicts to save under 1% of the step are dropped (memory fixes stay: they may cost time).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bubblescope.analysis.attribution import BubbleAttribution, StageImbalance
from bubblescope.analysis.pipeline_profile import MeasuredPipeline
from bubblescope.analysis.schedules import (
    INTERLEAVED_1F1B,
    INTERLEAVED_ZERO_BUBBLE,
    LOOPED_BFS,
    NAIVE,
    ONE_F_ONE_B,
    ZBV,
    Schedule,
    lookup,
)
from bubblescope.analysis.whatif import Change, Prediction, predict

BUBBLE_MARGIN = 0.05
IMBALANCE_MARGIN = 0.10
EXPOSED_COMM_MARGIN = 0.05
DP_GROUPS = ("dp", "ddp", "fsdp")  # the group labels of data-parallel gradient communication
MIN_GAIN = 0.01  # fixes predicted to save less than this share of the step are not offered


@dataclass(frozen=True)
class StragglerNote:
    """A persistent slow rank, as the straggler analysis found it."""

    rank: int
    host: str | None
    slowdown: float  # its busy time / its peers' median
    message: str


@dataclass(frozen=True)
class RunEvidence:
    config: Mapping[str, Any]
    step_ns: float
    measured: MeasuredPipeline | None = None
    attribution: BubbleAttribution | None = None
    imbalance: StageImbalance | None = None
    exposed_comm_ns: Mapping[str, float] = field(default_factory=dict)  # mean per rank, by group label
    tp_hosts_per_group: int = 1
    stragglers: Sequence[StragglerNote] = ()
    memory_notes: Sequence[Suggestion] = ()
    layout_notes: Sequence[Suggestion] = ()  # priced by layout_fixes (it builds on this evidence)


@dataclass(frozen=True)
class Suggestion:
    kind: str
    title: str
    evidence: str
    current_step_ns: float
    predicted_step_ns: float
    predicted_bubble_fraction: float | None
    gain_fraction: float
    memory_cost: str
    apply: dict[str, Any]
    torch_pipelining: str | None
    torchtitan: dict[str, Any]
    megatron: list[str]
    gain_half_width_ns: float = 0.0  # the 95% interval of the gain: +- this (``gain_noise``)
    within_noise: bool = False  # the gain does not clear that interval: listed, not a call to act


def suggest(evidence: RunEvidence) -> list[Suggestion]:
    found: list[Suggestion] = []
    if evidence.measured is not None:
        found += _pipeline_fixes(evidence, evidence.measured)
    found += _communication_fixes(evidence)
    found += _straggler_fixes(evidence)
    found += list(evidence.memory_notes)
    found += list(evidence.layout_notes)
    worthwhile = [s for s in found if s.gain_fraction >= MIN_GAIN or s.kind == "memory_pressure"]
    return sorted(worthwhile, key=lambda s: s.gain_fraction, reverse=True)


def _pipeline_fixes(evidence: RunEvidence, measured: MeasuredPipeline) -> list[Suggestion]:
    setup = measured.setup
    if lookup(setup.schedule) is NAIVE and setup.ranks > 1:
        return _pipeline_a_naive_split(evidence, measured)
    out: list[Suggestion] = []
    attribution = evidence.attribution
    if attribution is not None and attribution.closed_form_fraction is not None:
        above = attribution.measured_bubble_fraction - attribution.closed_form_fraction
        if above > BUBBLE_MARGIN or attribution.measured_bubble_fraction > 0.15:
            out += _more_microbatches_or_better_schedule(evidence, measured)
    if evidence.imbalance is not None:
        out += _rebalance(evidence, evidence.imbalance)
    return out


def _pipeline_a_naive_split(evidence: RunEvidence, measured: MeasuredPipeline) -> list[Suggestion]:
    """Pipeline with m = p micro-batches: the step that removes most of the idle time.

    More micro-batches shrink the bubble further, but a layer-wise run cannot tell how much of an
    action is fixed cost (equal layers per stage) nor how ranks that now compute at once slow each
    other on a shared host; once the pipelined run is measured, "raise micro-batches" is priced
    from it.
    """
    p = measured.setup.ranks
    batch = _batch(evidence.config, measured)
    m = p
    if batch is not None and (batch % m or batch // m < 1):
        return []
    best = predict(measured, Change(schedule=ONE_F_ONE_B.name, microbatches=m, microbatch_scale=1 / m))
    micro = batch // m if batch else None
    return [
        _suggestion(
            evidence,
            "pipeline_naive_split",
            best,
            title=f"Pipeline the layer-wise split: 1F1B with {m} micro-batches",
            why=(
                f"naive model parallelism over {p} ranks: each rank idles while the others compute "
                f"(measured bubble {_pct(evidence.attribution.measured_bubble_fraction if evidence.attribution else None)}, "
                f"floor (p-1)/p = {(p - 1) / p:.0%})"
            ),
            memory=f"activations in flight: {best.peak_activations} micro-batches of 1/{m} of the batch "
            f"= {best.peak_activations / m:.2f}× today's single full-batch activation per stage",
            apply={
                "schedule": ONE_F_ONE_B.name,
                "num_microbatches": m,
                **({"microbatch_size": micro} if micro else {}),
            },
        )
    ]


def _more_microbatches_or_better_schedule(evidence: RunEvidence, measured: MeasuredPipeline) -> list[Suggestion]:
    setup = measured.setup
    batch = _batch(evidence.config, measured)
    now_peak = predict(measured, Change()).peak_activations
    out = []
    current = lookup(setup.schedule)
    for factor in (2, 4):
        m = setup.microbatches * factor
        if (batch is not None and batch % m) or current.shape_problem(setup.ranks, m, setup.stages_per_rank):
            continue  # the global batch does not split so, or the schedule refuses that many
        prediction = predict(measured, Change(microbatches=m, microbatch_scale=1 / factor))
        out.append(
            _suggestion(
                evidence,
                "more_microbatches",
                prediction,
                title=f"Raise micro-batches from {setup.microbatches} to {m} (same global batch)",
                why=_bubble_evidence(evidence),
                memory=_activation_memory(prediction, now_peak, 1 / factor),
                apply={"num_microbatches": m, **({"microbatch_size": batch // m} if batch else {})},
            )
        )
    today = predict(measured, Change())
    for schedule in (INTERLEAVED_1F1B, INTERLEAVED_ZERO_BUBBLE, ZBV):
        if schedule is current:
            continue
        try:
            prediction = predict(measured, Change(schedule=schedule.name, stages_per_rank=2))
        except ValueError:
            continue
        # The replay re-cuts the layers into p·v stages of equal cost: the split is part of the change
        layers = list(prediction.layers_per_stage) if prediction.layers_per_stage is not None else None
        split = f", layers per stage {','.join(map(str, layers))}" if layers else ""
        out.append(
            _suggestion(
                evidence,
                "better_schedule",
                prediction,
                title=f"Switch to {schedule.label} ({prediction.stages_per_rank} stages per rank{split})",
                why=f"{_bubble_evidence(evidence)}; {_schedule_reason(measured, today, prediction)}",
                memory=_activation_memory(prediction, now_peak, 1 / prediction.stages_per_rank),
                apply={
                    "schedule": schedule.name,
                    "virtual_stages": prediction.stages_per_rank,
                    **({"layers_per_stage": layers} if layers else {}),
                },
            )
        )
    return out


def _rebalance(evidence: RunEvidence, imbalance: StageImbalance) -> list[Suggestion]:
    measured = evidence.measured
    if measured is None or imbalance.slowest_excess < IMBALANCE_MARGIN or not imbalance.moves:
        return []
    assert imbalance.balanced_layers is not None
    prediction = predict(measured, Change(layers_per_stage=imbalance.balanced_layers))
    moves = "; ".join(
        f"move {m.layers} layer{'s' if m.layers > 1 else ''} from stage {m.from_stage} to stage {m.to_stage}"
        for m in imbalance.moves
    )
    return [
        _suggestion(
            evidence,
            "rebalance_stages",
            prediction,
            title=f"Rebalance stages: {moves}",
            why=(
                f"stage {imbalance.slowest_stage} costs {imbalance.stage_cost_ns[imbalance.slowest_stage] / 1e6:.1f} ms per "
                f"micro-batch, {imbalance.slowest_excess:.0%} ({imbalance.excess_ns / 1e6:.1f} ms) above the mean stage; "
                f"layers now {list(imbalance.layers_per_stage or ())}"
                + _balanced_bound(imbalance, measured.stage_layers is not None)
            ),
            memory="per-stage weights and activations follow the moved layers; the total is unchanged",
            apply={"layers_per_stage": list(imbalance.balanced_layers)},
        )
    ]


def _balanced_bound(imbalance: StageImbalance, layers_timed: bool) -> str:
    """What the moved layers should leave: the slowest stage's predicted excess over the mean."""
    if imbalance.balanced_excess is None:
        return ""
    basis = (
        "each layer at its timed cost and each stage keeping its own work (loss, head, embedding)"
        if layers_timed
        else "each stage's cost spread evenly over its layers"
    )
    return (
        f"; after the move the slowest stage is predicted {imbalance.balanced_excess:.0%} above the mean, with {basis}"
    )


def _communication_fixes(evidence: RunEvidence) -> list[Suggestion]:
    out = []
    step = evidence.step_ns
    dp = sum(evidence.exposed_comm_ns.get(group, 0.0) for group in DP_GROUPS)
    if step and dp / step >= EXPOSED_COMM_MARGIN:
        out.append(
            _plain(
                evidence,
                "overlap_dp_communication",
                step - dp,
                title="Overlap data-parallel gradient communication with the backward pass",
                why=f"exposed data-parallel communication is {dp / 1e6:.1f} ms per step ({dp / step:.0%} of the step)",
                memory="larger buckets hold more gradient copies in flight (bucket size × 2)",
                apply={"overlap_dp_communication": True},
                torchtitan={
                    "training.global_batch_size": "raise: more local batches accumulate per gradient reduction"
                },
                megatron=["--overlap-grad-reduce", "--overlap-param-gather", "--ddp-bucket-size <bytes>"],
                torch="DDP(model, bucket_cap_mb=...) / fully_shard(..., reshard_after_forward=False); no_sync() for accumulation",
            )
        )
    tp = evidence.exposed_comm_ns.get("tp", 0.0)
    if evidence.tp_hosts_per_group > 1 and tp > 0:
        saved = (
            tp * 0.85
        )  # NVLink moves ~8x what a node's network does (planner catalog); assume most of TP's time goes
        out.append(
            _plain(
                evidence,
                "tp_inside_node",
                step - saved,
                title="Keep tensor parallelism inside a node; pipeline across nodes",
                why=f"each TP group spans {evidence.tp_hosts_per_group} hosts; exposed TP communication {tp / 1e6:.1f} ms per step",
                memory="unchanged if t·p stays the same",
                apply={"tp_within_node": True},
                torchtitan={"parallelism.tensor_parallel_degree": "≤ GPUs per node"} | torchtitan_pipeline("nodes"),
                megatron=["--tensor-model-parallel-size <≤ GPUs per node>", "--pipeline-model-parallel-size <nodes>"],
                torch="init_device_mesh('cuda', (pp, dp, tp), mesh_dim_names=('pp','dp','tp')) with tp innermost",
            )
        )
    return out


def _straggler_fixes(evidence: RunEvidence) -> list[Suggestion]:
    out = []
    for note in evidence.stragglers:
        if note.slowdown <= 1.0:
            continue
        # A persistent straggler sets everyone's pace (they wait for it at each synchronisation):
        # at its peers' speed the step shrinks by its slowdown — an upper bound of the gain.
        out.append(
            _plain(
                evidence,
                "drain_straggler",
                evidence.step_ns / note.slowdown,
                title=f"Drain host {note.host or '?'} (rank {note.rank} is a persistent straggler)",
                why=note.message,
                memory="none",
                apply={"exclude_hosts": [note.host] if note.host else []},
                torchtitan={},
                megatron=[],
                torch="restart the job without the host (torchrun --rdzv with the remaining nodes)",
            )
        )
    return out


def _suggestion(
    evidence: RunEvidence,
    kind: str,
    prediction: Prediction,
    *,
    title: str,
    why: str,
    memory: str,
    apply: dict[str, Any],
) -> Suggestion:
    schedule = lookup(prediction.schedule)
    torchtitan: dict[str, Any] = {"parallelism.pipeline_parallel_schedule": schedule.torchtitan_name}
    megatron = [f"--pipeline-model-parallel-size {len(prediction.result.idle_ns)}"]
    if "microbatch_size" in apply:
        torchtitan["parallelism.pipeline_parallel_microbatch_size"] = apply["microbatch_size"]
        megatron.append(f"--micro-batch-size {apply['microbatch_size']}")
    split = prediction.layers_per_stage if "layers_per_stage" in apply else None
    if split is not None:
        torchtitan.update(torchtitan_layer_split(split))
    megatron += megatron_pipeline(schedule, prediction.stages_per_rank, split, prediction.microbatches)
    args = f"n_microbatches={prediction.microbatches}, loss_fn=loss_fn"
    stage_arg = "stages" if prediction.stages_per_rank > 1 else "stage"
    torch = f"torch.distributed.pipelining.{schedule.torch_class}({stage_arg}, {args})"
    return build_suggestion(
        evidence,
        kind,
        prediction.step_ns,
        prediction.bubble_fraction,
        title,
        why,
        memory,
        apply,
        torch,
        torchtitan,
        megatron,
    )


def megatron_pipeline(
    schedule: Schedule, stages_per_rank: int, layers_per_stage: Sequence[int] | None, microbatches: int | None = None
) -> list[str]:
    """A schedule's stages per rank and a layer split (None: Megatron's even one) in Megatron-LM's flags, beside
    ``--pipeline-model-parallel-size``; a line saying so where Megatron has none. Looped BFS is Megatron's interleaved
    schedule run breadth-first: with ``microbatch_group_size_per_vp_stage`` the step's micro-batches (its default, the
    pipeline's size, is depth-first) a rank warms up every virtual stage but its last over all of them, then runs 1F1B
    (``megatron/core/pipeline_parallel/schedules.py``, ``get_schedule_table``)."""
    flags = []
    if layers_per_stage is not None:
        if stages_per_rank == 1:
            flags += megatron_layer_split(layers_per_stage)
        else:  # Megatron's first/last-stage flags are per pipeline rank, not per virtual stage
            flags.append(
                f"(layers per virtual stage {','.join(map(str, layers_per_stage))}: no Megatron-LM flags give it)"
            )
    if stages_per_rank == 1 and schedule not in (ONE_F_ONE_B, NAIVE):
        flags.append(f"(Megatron-LM runs 1F1B: it has no {schedule.torchtitan_name or schedule.name} schedule flag)")
    if stages_per_rank > 1:
        if schedule not in (INTERLEAVED_1F1B, LOOPED_BFS):
            flags.append("(Megatron-LM core has no zero-bubble/V schedule flag: use torch.distributed.pipelining)")
            return flags
        flags.append(f"--num-virtual-stages-per-pipeline-rank {stages_per_rank}")
        if schedule is LOOPED_BFS:
            group = "--microbatch-group-size-per-virtual-pipeline-stage"
            flags.append(f"({group}: the step's micro-batches)" if microbatches is None else f"{group} {microbatches}")
    return flags


#: Megatron-FSDP's sharding strategy per ZeRO stage past the distributed optimizer's (``--data-parallel-sharding-strategy``)
MEGATRON_FSDP_SHARDING = {2: "optim_grads", 3: "optim_grads_params"}


def megatron_sharding(zero: int) -> list[str]:
    """A ZeRO stage in Megatron-LM's flags: its distributed optimizer shards the optimizer state (1); Megatron-FSDP
    the gradients too (2) and the weights (3)."""
    if zero == 0:
        return []
    if zero == 1:
        return ["--use-distributed-optimizer"]
    return ["--use-megatron-fsdp", f"--data-parallel-sharding-strategy {MEGATRON_FSDP_SHARDING[zero]}"]


def megatron_recompute(mode: str) -> list[str]:
    """A recompute mode in Megatron-LM's flags: ``selective`` and ``full`` are its granularities; per-op is
    torchtitan's."""
    if mode in ("selective", "full"):
        return [f"--recompute-granularity {mode}"]
    return ["(per-op checkpointing is torchtitan's; Megatron-LM has no flag for it)"] if mode == "op" else []


#: torchtitan 0.3.0's activation checkpointing is a choice on its command line (``activation-checkpoint:full``, a
#: subcommand: a key with a colon is given bare, without the dashes of a flag, after the flags), per recompute mode;
#: Megatron's ``selective`` (the attention core alone) has none.
TORCHTITAN_RECOMPUTE = {
    "none": "activation-checkpoint:none",
    "op": "activation-checkpoint:selective",
    "full": "activation-checkpoint:full",
}


def torchtitan_recompute(mode: str) -> dict[str, Any]:
    """A recompute mode in torchtitan's terms (``TORCHTITAN_RECOMPUTE``); empty where torchtitan has none."""
    return {TORCHTITAN_RECOMPUTE[mode]: True} if mode in TORCHTITAN_RECOMPUTE else {}


def torchtitan_sharding(dp: int, zero: int) -> dict[str, Any]:
    """``dp`` data-parallel ranks at a ZeRO stage in torchtitan's terms: replicas for 0; else FSDP over all of them
    (``data_parallel_shard_degree``), which keeps its gathered weights to the backward for ZeRO 1 and 2
    (``fsdp_reshard_after_forward never``: torchtitan shards no optimizer state without the weights) and gathers
    them again for ZeRO 3."""
    if zero == 0:
        return {"parallelism.data_parallel_replicate_degree": dp, "parallelism.data_parallel_shard_degree": 1}
    sharded = {"parallelism.data_parallel_replicate_degree": 1, "parallelism.data_parallel_shard_degree": dp}
    return sharded | ({"parallelism.fsdp_reshard_after_forward": "never"} if zero < 3 else {})


def torchtitan_batch(mbs: int, pp: int, dp: int, global_batch: int) -> dict[str, Any]:
    """A micro-batch of ``mbs`` sequences in torchtitan's terms, the global batch kept: with a pipeline, its
    micro-batch size over a local batch of the replica's whole share (one flush a step); without one, the local
    batch, accumulated to the global batch."""
    if pp > 1:
        return {"parallelism.pipeline_parallel_microbatch_size": mbs, "training.local_batch_size": global_batch // dp}
    return {"training.local_batch_size": mbs, "training.global_batch_size": global_batch}


def torchtitan_pipeline(pp: int | str) -> dict[str, Any]:
    """Pipeline parallelism of ``pp`` ranks in torchtitan's terms: torchtitan 0.3.0 refuses a pipeline with its CUDA
    graphs on ("CUDA graphs do not support pipeline parallelism yet"), so they are turned off with it (not for one
    stage, no pipeline)."""
    if pp == 1:
        return {"parallelism.pipeline_parallel_degree": 1}
    return {"parallelism.pipeline_parallel_degree": pp, "training.disable_cuda_graphs": True}


#: torchtitan 0.3.0 counts the embedding and the output as a layer each by default
#: (``pipeline_parallel_first/last_stage_less_layers`` 1), so 4 layers at 2 a stage make 3 stages; counted as none,
#: its split is the planner's where the stages divide the layers (``ParallelConfig.stage_layers``).
TORCHTITAN_EVEN = {
    "parallelism.pipeline_parallel_first_stage_less_layers": 0,
    "parallelism.pipeline_parallel_last_stage_less_layers": 0,
}


def torchtitan_layer_split(layers_per_stage: Sequence[int]) -> dict[str, Any]:
    """A layer split in torchtitan's terms: ``pipeline_parallel_layers_per_stage`` (one int) when
    every stage has as many layers, with the embedding and the output counted as no layer (``TORCHTITAN_EVEN``),
    else ``module_fqns_per_model_part`` (each stage's module names, torchtitan 0.3.0's llama3 naming: the
    embedding with the first stage, norm and lm_head with the last; set in the job's config function, as
    torchtitan's command line cannot spell a list of lists)."""
    if len(set(layers_per_stage)) == 1:
        return {"parallelism.pipeline_parallel_layers_per_stage": layers_per_stage[0]} | TORCHTITAN_EVEN
    parts: list[list[str]] = []
    first = 0
    for count in layers_per_stage:
        parts.append([f"layers.{index}" for index in range(first, first + count)])
        first += count
    parts[0].insert(0, "tok_embeddings")
    parts[-1] += ["norm", "lm_head"]
    return {"parallelism.module_fqns_per_model_part": parts}


def megatron_layer_split(layers_per_stage: Sequence[int]) -> list[str]:
    """A layer split in Megatron-LM's flags. ``--decoder-first/last-pipeline-num-layers`` set the first and last
    stage's layers, and Megatron splits the rest evenly over the stages between (it refuses a remainder): a
    split whose middle stages differ has no such flags, and the line says so instead of flags that would give
    another split."""
    layers = list(layers_per_stage)
    if len(layers) < 2:
        return []
    middle = layers[1:-1]
    if len(set(middle)) > 1:
        return [
            f"(Megatron-LM's --decoder-first/last-pipeline-num-layers split the middle stages evenly: they cannot "
            f"give {','.join(map(str, layers))}; use torch.distributed.pipelining or torchtitan for it)"
        ]
    flags = []
    if len(layers) == 2 or layers[0] != (middle[0] if middle else None):
        flags.append(f"--decoder-first-pipeline-num-layers {layers[0]}")
    if len(layers) == 2 or layers[-1] != (middle[0] if middle else None):
        flags.append(f"--decoder-last-pipeline-num-layers {layers[-1]}")
    return flags or [f"--num-layers {sum(layers)}"]


def _plain(
    evidence: RunEvidence,
    kind: str,
    predicted_ns: float,
    *,
    title: str,
    why: str,
    memory: str,
    apply: dict[str, Any],
    torchtitan: dict[str, Any],
    megatron: list[str],
    torch: str,
) -> Suggestion:
    return build_suggestion(evidence, kind, predicted_ns, None, title, why, memory, apply, torch, torchtitan, megatron)


def build_suggestion(
    evidence: RunEvidence,
    kind: str,
    predicted_ns: float,
    bubble: float | None,
    title: str,
    why: str,
    memory: str,
    apply: dict[str, Any],
    torch: str | None,
    torchtitan: dict[str, Any],
    megatron: list[str],
) -> Suggestion:
    step = evidence.step_ns
    return Suggestion(
        kind=kind,
        title=title,
        evidence=why,
        current_step_ns=step,
        predicted_step_ns=predicted_ns,
        predicted_bubble_fraction=bubble,
        gain_fraction=(step - predicted_ns) / step if step else 0.0,
        memory_cost=memory,
        apply=apply,
        torch_pipelining=torch,
        torchtitan=torchtitan,
        megatron=megatron,
    )


def _bubble_evidence(evidence: RunEvidence) -> str:
    a = evidence.attribution
    if a is None:
        return "pipeline bubble above the schedule's floor"
    return (
        f"measured bubble {a.measured_bubble_fraction:.1%} of the step; closed-form floor "
        f"{_pct(a.closed_form_fraction)} ({a.closed_form_formula}); simulated floor {a.simulated_floor_fraction:.1%}"
    )


def _schedule_reason(measured: MeasuredPipeline, today: Prediction, other: Prediction) -> str:
    """Why the replay prefers (or not) another schedule: its idle time and its count of actions, each
    paying the runtime's fitted cost per action (zero-bubble schedules split every backward in two)."""
    setup = measured.setup

    def actions(prediction: Prediction) -> int:
        orders = lookup(prediction.schedule).build_orders(
            setup.ranks, prediction.microbatches, prediction.stages_per_rank
        )
        return max(len(order) for order in orders.values())

    now_idle = sum(today.result.idle_ns) / len(today.result.idle_ns)
    new_idle = sum(other.result.idle_ns) / len(other.result.idle_ns)
    return (
        f"replayed with this run's stage costs, {lookup(other.schedule).label} idles {new_idle / 1e6:.1f} ms a rank "
        f"against {now_idle / 1e6:.1f} ms under {lookup(today.schedule).label}, and runs {actions(other)} actions a rank "
        f"against {actions(today)}, each paying the pipelining runtime's fitted {setup.action_overhead_ns / 1e6:.2f} ms"
    )


def _activation_memory(prediction: Prediction, now_peak: int, chunk_size: float) -> str:
    relative = prediction.peak_activations * chunk_size / now_peak if now_peak else 0.0
    return (
        f"activations in flight on the busiest rank: {prediction.peak_activations} chunks "
        f"of {chunk_size:.2g}× today's size = {relative:.2f}× today's peak ({now_peak} chunks)"
    )


def _batch(config: Mapping[str, Any], measured: MeasuredPipeline) -> int | None:
    micro = config.get("microbatch_size")
    if isinstance(micro, int) and micro > 0:
        return micro * measured.setup.microbatches
    total = config.get("global_batch")
    return total if isinstance(total, int) and total > 0 else None


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:.1%}"
