"""Plain-text rendering of plans for the terminal."""

from __future__ import annotations

from bubblescope.analysis.planner.labels import config_label
from bubblescope.analysis.planner.memory import GIB
from bubblescope.analysis.planner.request import PlanOutcome

FP8_MFU_NOTE = (
    "MFU: model FLOPs over the GPUs' dense bf16 peak, as usual; FP8 GEMMs run at up to twice it, so an FP8 plan "
    "can read above 100%"
)


def render_outcome(outcome: PlanOutcome) -> str:
    model, cluster = outcome.model, outcome.cluster
    lines = [
        f"{model.name}: {model.params / 1e9:.1f}B parameters, sequence {model.seq:,} tokens, on {cluster.gpus} × "
        f"{cluster.gpu.name} ({cluster.gpus_per_node} per node), global batch {outcome.global_batch}"
    ]
    if outcome.assumed:
        lines.append("assumed: " + "; ".join(outcome.assumed))
    if any(plan.config.precision == "fp8" for plan in outcome.plans):
        lines.append(FP8_MFU_NOTE)
    if not outcome.plans:
        lines.append(nothing_fits(outcome))
        return "\n".join(lines)
    if outcome.searched:
        lines.append(f"{'#':>3}  {'step s':>9}  {'MFU':>6}  {'bubble':>6}  {'GiB/GPU':>7}  configuration")
        for rank, plan in enumerate(outcome.plans, 1):
            assert plan.step is not None and plan.memory is not None and plan.mfu is not None
            lines.append(
                f"{rank:>3}  {plan.step.total:>9.3f}  {plan.mfu:>6.1%}  {plan.step.bubble_fraction:>6.1%}  "
                f"{plan.memory.total / GIB:>7.1f}  {config_label(plan)}"
            )
        return "\n".join(lines)
    plan = outcome.plans[0]
    lines.append(config_label(plan))
    assert plan.memory is not None and plan.step is not None and plan.mfu is not None
    memory = plan.memory.gib()
    verdict = "fits" if plan.fits else "does NOT fit"
    lines.append(
        f"memory per GPU {memory['total']:.1f} GiB ({verdict} in {plan.memory.available / GIB:.1f} GiB): "
        + ", ".join(
            f"{part} {memory[part]:.1f}" for part in ("weights", "gradients", "optimizer", "activations", "loss")
        )
    )
    step = plan.step
    parts = {
        "compute": step.compute,
        "recompute": step.recompute,
        "tp comm": step.tp_comm,
        "cp comm": step.cp_comm,
        "ep comm": step.ep_comm,
        "straggler": step.straggler,
        "pp comm": step.pp_comm,
        "bubble": step.bubble,
        "dp comm": step.dp_comm,
        "optimizer": step.optimizer,
    }
    lines.append(
        f"step {step.total:.3f} s, MFU {plan.mfu:.1%}, bubble {step.bubble_fraction:.1%} of the pipeline "
        f"({step.microbatches} micro-batch{'es' if step.microbatches != 1 else ''}): "
        + ", ".join(f"{k} {v:.3f}" for k, v in parts.items())
    )
    return "\n".join(lines)


def nothing_fits(outcome: PlanOutcome) -> str:
    """The line an answer without plans prints: nothing runs and fits, and why where the search knows."""
    return "no configuration runs and fits in memory" + (f": {outcome.why_none}" if outcome.why_none else "")
