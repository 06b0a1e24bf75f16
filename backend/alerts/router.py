"""GET /api/v1/alerts: the alerts the service's rules raised, firing or resolved, in Alertmanager's shape."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, FastAPI, Query, Request
from sqlalchemy import select

from bubblescope import wire
from bubblescope.backend.alerts.delivery import DELIVERY_TASK
from bubblescope.backend.alerts.evaluator import ALERT_TASK, AlertEvaluator
from bubblescope.backend.alerts.schemas import AlertList, AlertOut
from bubblescope.backend.alerts.shape import alert_document
from bubblescope.backend.background import PeriodicTask
from bubblescope.backend.caller import require_run_in_scope, run_scope_of
from bubblescope.backend.db.models import Alert, Run
from bubblescope.backend.db.session import DbSession
from bubblescope.backend.derived.figure_worker import FigureWorker, can_run_apart
from bubblescope.backend.errors import NotFound
from bubblescope.backend.fields import RUN_KEY_PATTERN
from bubblescope.backend.settings import ServiceSettings, settings_of
from bubblescope.backend.store import runs as run_queries

router = APIRouter(prefix=wire.API_PREFIX, tags=["alerts"])
MAX_ALERTS = 1000


@router.get(
    "/alerts",
    response_model=AlertList,
    summary="Alerts raised by the service's rules (docs/alerts.md), newest first",
    responses={404: {"description": "No run with the key given as `run`"}},
)
def list_alerts(
    request: Request,
    session: DbSession,
    state: Annotated[
        list[Literal["firing", "resolved"]] | None, Query(description="firing, resolved (repeat for both)")
    ] = None,
    run: Annotated[
        str | None,
        Query(min_length=1, max_length=128, pattern=RUN_KEY_PATTERN, description="only this run's alerts (its key)"),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_ALERTS)] = 100,
) -> AlertList:
    query = select(Alert, Run.key).join(Run, Run.id == Alert.run_id)
    scope = run_scope_of(request)
    if scope is not None:  # a token bound to runs sees their alerts alone
        query = query.where(run_queries.keys_in_scope(scope))
    if run is not None:
        require_run_in_scope(request, run, ("query", "run"))
        found = run_queries.find_run(session, run)
        if found is None:
            raise NotFound("run", f"no run with key {run!r}")
        query = query.where(Alert.run_id == found.id)
    states = set(state or ("firing", "resolved"))
    if states == {"firing"}:
        query = query.where(Alert.ends_at.is_(None))
    elif states == {"resolved"}:
        query = query.where(Alert.ends_at.is_not(None))
    rows = session.execute(query.order_by(Alert.starts_at.desc(), Alert.id.desc()).limit(limit)).all()
    external = settings_of(request).external_url or str(request.base_url)
    return AlertList(alerts=[AlertOut(id=alert.id, run=key, **alert_document(alert, external)) for alert, key in rows])


def install_alert_rules(app: FastAPI) -> AlertEvaluator:
    """The rules' background task (``ALERT_TASK``): every ``--alert-interval``, and at a run's news."""
    settings: ServiceSettings = app.state.settings
    db_url = app.state.engine.url.render_as_string(hide_password=False)
    worker = FigureWorker(db_url) if can_run_apart(db_url) else None  # the costly figures off the serving GIL
    evaluator = AlertEvaluator(
        app.state.session_factory,
        settings,
        lambda: app.state.background.wake(DELIVERY_TASK),
        worker.compute if worker is not None else None,
    )
    if worker is not None:
        app.state.background.on_stop(worker.close)
    app.state.background.add(PeriodicTask(ALERT_TASK, settings.alert_interval_s, evaluator.run_round), on_news=True)
    app.state.alerts = evaluator
    return evaluator
