"""Per-run series for Prometheus, computed in the background and served from memory.

Runs heard from in the last ``ACTIVE_FOR`` are exported, each with a few series labelled by its key
(``run``), so the number of series grows with the number of recent runs, never with their ranks:
a 16,384-rank run has as many as a 2-rank one. Figures are over the run's newest ``RECENT_STEPS``
steps, from the aggregates every rank ships for every step (no spans needed).

A scrape reads no database: every ``--metrics-interval`` a background thread of each ``serve`` process
(``RunSeries.refresh``) renders the series of at most ``--metrics-max-runs`` runs (those with a firing alert
first, then the most recently heard) into one text, which each scrape appends to the service's own metrics.
At 10,000 recent runs a scrape used to run two queries per run and take 51-55 s, past Prometheus's 10-s
timeout (docs/benchmarks.md). ``bubblescope_metrics_runs_omitted`` says how many recent runs the cap left out,
``bubblescope_metrics_age_seconds`` how old the series are.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import get_args

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry
from sqlalchemy import case, func, select
from sqlalchemy.orm import Session, sessionmaker

from bubblescope.analysis import stages_floor
from bubblescope.backend.db.engine import transaction
from bubblescope.backend.db.models import Alert, Run
from bubblescope.backend.db.timestamps import as_utc
from bubblescope.backend.derived.figures import FigureCache
from bubblescope.backend.settings import ServiceSettings
from bubblescope.backend.store import ranks as rank_queries, runs as run_queries
from bubblescope.backend.store.state import RunStateName, run_state
from bubblescope.backend.store.steps import RECENT_STEPS, recent_steps
from bubblescope.backend.visible_text import visible

ACTIVE_FOR = timedelta(hours=6)
STATES: tuple[str, ...] = get_args(RunStateName)
RUN = ["run"]
MIN_PAUSE_S = 1.0
PAUSE_PER_REFRESH = 4.0


def _gauge(name: str, documentation: str, labels: list[str] = RUN) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"bubblescope_run_{name}", documentation, labels=labels)


@dataclass(frozen=True)
class Snapshot:
    """The per-run series as one rendered text, and what it covers."""

    text: bytes
    exported: int  # runs with series
    omitted: int  # recent runs the cap left out
    taken_at: float  # time.monotonic() when it was finished
    seconds: float  # how long the refresh took


class RunSeries:
    """The per-run series of one ``serve`` process, refreshed by ``refresh`` (a background task's work)."""

    def __init__(
        self, session_factory: sessionmaker[Session], settings: ServiceSettings, figures: FigureCache | None = None
    ) -> None:
        """``figures``: the alert evaluator's cache (the measured bubble and its simulated floor)."""
        self.session_factory = session_factory
        self.settings = settings
        self.figures = figures
        self._snapshot: Snapshot | None = None
        self._lock = threading.Lock()

    def current(self) -> Snapshot | None:
        """The newest rendered series; None before the first refresh has finished."""
        with self._lock:
            return self._snapshot

    def pause_after(self) -> float:
        """Seconds between a refresh and the next one news may start: 4× the last refresh's time, at least 1 s, so
        refreshing takes at most a fifth of a thread of this process however busy ingest is."""
        snapshot = self.current()
        return max(MIN_PAUSE_S, PAUSE_PER_REFRESH * (snapshot.seconds if snapshot is not None else 0.0))

    def refresh(self) -> None:
        started = time.monotonic()
        with transaction(self.session_factory) as session:
            now = run_queries.database_now(session)
            since = now - ACTIVE_FOR
            runs, recent = exported_runs(session, since, self.settings.metrics_max_runs)
            families = list(self._families(session, runs, now))
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Fixed(families))
        text = generate_latest(registry)
        finished = time.monotonic()
        with self._lock:
            self._snapshot = Snapshot(text, len(runs), recent - len(runs), finished, finished - started)

    def _families(self, session: Session, runs: Sequence[Run], now: datetime) -> Iterator[Metric]:
        recent = f"over its newest {RECENT_STEPS} steps"
        info = _gauge("info", "A run heard from recently: its name and schedule", ["run", "name", "schedule"])
        state = _gauge(
            "state", "1 for the run's state (running, finished, failed, silent), 0 for the others", ["run", "state"]
        )
        heard = _gauge("last_heard_seconds", "Seconds since any rank of the run was heard from")
        step = _gauge("step_seconds", f"Median aligned step time {recent}")
        idle = _gauge(
            "idle_ratio", f"Idle share of the ranks' step windows {recent}: the bubble less waits inside communication"
        )
        floor = _gauge("bubble_floor_ratio", "The schedule's closed-form bubble for the run's stages and micro-batches")
        exposed = _gauge(
            "exposed_comm_ratio", f"Communication not hidden behind compute, share of the step windows {recent}"
        )
        reporting = _gauge("ranks_reporting", f"Ranks with at least one step aggregate {recent}")
        expected = _gauge("ranks_expected", "The run's world size")
        dropped = CounterMetricFamily(
            "bubblescope_run_dropped_spans", "Spans the collector dropped (a full queue or spool)", labels=RUN
        )
        bubble = _gauge("bubble_ratio", "Measured pipeline bubble over the newest steps with spans (the alert rules')")
        simulated = _gauge(
            "bubble_simulated_floor_ratio",
            "The simulator's bubble floor for the run's schedule and measured stage costs",
        )
        firing = _gauge(
            "alert_firing",
            "1 per firing alert of the service's rules (docs/alerts.md)",
            ["run", "alertname", "severity"],
        )
        flagged = _gauge(
            "rank_flagged",
            "1 per rank a firing alert names (a failure's culprit, a hang's lagging rank, a straggler): only those ranks",
            ["run", "rank", "host", "reason"],
        )
        ids = [run.id for run in runs]
        ends = rank_queries.rank_ends(session, ids)
        dropped_of = rank_queries.dropped_spans_of(session, ids)
        for run in runs:
            key = [run.key]
            config = run.config or {}
            info.add_metric([run.key, visible(run.name), visible(str(config.get("schedule") or ""))], 1)
            current = run_state(run.world_size, ends[run.id], run.updated_at, now, self.settings.silent_after_s, config)
            for name in STATES:
                state.add_metric([run.key, name], 1 if current.state == name else 0)
            heard.add_metric(key, max(0.0, (as_utc(now) - as_utc(run.updated_at)).total_seconds()))
            figures = recent_steps(session, run)
            if figures.median_step_ns is not None:
                step.add_metric(key, figures.median_step_ns / 1e9)
            if figures.idle_ratio is not None:
                idle.add_metric(key, figures.idle_ratio)
            if figures.exposed_comm_ratio is not None:
                exposed.add_metric(key, figures.exposed_comm_ratio)
            closed = stages_floor(
                config.get("schedule"),
                config.get("num_stages"),
                config.get("num_microbatches"),
                config.get("virtual_stages") or 1,
            )
            if closed is not None:
                floor.add_metric(key, closed.fraction)
            cached = self.figures.of(run.id) if self.figures is not None else None
            if cached is not None and cached.computed.bubble is not None:
                bubble.add_metric(key, cached.computed.bubble.measured_fraction)
                simulated.add_metric(key, cached.computed.bubble.floor_fraction)
            reporting.add_metric(key, figures.ranks_reporting)
            expected.add_metric(key, run.world_size)
            dropped.add_metric(key, dropped_of.get(run.id, 0))
        keys = {run.id: run.key for run in runs}
        for alert in session.scalars(select(Alert).where(Alert.ends_at.is_(None), Alert.run_id.in_(keys))):
            labels = alert.labels
            firing.add_metric([keys[alert.run_id], alert.alertname, alert.severity], 1)
            if "rank" in labels:
                reason = alert.alertname.removeprefix("Bubblescope")
                flagged.add_metric([keys[alert.run_id], labels["rank"], visible(labels.get("host", "")), reason], 1)
        yield from (info, state, heard, step, idle, floor, exposed, reporting, expected, dropped)
        yield from (bubble, simulated, firing, flagged)


