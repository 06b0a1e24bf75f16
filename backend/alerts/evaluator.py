"""Evaluates the alert rules on the service's own clock and after ingest, and keeps the alerts table.

One round (``AlertEvaluator.evaluate_all``): for every run heard from in the last ``ACTIVE_FOR``
and every run with a firing alert, build its snapshot, ask ``analysis.alert_rules.evaluate`` what
fires, then reconcile in the run's own transaction: a new fingerprint opens an alert (startsAt now),
a firing one keeps its start and takes the new figures, one no longer firing resolves (endsAt now).
Each opening and resolution goes to the delivery outbox in the same transaction, and the delivery
task is woken once committed. A run that left the active window resolves what it still has firing.

Runs on the ``ALERT_TASK`` background task: every ``--alert-interval`` seconds, and when woken by
an ingest or a rank's end, but never more often than every ``MIN_GAP_S``, nor than keeps it above
``ROUNDS_MAX_SHARE`` of a core (a big job's ingest load does not keep it busy).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from bubblescope.analysis import FiringAlert, RunSnapshot, Thresholds, evaluate
from bubblescope.backend.alerts.delivery import enqueue_notifications
from bubblescope.backend.alerts.shape import AlertStatus, fingerprint
from bubblescope.backend.db.engine import transaction
from bubblescope.backend.db.models import Alert, Run
from bubblescope.backend.db.timestamps import as_utc
from bubblescope.backend.derived.figures import FigureCache, FigureCompute
from bubblescope.backend.settings import ServiceSettings
from bubblescope.backend.store import ranks as rank_queries, runs as run_queries
from bubblescope.backend.store.state import run_state
from bubblescope.backend.store.steps import recent_steps

log = logging.getLogger("bubblescope.alerts")

ALERT_TASK = "alert-rules"
ACTIVE_FOR = timedelta(hours=6)
MIN_GAP_S = 1.0
# Woken by every ingest batch, rounds of a 1,024-rank run (~0.2 s) would take a core's fifth at 1 s
# gaps; a round of d seconds starts the next d / share after its own start, at least MIN_GAP_S and at
# most --alert-interval (a slow round, such as the one that starts the figure worker, delays no rule longer).
ROUNDS_MAX_SHARE = 0.1
SETTLE_S = 0.2  # a wake comes from a request whose transaction commits just after it
DROPPING_FOR_S = 300.0  # the dropping alert holds this long after the count last grew
THRESHOLD_KEYS = (
    "hung_after_s",
    "regression_percent",
    "regression_for_s",
    "bubble_over_floor_points",
    "bubble_for_steps",
)


def thresholds_for(settings: ServiceSettings, config: dict[str, Any]) -> Thresholds:
    """The service's thresholds with the run's overrides (its config's ``alerts`` key, validated at
    registration by ``runs.schemas.AlertOverrides``)."""
    overrides = config.get("alerts") or {}
    values = {key: getattr(settings, key) if overrides.get(key) is None else overrides[key] for key in THRESHOLD_KEYS}
    return Thresholds(
        silent_after_s=settings.silent_after_s,
        disabled=frozenset(overrides.get("disabled") or ()),
        **values,
    )


@dataclass
class DropWatch:
    count: int
    grew_at: float  # time.monotonic()


class AlertEvaluator:
    def __init__(
        self,
        session_factory: sessionmaker[Session],
        settings: ServiceSettings,
        wake_delivery: Callable[[], None],
        compute_figures: FigureCompute | None = None,
    ) -> None:
        self.session_factory = session_factory
        self.settings = settings
        self.wake_delivery = wake_delivery
        self.figures = FigureCache(compute_figures)
        self._drops: dict[int, DropWatch] = {}
        self._last_round = -float("inf")
        self._gap_s = MIN_GAP_S

    def run_round(self) -> None:
        """The background task's work: one round, no sooner than ``_gap_s`` after the last."""
        time.sleep(max(SETTLE_S, self._last_round + self._gap_s - time.monotonic()))
        self._last_round = time.monotonic()
        self.evaluate_all()
        share_gap = (time.monotonic() - self._last_round) / ROUNDS_MAX_SHARE
        self._gap_s = min(
            self.settings.alert_interval_s, max(MIN_GAP_S, share_gap)
        )  # every interval, whatever it costs

    def evaluate_all(self) -> int:
        """One round over every active run; returns how many alerts opened or resolved."""
        with transaction(self.session_factory) as session:
            now = run_queries.database_now(session)
            active = [run.id for run in run_queries.runs_heard_since(session, now - ACTIVE_FOR)]
            firing = set(session.scalars(select(Alert.run_id).where(Alert.ends_at.is_(None)).distinct()))
        changed = 0
        for run_id in sorted(set(active) | firing):
            try:
                changed += self._evaluate_run(run_id, run_id in active)
            except Exception:
                log.exception("bubblescope: alert rules failed for run id %s", run_id)
        self.figures.forget(set(active))
        if changed:
            self.wake_delivery()
        return changed

    def _evaluate_run(self, run_id: int, active: bool) -> int:
        with transaction(self.session_factory) as session:
            run = session.get(Run, run_id)
            if run is None:
                return 0
            now = run_queries.database_now(session)
            found = self._firing(session, run, now) if active else []
            return self._reconcile(session, run, found, now)

    def _firing(self, session: Session, run: Run, now: datetime) -> list[FiringAlert]:
        ranks = rank_queries.ranks_of(session, run.id)
        config = run.config or {}
        thresholds = thresholds_for(self.settings, config)
        statuses = [rank_queries.rank_end(r) for r in ranks]
        state = run_state(run.world_size, statuses, run.updated_at, now, self.settings.silent_after_s, config)
        if state.state == "finished":  # no rule fires for a finished run: spare it the step queries
            return []
        recent = recent_steps(session, run)
        usual_s = recent.median_step_ns / 1e9 if recent.median_step_ns is not None else None
        newest = max((r.last_step for r in ranks if r.last_step is not None), default=None)
        figures = self.figures.refresh(session, run, newest, usual_s, thresholds)
        progress = [as_utc(r.last_step_at) for r in ranks if r.last_step_at is not None]
        dropped = sum(r.dropped_spans for r in ranks)
        snapshot = RunSnapshot(
            key=run.key,
            state=state.state,
            state_detail=state.detail,
            now=as_utc(now),
            quiet_s=max(0.0, (as_utc(now) - as_utc(run.updated_at)).total_seconds()),
            ranks=statuses,
            world_size=run.world_size,
            usual_step_s=usual_s,
            progress_quiet_s=(as_utc(now) - max(progress)).total_seconds() if progress else None,
            dropped_spans=dropped,
            dropping=self._dropping(run.id, dropped),
            stragglers=figures.computed.stragglers,
            bubble=figures.computed.bubble,
            regression=figures.computed.regression,
        )
        return evaluate(snapshot, thresholds)

    def _dropping(self, run_id: int, dropped: int) -> bool:
        watch = self._drops.get(run_id)
        if watch is None:  # first sight (or after a restart): the count so far is not news
            self._drops[run_id] = DropWatch(dropped, -float("inf"))
            return False
        if dropped > watch.count:
            watch.count, watch.grew_at = dropped, time.monotonic()
        return time.monotonic() - watch.grew_at < DROPPING_FOR_S

    def _reconcile(self, session: Session, run: Run, found: Sequence[FiringAlert], now: datetime) -> int:
        open_alerts = {
            a.fingerprint: a
            for a in session.scalars(select(Alert).where(Alert.run_id == run.id, Alert.ends_at.is_(None)))
        }
        changed = 0
        seen: set[str] = set()
        for firing in found:
            labels = {"alertname": firing.alertname, "run": run.key, "severity": firing.severity, **firing.labels}
            key = fingerprint(labels)
            if key in seen:
                continue
            seen.add(key)
            annotations = {"summary": firing.summary, "description": firing.description, "action": firing.action}
            alert = open_alerts.get(key)
            if alert is not None:
                if alert.annotations != annotations:
                    alert.annotations = annotations
                    alert.updated_at = now
                continue
            alert = Alert(
                run_id=run.id,
                fingerprint=key,
                alertname=firing.alertname,
                severity=firing.severity,
                labels=labels,
                annotations=annotations,
                evidence_path=f"/runs/{run.key}{firing.evidence}",
                starts_at=now,
                updated_at=now,
            )
            session.add(alert)
            session.flush()
            self._notify(session, alert, "firing")
            changed += 1
        for key, alert in open_alerts.items():
            if key not in seen:
                alert.ends_at = now
                alert.updated_at = now
                self._notify(session, alert, "resolved")
                changed += 1
        return changed

    def _notify(self, session: Session, alert: Alert, status: AlertStatus) -> None:
        enqueue_notifications(session, alert, status, self.settings)
        log.info("bubblescope: alert %s %s for run %s", alert.alertname, status, alert.labels.get("run"))
