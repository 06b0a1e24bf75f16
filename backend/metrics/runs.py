"""Per-run series for Prometheus, read from the database at each scrape.

Runs heard from in the last ``ACTIVE_FOR`` are exported, each with a few series labelled by its key
(``run``), so the number of series grows with the number of recent runs, never with their ranks:
a 16,384-rank run has as many as a 2-rank one. Figures are over the run's newest ``RECENT_STEPS``
steps, from the aggregates every rank ships for every step (no spans needed).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import get_args

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from bubblescope.analysis import stages_floor
from bubblescope.backend.db.engine import transaction
from bubblescope.backend.db.models import Alert
from bubblescope.backend.db.timestamps import as_utc
from bubblescope.backend.derived.figures import FigureCache
from bubblescope.backend.settings import ServiceSettings
from bubblescope.backend.store import ranks as rank_queries, runs as run_queries
from bubblescope.backend.store.state import RunStateName, run_state
from bubblescope.backend.store.steps import RECENT_STEPS, recent_steps

ACTIVE_FOR = timedelta(hours=6)
STATES: tuple[str, ...] = get_args(RunStateName)
RUN = ["run"]


def _gauge(name: str, documentation: str, labels: list[str] = RUN) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"bubblescope_run_{name}", documentation, labels=labels)


class RunMetrics(Collector):
    def __init__(
        self, session_factory: sessionmaker[Session], settings: ServiceSettings, figures: FigureCache | None = None
    ) -> None:
        """``figures``: the alert evaluator's cache (the measured bubble and its simulated floor)."""
        self.session_factory = session_factory
        self.settings = settings
        self.figures = figures

    def collect(self) -> Iterator[Metric]:
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
        with transaction(self.session_factory) as session:
            now = run_queries.database_now(session)
            runs = run_queries.runs_heard_since(session, now - ACTIVE_FOR)
            ends = rank_queries.rank_ends(session, [run.id for run in runs])
            for run in runs:
                key = [run.key]
                config = run.config or {}
                info.add_metric([run.key, run.name, str(config.get("schedule") or "")], 1)
                current = run_state(
                    run.world_size, ends[run.id], run.updated_at, now, self.settings.silent_after_s, config
                )
                for name in STATES:
                    state.add_metric([run.key, name], 1 if current.state == name else 0)
                heard.add_metric(key, max(0.0, (as_utc(now) - as_utc(run.updated_at)).total_seconds()))
                ranks = rank_queries.ranks_of(session, run.id)
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
                dropped.add_metric(key, sum(info.dropped_spans for info in ranks))
            keys = {run.id: run.key for run in runs}
            for alert in session.scalars(select(Alert).where(Alert.ends_at.is_(None), Alert.run_id.in_(keys))):
                labels = alert.labels
                firing.add_metric([keys[alert.run_id], alert.alertname, alert.severity], 1)
                if "rank" in labels:
                    reason = alert.alertname.removeprefix("Bubblescope")
                    flagged.add_metric([keys[alert.run_id], labels["rank"], labels.get("host", ""), reason], 1)
        yield from (info, state, heard, step, idle, floor, exposed, reporting, expected, dropped)
        yield from (bubble, simulated, firing, flagged)