def exported_runs(session: Session, since: datetime, cap: int) -> tuple[Sequence[Run], int]:
    """(the runs heard from since ``since`` that get series, at most ``cap``: those with a firing alert first,
    then the most recently heard; how many were heard from since then in all)."""
    recent = Run.updated_at > since
    firing = select(Alert.run_id).where(Alert.ends_at.is_(None))
    order = (case((Run.id.in_(firing), 0), else_=1), Run.updated_at.desc(), Run.id.desc())
    runs = session.scalars(select(Run).where(recent).order_by(*order).limit(cap)).all()
    total = session.scalar(select(func.count()).select_from(Run).where(recent)) or 0
    return runs, int(total)


class _Fixed(Collector):
    """Families computed already (rendered once per refresh)."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterator[Metric]:
        yield from self.families


class SnapshotMetrics(Collector):
    """The service's own gauges about the per-run series: runs exported and left out, age, refresh time."""

    def __init__(self, series: RunSeries) -> None:
        self.series = series

    def collect(self) -> Iterator[Metric]:
        snapshot = self.series.current()
        exported = GaugeMetricFamily("bubblescope_metrics_runs_exported", "Runs /metrics exports series for")
        omitted = GaugeMetricFamily(
            "bubblescope_metrics_runs_omitted",
            "Runs heard from in the last 6 h that /metrics leaves out (over --metrics-max-runs)",
        )
        age = GaugeMetricFamily("bubblescope_metrics_age_seconds", "Seconds since the per-run series were computed")
        took = GaugeMetricFamily(
            "bubblescope_metrics_refresh_seconds", "How long the last refresh of the per-run series took"
        )
        if snapshot is not None:
            exported.add_metric([], snapshot.exported)
            omitted.add_metric([], snapshot.omitted)
            age.add_metric([], time.monotonic() - snapshot.taken_at)
            took.add_metric([], snapshot.seconds)
        yield from (exported, omitted, age, took)
