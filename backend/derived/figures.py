"""The costlier figures the alert rules read: step-time regression, bubble over its floor, stragglers.

Each is computed when the run has new steps: at most once per ``RECOMPUTE_S`` per run, or sooner
while the run is young (whenever its step count has doubled since: steps 1, 2, 4, 8 ...);
in between the evaluator reuses the last figures (``FigureCache``), which ``/metrics`` also reads
(the simulated floor and the measured bubble), so neither computes them twice.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from bubblescope.analysis import (
    BASELINE_STEPS,
    MIN_VERDICT_STEPS,
    WARMUP_STEPS,
    BubbleFigures,
    Culprit,
    InputError,
    RegressionFigures,
    RunReport,
    StragglerFinding,
    Thresholds,
)
from bubblescope.backend.db.models import Run
from bubblescope.backend.derived.report import run_report
from bubblescope.backend.derived.stragglers import straggler_report
from bubblescope.backend.errors import DomainError
from bubblescope.backend.store.steps import first_step, step_totals

RECOMPUTE_S = 30.0
MAX_WINDOW_STEPS = 5000  # a regression window of fast steps is this many steps, whatever it spans
WINDOW_PARTS = 3  # the window's parts: each must be slower than the limit (it held throughout)


@dataclass(frozen=True)
class ComputedFigures:
    """One computation's figures (picklable: ``figure_worker`` computes them in a child process)."""

    baseline_step_s: float | None
    regression: RegressionFigures | None
    bubble: BubbleFigures | None
    stragglers: list[StragglerFinding]


@dataclass
class RunFigures:
    """A run's newest figures and when they were computed (for which step)."""

    newest_step: int | None = None
    computed_at: float = -math.inf  # time.monotonic()
    computed: ComputedFigures = field(default_factory=lambda: ComputedFigures(None, None, None, []))


class FigureCache:
    """The figures of each run, by run id (in memory: recomputed after a restart). ``compute``: how
    they are computed (``compute_figures`` in this process, or ``FigureWorker.compute`` in a child)."""

    def __init__(self, compute: FigureCompute | None = None) -> None:
        self.runs: dict[int, RunFigures] = {}
        self.compute = compute

    def of(self, run_id: int) -> RunFigures | None:
        return self.runs.get(run_id)

    def forget(self, keep: set[int]) -> None:
        for run_id in [r for r in self.runs if r not in keep]:
            del self.runs[run_id]

    def refresh(
        self, session: Session, run: Run, newest_step: int | None, usual_step_s: float | None, t: Thresholds
    ) -> RunFigures:
        figures = self.runs.setdefault(run.id, RunFigures())
        if newest_step is None or newest_step == figures.newest_step:
            return figures
        doubled = figures.newest_step is None or newest_step >= 2 * max(figures.newest_step, 1)
        if not doubled and time.monotonic() - figures.computed_at < RECOMPUTE_S:
            return figures
        figures.newest_step = newest_step
        figures.computed_at = time.monotonic()
        asked = FigureRequest(run.id, run.key, newest_step, figures.computed.baseline_step_s, usual_step_s, t)
        figures.computed = self.compute(asked) if self.compute is not None else compute_figures(session, asked)
        return figures


@dataclass(frozen=True)
class FigureRequest:
    run_id: int
    run_key: str
    newest_step: int
    baseline_step_s: float | None  # kept once known
    usual_step_s: float | None
    thresholds: Thresholds


FigureCompute = Callable[[FigureRequest], ComputedFigures]


def compute_figures(session: Session, asked: FigureRequest) -> ComputedFigures:
    baseline = asked.baseline_step_s
    if baseline is None:
        baseline = _baseline(session, asked.run_id, asked.newest_step)
    t = asked.thresholds
    report = _newest_report(session, asked.run_id, asked.newest_step, t)
    split = report.step_split if report is not None else None
    return ComputedFigures(
        baseline,
        _regression(session, asked.run_id, asked.newest_step, baseline, asked.usual_step_s, t),
        _bubble(report),
        _stragglers(session, asked.run_id, asked.run_key, asked.newest_step, split.culprit if split else None),
    )


