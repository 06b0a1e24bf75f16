"""The service's own metrics (one home): what ingest did, how long it took, what it refused.

They live in ``SERVICE_REGISTRY``, not prometheus_client's global one, so two apps in one process
(the tests) count apart from library defaults; ``GET /metrics`` serves them beside the per-run
series. They count in this process: behind a load balancer each ``serve`` process is its own target.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

SERVICE_REGISTRY = CollectorRegistry(auto_describe=True)

INGEST_BATCHES = Counter(
    "bubblescope_ingest_batches", "Ingest batches stored (a retried batch counts once)", registry=SERVICE_REGISTRY
)
INGEST_SPANS = Counter("bubblescope_ingest_spans", "Spans stored by ingest", registry=SERVICE_REGISTRY)
INGEST_DURATION = Histogram(
    "bubblescope_ingest_duration_seconds",
    "Time to answer an ingest request, from its first byte read to its answer (refusals included)",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=SERVICE_REGISTRY,
)
INGEST_REJECTED = Counter(
    "bubblescope_ingest_rejected_batches",
    "Ingest batches refused, by the error's type (too_large, busy, database_unavailable, value_error, ...)",
    ["reason"],
    registry=SERVICE_REGISTRY,
)
