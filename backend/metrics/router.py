"""GET /metrics: the service's own metrics and the per-run series, in the Prometheus text format.

The per-run series are rendered in the background (``runs.RunSeries``) and appended as they are: a scrape
reads no database and costs the same at 10 runs or 10,000.
"""

from __future__ import annotations

from collections.abc import Iterator

from fastapi import APIRouter, FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

from bubblescope.backend.background import PeriodicTask
from bubblescope.backend.derived.figures import FigureCache
from bubblescope.backend.metrics.runs import RunSeries, SnapshotMetrics
from bubblescope.backend.service_metrics import SERVICE_REGISTRY
from bubblescope.backend.settings import ServiceSettings

router = APIRouter(tags=["meta"])
METRICS_TASK = "metrics"


class _ServiceMetrics(Collector):
    def collect(self) -> Iterator[Metric]:
        yield from SERVICE_REGISTRY.collect()


def install_run_series(app: FastAPI, figures: FigureCache | None) -> RunSeries:
    """The per-run series, refreshed every ``--metrics-interval`` and after news of a run (ingest), no sooner
    than ``RunSeries.pause_after`` after the last refresh, in every process (each serves its own scrapes); and
    what one app serves at /metrics besides them."""
    settings: ServiceSettings = app.state.settings
    series = RunSeries(app.state.session_factory, settings, figures)
    task = PeriodicTask(METRICS_TASK, settings.metrics_interval_s, series.refresh, series.pause_after)
    app.state.background.add(task, on_news=True, every_process=True)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ServiceMetrics())
    registry.register(SnapshotMetrics(series))
    app.state.metrics = registry
    app.state.run_series = series
    return series


@router.get(
    "/metrics",
    response_class=Response,
    summary="Prometheus metrics: ingest, refusals, and per recent run its state, step time, idle and floors",
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "the Prometheus text format"}},
)
def metrics(request: Request) -> Response:
    snapshot = request.app.state.run_series.current()
    runs = b"" if snapshot is None else snapshot.text
    return Response(generate_latest(request.app.state.metrics) + runs, media_type=CONTENT_TYPE_LATEST)
