"""First-principles parallelism planner (pure: stdlib and other analysis modules only).

Given a model, a cluster and a global batch: memory per GPU by part, step time, MFU and bubble of a
configuration (``evaluate``), or the fastest configurations that fit (``search``). ``calibration``
checks the step-time model against published Megatron-LM runs.
"""

from bubblescope.analysis.planner.efficiencies import DEFAULT_EFFICIENCIES, Efficiencies, efficiencies_for
from bubblescope.analysis.planner.evaluate import Plan, evaluate, model_flops_per_step
from bubblescope.analysis.planner.memory import (
    MemoryBreakdown,
    activation_bytes_per_layer,
    memory_per_gpu,
    memory_per_pipeline_rank,
)
from bubblescope.analysis.planner.request import PlanOutcome, plan_document
from bubblescope.analysis.planner.search import search
from bubblescope.analysis.planner.specs import (
    GPU_CATALOG,
    MODEL_PRESETS,
    ClusterSpec,
    GpuSpec,
    ModelSpec,
    ParallelConfig,
    PlanInputError,
    cluster_preset,
    make_cluster,
    model_from,
)
from bubblescope.analysis.planner.step_time import StepTime, step_time

__all__ = [
    "DEFAULT_EFFICIENCIES",
    "GPU_CATALOG",
    "MODEL_PRESETS",
    "ClusterSpec",
    "Efficiencies",
    "GpuSpec",
    "MemoryBreakdown",
    "ModelSpec",
    "ParallelConfig",
    "Plan",
    "PlanInputError",
    "PlanOutcome",
    "StepTime",
    "activation_bytes_per_layer",
    "cluster_preset",
    "efficiencies_for",
    "evaluate",
    "make_cluster",
    "memory_per_gpu",
    "memory_per_pipeline_rank",
    "model_flops_per_step",
    "model_from",
    "plan_document",
    "search",
    "step_time",
]
