"""GET /metrics: the service's own metrics and the per-run series, in the Prometheus text format."""

from __future__ import annotations

from collections.abc import Iterator

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

from bubblescope.backend.metrics.runs import RunMetrics
from bubblescope.backend.service_metrics import SERVICE_REGISTRY

router = APIRouter(tags=["meta"])


class _ServiceMetrics(Collector):
    def collect(self) -> Iterator[Metric]:
        yield from SERVICE_REGISTRY.collect()


def metrics_registry(run_metrics: RunMetrics) -> CollectorRegistry:
    """What one app serves at /metrics (``create_app`` builds it)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ServiceMetrics())
    registry.register(run_metrics)
    return registry


@router.get(
    "/metrics",
    response_class=Response,
    summary="Prometheus metrics: ingest, refusals, and per recent run its state, step time, idle and floors",
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "the Prometheus text format"}},
)
def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.metrics), media_type=CONTENT_TYPE_LATEST)
