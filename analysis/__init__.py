"""The analysis: pure functions over plain data, and this module its one entry point.

No database, web framework, plotting or torch here. The service, the CLI and the demo reach the analysis
only through the names below (``tests/test_layers.py`` checks it); its modules are free to change
behind them. A source of steps (the service's database; an imported trace) hands over plain data:

1. ``RunFacts`` (size, config, where each rank runs) and, per step, a ``StepRecord`` (spans on rank 0's
   clock, each rank's window and totals), which ``break_down_step`` turns into each rank's breakdown.
2. ``choose_steps`` names the steps a report reads; ``analyse_run`` makes the whole report of them
   (breakdown per stage, the measured pipeline and its replay, the bubble's causes, stage imbalance,
   memory per stage, ranked suggestions); ``what_if`` replays them with one thing changed.
3. ``straggler_report`` scores ranks over a step range from their per-step totals alone.
4. The alert rules (``evaluate``, ``RULES``), the schedule registry (``lookup``), the planner
   (``plan_document``) and the warm-up rule (``usual_steps``, ``default_step``).
5. A profiler trace's GPU activities (``GpuActivity``) → Holistic Trace Analysis' figures (``hta_figures``) and
   our own split of the same span (``own_split``); both from activities streamed in order (``figures``).
6. Steps as Chrome trace-event JSON for Perfetto (``chrome_trace``).
7. Flight Recorder dumps (``FrDump``, one per rank) → where each group's collectives stand, the first one not
   every rank joined, and mismatches (``flight_recorder_report``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:  # the names below, each from its home (imported when first asked for: ``__getattr__``)
    from bubblescope.analysis.alert_catalog import (
        DEFAULT_THRESHOLDS as DEFAULT_THRESHOLDS,
        Thresholds as Thresholds,
    )
    from bubblescope.analysis.alert_rules import (
        RULES as RULES,
        BubbleFigures as BubbleFigures,
        FiringAlert as FiringAlert,
        RankStatus as RankStatus,
        RegressionFigures as RegressionFigures,
        RunSnapshot as RunSnapshot,
        StragglerFinding as StragglerFinding,
        alerts_table as alerts_table,
        evaluate as evaluate,
        failure_culprit as failure_culprit,
        first_failures as first_failures,
        hung_lagging as hung_lagging,
        lagging_who as lagging_who,
        vanished_first as vanished_first,
    )
    from bubblescope.analysis.attribution import (
        CAUSE_KINDS as CAUSE_KINDS,
    )
    from bubblescope.analysis.errors import (
        InputError as InputError,
    )
    from bubblescope.analysis.flight_recorder import (
        FlightRecorderReport as FlightRecorderReport,
        FrDump as FrDump,
        flight_recorder_report as flight_recorder_report,
    )
    from bubblescope.analysis.memory_use import (
        RankMemory as RankMemory,
    )
    from bubblescope.analysis.model import (
        RankBreakdown as RankBreakdown,
        RankPlace as RankPlace,
        StepBubble as StepBubble,
        TimedSpan as TimedSpan,
    )
    from bubblescope.analysis.pipeline_profile import (
        MAX_LAYERS as MAX_LAYERS,
    )
    from bubblescope.analysis.planner.render import (
        nothing_fits as nothing_fits,
        render_outcome as render_outcome,
    )
    from bubblescope.analysis.planner.request import (
        DuplicateKeyError as DuplicateKeyError,
        PlanOutcome as PlanOutcome,
        plan_document as plan_document,
        refuse_repeated_keys as refuse_repeated_keys,
        unique_json_object as unique_json_object,
    )
    from bubblescope.analysis.planner.specs import (
        CHOICES as CHOICES,
        GPU_CATALOG as GPU_CATALOG,
        MODEL_PRESETS as MODEL_PRESETS,
        PlanInputError as PlanInputError,
    )
    from bubblescope.analysis.prometheus_rules import (
        prometheus_rules as prometheus_rules,
        prometheus_rules_table as prometheus_rules_table,
    )
    from bubblescope.analysis.run_report import (
        MAX_ANALYSED_STEPS as MAX_ANALYSED_STEPS,
        NotReplayable as NotReplayable,
        RunFacts as RunFacts,
        RunReport as RunReport,
        StageBreakdown as StageBreakdown,
        StepWindow as StepWindow,
        WhatIf as WhatIf,
        analyse_run as analyse_run,
        choose_steps as choose_steps,
        straggler_range as straggler_range,
        what_if as what_if,
    )
    from bubblescope.analysis.sampling import (
        median_and_slowest as median_and_slowest,
    )
    from bubblescope.analysis.schedule_orders import BACKWARD as BACKWARD, FORWARD as FORWARD
    from bubblescope.analysis.schedules import (
        DEFAULT_SCHEDULE as DEFAULT_SCHEDULE,
        NAIVE as NAIVE,
        NAMES as NAMES,
        Schedule as Schedule,
        ScheduleError as ScheduleError,
        lookup as lookup,
        stages_floor as stages_floor,
    )
    from bubblescope.analysis.simulator import (
        PipelineSetup as PipelineSetup,
        SimulationResult as SimulationResult,
        StageCost as StageCost,
        simulate as simulate,
    )
    from bubblescope.analysis.step_record import (
        BrokenDownStep as BrokenDownStep,
        RankTotals as RankTotals,
        StepRecord as StepRecord,
        break_down_step as break_down_step,
        bubble_of_step as bubble_of_step,
        span_sample as span_sample,
    )
    from bubblescope.analysis.step_split import (
        STEP_PARTS as STEP_PARTS,
        Culprit as Culprit,
        StepSplit as StepSplit,
    )
    from bubblescope.analysis.stragglers import (
        MIN_VERDICT_STEPS as MIN_VERDICT_STEPS,
        PHASES as PHASES,
        RankStepTimes as RankStepTimes,
        StragglerReport as StragglerReport,
        straggler_report as straggler_report,
    )
    from bubblescope.analysis.trace_events import (
        BUBBLESCOPE_TRACE_MARK as BUBBLESCOPE_TRACE_MARK,
        ExportedStep as ExportedStep,
        chrome_trace as chrome_trace,
    )
    from bubblescope.analysis.trace_figures import (
        GpuActivity as GpuActivity,
        HtaFigures as HtaFigures,
        OwnSplit as OwnSplit,
        figures as figures,
        hta_figures as hta_figures,
        own_split as own_split,
        p2p_waits as p2p_waits,
    )
    from bubblescope.analysis.warmup import (
        BASELINE_STEPS as BASELINE_STEPS,
        WARMUP_STEPS as WARMUP_STEPS,
        StepSeen as StepSeen,
        default_step as default_step,
        imported_ranks as imported_ranks,
        is_complete as is_complete,
        is_warmup as is_warmup,
        reporting_ranks as reporting_ranks,
        usual_steps as usual_steps,
        warmup_steps_of as warmup_steps_of,
        warmup_until as warmup_until,
    )
    from bubblescope.analysis.whatif import (
        Change as Change,
    )

# Where each name lives. Imported on first use: the command line reads the schedule names on machines
# with only the collector installed (no numpy, which the stragglers need), and pays for no more.
HOMES: Final[dict[str, tuple[str, ...]]] = {
    "alert_catalog": ("DEFAULT_THRESHOLDS", "Thresholds"),
    "alert_rules": (
        "RULES",
        "BubbleFigures",
        "FiringAlert",
        "RankStatus",
        "RegressionFigures",
        "RunSnapshot",
        "StragglerFinding",
        "alerts_table",
        "evaluate",
        "failure_culprit",
        "first_failures",
        "hung_lagging",
        "lagging_who",
        "vanished_first",
    ),
    "attribution": ("CAUSE_KINDS",),
    "trace_events": ("BUBBLESCOPE_TRACE_MARK", "ExportedStep", "chrome_trace"),
    "flight_recorder": ("FlightRecorderReport", "FrDump", "flight_recorder_report"),
    "errors": ("InputError",),
    "memory_use": ("RankMemory",),
    "model": (
        "RankBreakdown",
        "RankPlace",
        "StepBubble",
        "TimedSpan",
    ),
    "pipeline_profile": ("MAX_LAYERS",),
    "planner.render": ("nothing_fits", "render_outcome"),
    "planner.request": (
        "DuplicateKeyError",
        "PlanOutcome",
        "plan_document",
        "refuse_repeated_keys",
        "unique_json_object",
    ),
    "planner.specs": ("CHOICES", "GPU_CATALOG", "MODEL_PRESETS", "PlanInputError"),
    "prometheus_rules": ("prometheus_rules", "prometheus_rules_table"),
    "run_report": (
        "MAX_ANALYSED_STEPS",
        "NotReplayable",
        "RunFacts",
        "RunReport",
        "StageBreakdown",
        "StepWindow",
        "WhatIf",
        "analyse_run",
        "choose_steps",
        "straggler_range",
        "what_if",
    ),
    "sampling": ("median_and_slowest",),
    "schedule_orders": ("BACKWARD", "FORWARD"),
    "simulator": ("PipelineSetup", "SimulationResult", "StageCost", "simulate"),
    "schedules": (
        "DEFAULT_SCHEDULE",
        "NAIVE",
        "NAMES",
        "Schedule",
        "ScheduleError",
        "lookup",
        "stages_floor",
    ),
    "step_split": ("STEP_PARTS", "Culprit", "StepSplit"),
    "step_record": (
        "BrokenDownStep",
        "RankTotals",
        "StepRecord",
        "break_down_step",
        "bubble_of_step",
        "span_sample",
    ),
    "stragglers": (
        "MIN_VERDICT_STEPS",
        "PHASES",
        "RankStepTimes",
        "StragglerReport",
        "straggler_report",
    ),
    "trace_figures": ("GpuActivity", "HtaFigures", "OwnSplit", "figures", "hta_figures", "own_split", "p2p_waits"),
    "warmup": (
        "BASELINE_STEPS",
        "WARMUP_STEPS",
        "StepSeen",
        "default_step",
        "imported_ranks",
        "is_complete",
        "is_warmup",
        "reporting_ranks",
        "usual_steps",
        "warmup_steps_of",
        "warmup_until",
    ),
    "whatif": ("Change",),
}
_HOME_OF: Final = {name: module for module, names in HOMES.items() for name in names}
__all__ = sorted(_HOME_OF)


def __getattr__(name: str) -> Any:
    module = _HOME_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
