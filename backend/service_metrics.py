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
ALERT_DELIVERIES = Counter(
    "bubblescope_alert_deliveries",
    "Alert notifications by target (webhook, alertmanager) and outcome: delivered; failed (an attempt that "
    "will be retried); given_up (a webhook refused for good, or past its retry window)",
    ["target", "outcome"],
    registry=SERVICE_REGISTRY,
)
ALERT_DELIVERY_SERIES = (
    ("webhook", "delivered"),
    ("webhook", "failed"),
    ("webhook", "given_up"),
    ("alertmanager", "delivered"),
    ("alertmanager", "failed"),
)
for _target, _outcome in ALERT_DELIVERY_SERIES:
    ALERT_DELIVERIES.labels(_target, _outcome)  # every series exported from the start, at 0

AUTH_FAILURES = Counter(
    "bubblescope_auth_failures",
    "Requests refused by serve --auth, by reason (missing, malformed, unknown, revoked, wrong_scope, wrong_run, untrusted_proxy, throttled)",
    ["reason"],
    registry=SERVICE_REGISTRY,
)
AUTH_FAILURE_REASONS = (
    "missing",
    "malformed",
    "unknown",
    "revoked",
    "wrong_scope",
    "wrong_run",
    "untrusted_proxy",
    "throttled",
)
for _reason in AUTH_FAILURE_REASONS:
    AUTH_FAILURES.labels(_reason)  # every series exported from the start, at 0