def step_walls(session: Session, run_id: int, first: int, last: int) -> list[tuple[int, int, int]]:
    """(step, start, end) of each step in [first, last] across its ranks, on rank 0's clock."""
    return [
        (int(row.step), int(row.first_start), int(row.last_end)) for row in step_totals(session, run_id, first, last)
    ]


def _baseline(session: Session, run_id: int, newest_step: int) -> float | None:
    """The median step after warm-up, once the run has that many steps (then kept)."""
    first = first_step(session, run_id)
    if first is None or newest_step < first + WARMUP_STEPS + BASELINE_STEPS:
        return None
    walls = step_walls(session, run_id, first + WARMUP_STEPS, first + WARMUP_STEPS + BASELINE_STEPS - 1)
    return statistics.median((end - start) / 1e9 for _step, start, end in walls) if walls else None


def _regression(
    session: Session,
    run_id: int,
    newest_step: int,
    baseline_s: float | None,
    usual_step_s: float | None,
    t: Thresholds,
) -> RegressionFigures | None:
    if baseline_s is None or not usual_step_s:
        return None
    wanted = math.ceil(t.regression_for_s / usual_step_s * 1.2) + WINDOW_PARTS
    steps = min(wanted, MAX_WINDOW_STEPS)
    walls = step_walls(session, run_id, max(0, newest_step - steps + 1), newest_step)
    newest_end = walls[-1][2] if walls else 0
    window = [w for w in walls if w[2] >= newest_end - t.regression_for_s * 1e9]
    if steps < wanted:  # capped: the newest MAX_WINDOW_STEPS steps stand for the whole period
        window = walls
    if len(window) < WINDOW_PARTS:
        return None
    covered_s = t.regression_for_s if steps < wanted else (newest_end - window[0][1]) / 1e9
    size = len(window) / WINDOW_PARTS
    parts = [window[round(i * size) : round((i + 1) * size)] for i in range(WINDOW_PARTS)]
    medians = [statistics.median((end - start) / 1e9 for _s, start, end in part) for part in parts if part]
    return RegressionFigures(baseline_s, medians, covered_s)


def _newest_report(session: Session, run_id: int, newest_step: int, t: Thresholds) -> RunReport | None:
    """The run's report over its newest ``bubble_for_steps`` steps with spans; None where it has none."""
    run = session.get(Run, run_id)
    if run is None:
        return None
    try:
        return run_report(session, run, max(0, newest_step - t.bubble_for_steps + 1), newest_step)
    except (DomainError, InputError):  # no step with spans in the window, or not a pipeline the simulator knows
        return None


def _bubble(report: RunReport | None) -> BubbleFigures | None:
    """The measured bubble and the simulator's floor over the newest steps with spans (a pipeline run)."""
    if report is None or report.attribution is None:
        return None
    action = next((s.title for s in report.suggestions if not s.within_noise), None)
    return BubbleFigures(
        report.attribution.measured_bubble_fraction,
        report.attribution.simulated_floor_ns / report.attribution.step_ns if report.attribution.step_ns else 0.0,
        report.step_bubble_fractions,
        action,
    )


def _stragglers(
    session: Session, run_id: int, run_key: str, newest_step: int, culprit: Culprit | None
) -> list[StragglerFinding]:
    """The straggler analysis' persistent findings over its default range of the newest steps, past
    the warm-up, once there are ``MIN_VERDICT_STEPS`` of them (a verdict on 2 of 4 steps is noise); none whose
    ranks wait in the collectives for ``culprit`` (their extra compute is not what holds the step)."""
    first = first_step(session, run_id)
    if first is None or newest_step - (first + WARMUP_STEPS) + 1 < MIN_VERDICT_STEPS:
        return []
    _, report = straggler_report(session, run_key, None, newest_step)  # its default range: past the warm-up
    hosts = {score.rank: score.host for score in report.rank_scores}
    stages = {score.rank: score.stage for score in report.rank_scores}
    found = []
    for finding in report.findings:
        if finding.verdict != "persistent" or (culprit is not None and culprit.waited_on_by(finding.ranks)):
            continue
        named_hosts = sorted({host for r in finding.ranks if (host := hosts.get(r))})
        named_stages = {stages.get(r) for r in finding.ranks}
        stage = named_stages.pop() if len(named_stages) == 1 else None
        found.append(StragglerFinding(finding.kind, list(finding.ranks), named_hosts, stage, finding.message))
    return found
