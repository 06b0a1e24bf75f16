"""One configuration judged: memory by part, step time, MFU, bubble, and whether it can run."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from bubblescope.analysis.planner.efficiencies import Efficiencies
from bubblescope.analysis.planner.memory import GIB, MemoryBreakdown, memory_per_gpu
from bubblescope.analysis.planner.specs import (
    CHOICES,
    ClusterSpec,
    ModelSpec,
    ParallelConfig,
    fp8_all_gather_problem,
    overlap_param_gather_problem,
)
from bubblescope.analysis.planner.step_time import StepTime, step_time
from bubblescope.analysis.schedules import DEFAULT_SCHEDULE, INTERLEAVED_1F1B


@dataclass(frozen=True)
class Plan:
    """A configuration with its predicted cost. ``problems`` lists why it cannot run (empty if it can);
    ``fits`` is the memory verdict alone. ``step`` is None when the configuration is not runnable."""

    config: ParallelConfig
    memory: MemoryBreakdown | None
    step: StepTime | None
    mfu: float | None
    problems: tuple[str, ...]

    @property
    def fits(self) -> bool:
        return self.memory is not None and self.memory.fits

    @property
    def feasible(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        """The machine-readable shape the CLI (``--json``) and the API print."""
        step = self.step
        memory = self.memory
        return {
            "config": self.config.as_dict(),
            "feasible": self.feasible,
            "fits": self.fits,
            "problems": list(self.problems),
            "step_time_s": None if step is None else step.total,
            "mfu": self.mfu,
            "bubble_fraction": None if step is None else step.bubble_fraction,
            "microbatches": None if step is None else step.microbatches,
            "memory_gib_per_gpu": None if memory is None else memory.total / GIB,
            "memory_gib": None if memory is None else {**memory.gib(), "available": memory.available / GIB},
            "step_time_parts_s": None
            if step is None
            else {
                "compute": step.compute,
                "recompute": step.recompute,
                "tp_comm": step.tp_comm,
                "cp_comm": step.cp_comm,
                "ep_comm": step.ep_comm,
                "straggler": step.straggler,
                "pp_comm": step.pp_comm,
                "bubble": step.bubble,
                "dp_comm": step.dp_comm,
                "optimizer": step.optimizer,
            },
        }


def model_flops_per_step(model: ModelSpec, global_batch: int) -> float:
    """Training FLOPs without recompute (docs/planner.md): tokens · (6·N + 12·L·q·s), N the parameters a token
    passes through (a mixture of experts' active ones), q the queries' width (heads · head_dim: the hidden size unless
    the model sets its heads apart)."""
    tokens = global_batch * model.seq
    return tokens * (6.0 * model.active_params + 12.0 * model.layers * model.q_dim * model.seq)


def _expert_layout_problem(cfg: ParallelConfig) -> str:
    """Why the expert layers' etp × ep × replicas does not tile a stage's tp·cp·dp ranks (Megatron's rule)."""
    if not cfg.etp:
        return (
            f"ep={cfg.ep} does not divide dp·cp = {cfg.replicas}: expert ranks come from them "
            f"(or from tp too with etp below tp: ep·etp must divide tp·dp·cp = {cfg.tp * cfg.replicas})"
        )
    return (
        f"ep·etp = {cfg.ep}·{cfg.etp} does not divide tp·dp·cp = {cfg.tp * cfg.replicas}: expert ranks come from them"
    )


def structural_problems(
    model: ModelSpec, cluster: ClusterSpec, cfg: ParallelConfig, global_batch: int
) -> list[tuple[str, str]]:
    """(config field, why) for everything that stops a configuration from running, memory aside;
    ``cfg.dp`` is resolved."""
    problems: list[tuple[str, str]] = []
    if model.heads % cfg.tp:
        problems.append(("tp", f"tp={cfg.tp} does not divide the {model.heads} attention heads"))
    elif cfg.tp > model.kv_heads and cfg.tp % model.kv_heads:
        problems.append(("tp", f"tp={cfg.tp} does not split the {model.kv_heads} KV heads evenly"))
    if cfg.pp > model.layers:
        problems.append(("pp", f"pp={cfg.pp} exceeds the {model.layers} layers"))
    if cluster.gpus % (cfg.tp * cfg.cp * cfg.pp):  # no whole number of replicas, whatever dp is
        field = "tp" if cluster.gpus % cfg.tp else "cp" if cluster.gpus % (cfg.tp * cfg.cp) else "pp"
        problems.append(
            (field, f"tp·cp·pp = {cfg.tp}·{cfg.cp}·{cfg.pp} does not divide the {cluster.gpus} GPUs of the cluster")
        )
    elif cfg.tp * cfg.cp * cfg.pp * cfg.dp != cluster.gpus:
        problems.append(
            ("dp", f"tp·cp·pp·dp = {cfg.tp}·{cfg.cp}·{cfg.pp}·{cfg.dp} is not the {cluster.gpus} GPUs of the cluster")
        )
    if cfg.ep > 1 and not model.moe:
        problems.append(("ep", "expert parallelism needs a mixture of experts (model.experts > 0)"))
    elif cfg.ep > 1 and model.experts % cfg.ep:
        problems.append(("ep", f"ep={cfg.ep} does not divide the {model.experts} experts"))
    elif cfg.dp >= 1 and cfg.tp * cfg.replicas % (cfg.ep * cfg.expert_tp):
        problems.append(("ep", _expert_layout_problem(cfg)))
    if cfg.etp and not model.moe:
        problems.append(("etp", "expert tensor parallelism needs a mixture of experts (model.experts > 0)"))
    elif cfg.etp > cfg.tp:
        problems.append(("etp", f"etp={cfg.etp} above tp={cfg.tp} is not modelled (experts split finer than the rest)"))
    elif model.moe and model.moe_ffn_hidden % cfg.expert_tp:
        problems.append(("etp", f"etp={cfg.expert_tp} does not divide the experts' width {model.moe_ffn_hidden}"))
    if not 0 < cfg.capacity_factor <= 16:
        problems.append(("capacity_factor", f"must be above 0 and at most 16, got {cfg.capacity_factor}"))
    if cfg.cp > 1 and model.seq % (2 * cfg.cp):
        problems.append(
            ("cp", f"sequence {model.seq} does not split into 2·cp = {2 * cfg.cp} equal chunks (causal load balance)")
        )
    if global_batch % cfg.mbs:
        problems.append(("mbs", f"global batch {global_batch} is not divisible by mbs = {cfg.mbs}"))
        return problems
    if cfg.dp < 1 or global_batch % (cfg.dp * cfg.mbs):
        problems.append(("mbs", f"global batch {global_batch} is not divisible by dp·mbs = {cfg.dp}·{cfg.mbs}"))
        return problems
    if cfg.sequence_parallel and cfg.tp > 1 and not cfg.splits_sequence(model.seq):
        problems.append(
            (
                "sequence_parallel",
                f"sequence {model.seq} does not split over cp·tp = {cfg.cp}·{cfg.tp} ranks (sequence parallelism "
                "scatters each rank's share of it over tp)",
            )
        )
    for field, words in CHOICES.items():
        value = getattr(cfg, field)
        if value not in words:
            problems.append((field, f"must be one of {', '.join(words)}, got {value!r}"))
    if cfg.zero not in (0, 1, 2, 3):
        problems.append(("zero", f"must be 0, 1, 2 or 3, got {cfg.zero}"))
    elif cfg.zero == 2 and cfg.pp > 1:
        problems.append(
            (
                "zero",
                "ZeRO-2 shards gradients that pipeline parallelism accumulates over micro-batches; use zero ≤ 1, "
                "or 3 (FSDP as torchtitan runs it with a pipeline: weights and gradients whole during the step)",
            )
        )
    if cfg.sequence_parallel and cfg.tp == 1:
        problems.append(("sequence_parallel", "sequence parallelism needs tp > 1"))
    if cfg.precision == "fp8" and not cluster.gpu.fp8_tflops:
        problems.append(("precision", f"{cluster.gpu.name} has no FP8 tensor cores; use bf16"))
    fp8_gathers = fp8_all_gather_problem(cfg.precision, cfg.zero) if cfg.fp8_all_gather else None
    if fp8_gathers:
        problems.append(("fp8_all_gather", fp8_gathers))
    hidden_gather = overlap_param_gather_problem(cfg.zero) if cfg.overlap_param_gather else None
    if hidden_gather:
        problems.append(("overlap_param_gather", hidden_gather))
    layout = layout_problem(cfg, model.layers)
    if layout:
        problems.append(layout)
    microbatches = global_batch // (cfg.dp * cfg.mbs)
    problem = schedule_problem(cfg, microbatches, model.layers)
    if problem:
        problems.append(problem)
    return problems


def layout_problem(cfg: ParallelConfig, layers: int) -> tuple[str, str] | None:
    """(config field, why) when ``layers_per_stage`` does not describe this pipeline."""
    given = cfg.layers_per_stage
    if not given:
        return None
    if len(given) != cfg.pp:
        return "layers_per_stage", f"{len(given)} stages given for pp={cfg.pp}"
    if sum(given) != layers:
        return "layers_per_stage", f"the stages hold {sum(given)} layers, the model {layers}"
    if min(given) < cfg.vpp:
        each = "at least one layer" if cfg.vpp == 1 else f"at least vpp={cfg.vpp} layers (one a virtual stage)"
        return "layers_per_stage", f"every stage needs {each}"
    return None


def schedule_problem(cfg: ParallelConfig, microbatches: int, layers: int) -> tuple[str, str] | None:
    """(config field, why) when the schedule cannot run this pipeline: torch's rules (the registry's),
    a closed-form bubble to price it with, and the planner's own: a layer for every virtual stage (chunks need not be
    equal: the largest prices the fill and drain, ``step_time.chunk_imbalance``), and Megatron-LM's micro-batches
    divisible by p for interleaved 1F1B (where its closed form is exact)."""
    schedule = cfg.schedule
    if cfg.pp == 1:
        return None
    shape = schedule.shape_problem(cfg.pp, microbatches, cfg.vpp)
    if shape is not None:
        return ("vpp" if shape.field == "stages_per_rank" else "schedule"), shape.message
    if schedule.bubble(cfg.pp, microbatches, cfg.vpp) is None:
        if schedule.placement == "v" and microbatches < 2 * cfg.pp:
            return "schedule", (
                f"{schedule.label} is priced from m ≥ 2p micro-batches ({2 * cfg.pp} for p={cfg.pp}), where its closed "
                f"form holds; got {microbatches}"
            )
        return "schedule", f"{schedule.label} has no closed-form bubble for p={cfg.pp}, m={microbatches}"
    fewest = min(cfg.stage_layers(layers))
    if 1 < cfg.vpp > fewest and not cfg.layers_per_stage:  # a given split is checked by layout_problem
        return "vpp", (
            f"{layers} layers over {cfg.pp} stages leave a stage {fewest}, fewer than its vpp={cfg.vpp} virtual stages "
            "(each needs a layer)"
        )
    if schedule is INTERLEAVED_1F1B and microbatches % cfg.pp:
        return "schedule", f"interleaved 1F1B needs micro-batches ({microbatches}) divisible by p={cfg.pp}"
    return None


def evaluate(
    model: ModelSpec,
    cluster: ClusterSpec,
    config: ParallelConfig,
    global_batch: int,
    eff: Efficiencies | None = None,
) -> Plan:
    """Memory per GPU by part, step time, MFU and bubble of ``config``; problems if it cannot run. ``eff``: the GPU's
    own constants where none are given (``efficiencies.efficiencies_for``)."""
    cfg = config.with_dp(cluster.gpus)
    if cfg.pp == 1 and (cfg.schedule is not DEFAULT_SCHEDULE or cfg.vpp != 1):
        cfg = replace(cfg, schedule=DEFAULT_SCHEDULE, vpp=1)  # no pipeline: every schedule is plain accumulation
    problems = [message for _field, message in structural_problems(model, cluster, cfg, global_batch)]
    if problems:
        return Plan(cfg, None, None, None, tuple(problems))
    if model.layers % cfg.pp:  # an uneven split not given: priced stage by stage and said, as a given one
        cfg = replace(cfg, layers_per_stage=cfg.stage_layers(model.layers))
    elif len(set(cfg.layers_per_stage)) == 1:  # an even split given: the same layout as none, said as none
        cfg = replace(cfg, layers_per_stage=())
    microbatches = global_batch // (cfg.dp * cfg.mbs)
    memory = memory_per_gpu(model, cluster, cfg, microbatches)
    step = step_time(model, cluster, cfg, global_batch, eff)
    if (
        not step.total > 0 or step.total != step.total
    ):  # a GPU whose figures leave no time at all, or none a float holds
        return Plan(cfg, memory, None, None, ("the GPU's figures leave a step of no measurable time",))
    mfu = model_flops_per_step(model, global_batch) / (step.total * cluster.gpus * cluster.gpu.peak_tflops * 1e12)
    if not memory.fits:
        problems.append(f"needs {memory.total / GIB:.1f} GiB per GPU, {memory.available / GIB:.1f} GiB available")
    return Plan(cfg, memory, step, mfu, tuple(problems))
