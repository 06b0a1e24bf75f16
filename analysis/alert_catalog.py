"""The one registry of alerts: each alert's name, severity, what it means and what to do, the default
thresholds, and, for the alerts Prometheus can raise from ``GET /metrics``, its rule (expression, hold
time, summary and description templates).

Two evaluators read it. The service's own rules (``alert_rules``: a judge per service alert) fire
with the name, severity and runbook text here and figures of their own. The Prometheus rules file,
``deploy/prometheus/bubblescope-rules.yml``, is generated from it (``prometheus_rules``;
``bubblescope prometheus-rules``), its thresholds from ``DEFAULT_THRESHOLDS``, which are also ``serve``'s
defaults. docs/alerts.md and docs/metrics.md list both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

Severity = Literal["critical", "warning", "info"]


@dataclass(frozen=True)
class Thresholds:
    """When the alerts fire; ``serve`` options of the same names (a run overrides them in its config)."""

    silent_after_s: float
    hung_after_s: float
    regression_percent: float
    regression_for_s: float
    bubble_over_floor_points: float
    bubble_for_steps: int
    disabled: frozenset[str] = frozenset()


DEFAULT_THRESHOLDS: Final = Thresholds(
    silent_after_s=120.0,
    hung_after_s=60.0,
    regression_percent=25.0,
    regression_for_s=300.0,
    bubble_over_floor_points=10.0,
    bubble_for_steps=20,
)

RUN_PAGE: Final = "{{ $externalLabels.bubblescope_url }}/runs/{{ $labels.run }}"
SERVICE_PAGE: Final = "{{ $externalLabels.bubblescope_url }}/"


@dataclass(frozen=True)
class PrometheusRule:
    """An alert as a Prometheus rule over ``GET /metrics``; each callable takes the thresholds."""

    expr: Callable[[Thresholds], str]
    when: Callable[[Thresholds], str]  # when it fires, in words (docs/metrics.md)
    summary: str
    description: Callable[[Thresholds], str]
    group: Literal["runs", "service"] = "runs"
    hold: Callable[[Thresholds], float | None] = lambda t: None  # the rule's ``for``, in seconds
    note: Callable[[Thresholds], str] = lambda t: ""  # a comment above the rule

    @property
    def dashboard(self) -> str:
        return RUN_PAGE if self.group == "runs" else SERVICE_PAGE


@dataclass(frozen=True)
class AlertSpec:
    alertname: str
    severity: Severity | None  # None: the series' own (the service's alerts relayed by Prometheus)
    meaning: str  # when it fires
    action: str  # what to do: the runbook line every notification carries
    prometheus: PrometheusRule | None = None
    by_service: bool = True  # the service's own rules raise it (``alert_rules``)


def duration_words(seconds: float) -> str:
    """``300`` as ``5 minutes``, ``90`` as ``90 seconds``."""
    return f"{seconds / 60:.0f} minutes" if seconds % 60 == 0 else f"{seconds:.0f} seconds"


def _ratio(points: float) -> str:
    return f"{points / 100:.2f}"


RUN_FAILED: Final = AlertSpec(
    "BubblescopeRunFailed",
    "critical",
    "A rank ended on an uncaught exception. Names the culprit: the first rank to fail on the aligned "
    "clock, or, when the failures are broken connections or terminations, the rank that went quiet first "
    "without reporting an end (killed by SIGKILL or the OOM killer).",
    "Read this rank's log first, on its host (the alert and the run page name both); the other ranks' errors "
    "are usually its consequence.",
    PrometheusRule(
        expr=lambda t: 'bubblescope_run_state{state="failed"} == 1',
        when=lambda t: "a run's state is `failed`",
        summary="Run {{ $labels.run }} failed",
        description=lambda t: (
            "A rank of run {{ $labels.run }} ended with an error; the run page names the first rank to fail."
        ),
    ),
)
RUN_HUNG: Final = AlertSpec(
    "BubblescopeRunHung",
    "critical",
    "Ranks are alive (the collector's watchdog reports) but no step finished for --hung-after seconds "
    "(or 5 usual steps, if longer). Names the ranks the others wait for and what each rank is blocked "
    "in: the op, its group, its peer, for how long.",
    "Dump the lagging rank's Python stack (py-spy dump --pid PID on its host) and look for a deadlock, "
    "a stuck data loader or I/O, or a collective it never entered; then restart from the last checkpoint.",
)
RUN_SILENT: Final = AlertSpec(
    "BubblescopeRunSilent",
    "warning",
    "Nothing heard from the run for --silent-after seconds and not every rank ended: killed, cut off "
    "from the service, or hung with the watchdog off.",
    "Check whether the job's processes are alive (scheduler, torchrun's log); if they are, check the "
    "network path to this service and the collector's warnings in the job's log.",
    PrometheusRule(
        expr=lambda t: (
            "bubblescope_run_last_heard_seconds\n"
            '  and on (job, instance, run) (bubblescope_run_state{state="silent"} == 1)'
        ),
        when=lambda t: (
            "a run has been `silent` for 1 minute (no rank heard from for --silent-after, and it has not ended)"
        ),
        summary="Run {{ $labels.run }} is silent",
        description=lambda t: (
            "No rank of run {{ $labels.run }} has been heard from for "
            "{{ $value | humanizeDuration }}, and the run has not ended: hung, killed without a word, or cut off "
            "from the service."
        ),
        hold=lambda t: 60,
        note=lambda t: (
            "The service calls a run silent once no rank has been heard from for --silent-after "
            f"({t.silent_after_s:.0f} s by default)."
        ),
    ),
)
STRAGGLER: Final = AlertSpec(
    "BubblescopeStraggler",
    "warning",
    "A rank, host, stage or replica is persistently slower than its peers (the straggler analysis' "
    "persistent verdict).",
    "Look at the flagged host's GPU clocks, temperature and neighbours (thermal throttling, a bad link, a "
    "noisy co-tenant); drain the host if it stays slow.",
    PrometheusRule(
        expr=lambda t: 'bubblescope_run_rank_flagged{reason="Straggler"} == 1',
        when=lambda t: "the service's straggler alert has named a rank for 10 minutes (`bubblescope_run_rank_flagged`)",
        summary="Run {{ $labels.run }}: rank {{ $labels.rank }} on {{ $labels.host }} persistently slow",
        description=lambda t: (
            "The service has flagged rank {{ $labels.rank }} of run {{ $labels.run }}, on host "
            "{{ $labels.host }}, as a persistent straggler for 10 minutes."
        ),
        hold=lambda t: 600,
        note=lambda t: "One series per rank the service's straggler alert names (bubblescope_run_rank_flagged).",
    ),
)
STEP_TIME_REGRESSION: Final = AlertSpec(
    "BubblescopeStepTimeRegression",
    "warning",
    "The median step has been --regression-percent slower than the run's own baseline (its steps after "
    "warm-up) throughout the last --regression-for seconds.",
    "Open the straggler heat map and the newest step's timeline: a slow rank or host, a grown exposed "
    "communication share, or data loading that no longer keeps up.",
    PrometheusRule(
        expr=lambda t: (
            "(\n"
            "  avg_over_time(bubblescope_run_step_seconds[10m])\n"
            "    / avg_over_time(bubblescope_run_step_seconds[1h] offset 30m)\n"
            f") > {1 + t.regression_percent / 100:.2f}\n"
            '  and on (job, instance, run) (bubblescope_run_state{state="running"} == 1)'
        ),
        when=lambda t: (
            f"the last 10 minutes' step time is over {1 + t.regression_percent / 100:.2f}× the run's own average of the hour before the last 30 minutes, for {duration_words(t.regression_for_s)}"
        ),
        summary='Run {{ $labels.run }}: steps {{ $value | printf "%.2f" }}× slower than before',
        description=lambda t: (
            "The median step of run {{ $labels.run }} over the last 10 minutes is "
            '{{ $value | printf "%.2f" }} times its average over the hour before the last 30 minutes.'
        ),
        hold=lambda t: t.regression_for_s,
        note=lambda t: (
            "The last 10 minutes against the same run's hour before the last 30 minutes: a run younger "
            "than 30 minutes has no past to compare with, and does not fire."
        ),
    ),
)
BUBBLE_ABOVE_FLOOR: Final = AlertSpec(
    "BubblescopeBubbleAboveFloor",
    "info",
    "The measured pipeline bubble is --bubble-over-floor-points above the simulator's floor for the "
    "run's schedule and stage costs in each of the newest --bubble-for-steps steps.",
    "Open the run's analysis: the causes of the bubble and the suggested changes.",
    PrometheusRule(
        expr=lambda t: (
            "(bubblescope_run_idle_ratio - bubblescope_run_bubble_floor_ratio) > "
            f"{_ratio(t.bubble_over_floor_points)}\n"
            '  and on (job, instance, run) (bubblescope_run_state{state="running"} == 1)'
        ),
        when=lambda t: (
            f"a running run idles more than {t.bubble_over_floor_points:.0f} points above its schedule's closed-form bubble, for 10 minutes"
        ),
        summary="Run {{ $labels.run }}: bubble {{ $value | humanizePercentage }} above its schedule's floor",
        description=lambda t: (
            "Idle time of run {{ $labels.run }} is {{ $value | humanizePercentage }} of its "
            "ranks' step windows above what its schedule needs for its stages and micro-batches (more than "
            f"{t.bubble_over_floor_points:.0f} points for 10 minutes)."
        ),
        hold=lambda t: 600,
        note=lambda t: (
            "idle_ratio: idle share of the ranks' step windows; bubble_floor_ratio: the schedule's closed form."
        ),
    ),
)
COLLECTOR_DROPPING: Final = AlertSpec(
    "BubblescopeCollectorDropping",
    "warning",
    "The collector's dropped-span count grew lately (a full queue or spool, or refused batches).",
    "Look for 'bubblescope:' warnings in the job's log; raise BUBBLESCOPE_SPOOL_MAX_BYTES, ship full spans "
    "less often (BUBBLESCOPE_FULL_SPANS_EVERY), or check the service's ingest rejections in /metrics.",
    PrometheusRule(
        expr=lambda t: "increase(bubblescope_run_dropped_spans_total[10m]) > 0",
        when=lambda t: "a run's collector dropped spans in the last 10 minutes",
        summary="Run {{ $labels.run }}: the collector dropped spans",
        description=lambda t: (
            "The collector of run {{ $labels.run }} dropped about "
            '{{ $value | printf "%.0f" }} spans in the last 10 minutes (a full queue or spool): timelines and the '
            "analysis miss them."
        ),
    ),
)
RANKS_MISSING: Final = AlertSpec(
    "BubblescopeRanksMissing",
    "warning",
    "Ranks of a running run have sent no step in its newest 20 steps for 5 minutes while the others do.",
    "Compare the run page's rank list with the job's world size; check BUBBLESCOPE_URL and the token on the "
    "missing ranks' hosts.",
    PrometheusRule(
        expr=lambda t: (
            "(bubblescope_run_ranks_expected - bubblescope_run_ranks_reporting) > 0\n"
            '  and on (job, instance, run) (bubblescope_run_state{state="running"} == 1)'
        ),
        when=lambda t: "a running run has fewer ranks reporting than its world size, for 5 minutes",
        summary="Run {{ $labels.run }}: {{ $value }} ranks missing",
        description=lambda t: (
            "{{ $value }} of the ranks of run {{ $labels.run }} have sent no step in its newest "
            "20 steps while the others do: the collector is not initialised there, or those ranks cannot reach the "
            "service."
        ),
        hold=lambda t: 300,
    ),
    by_service=False,
)
SERVICE_ALERT: Final = AlertSpec(
    "BubblescopeServiceAlert",
    None,
    "The service's own rule (named in bubblescope_alert; severity the service's) fires for a run: for a "
    "Prometheus that sends the service's alerts on when the service does not push to Alertmanager itself.",
    "Open the run page: it shows the evidence behind the service's alerts.",
    PrometheusRule(
        expr=lambda t: (
            'label_replace(bubblescope_run_alert_firing == 1, "bubblescope_alert", "$1", "alertname", "(.+)")'
        ),
        when=lambda t: (
            "one of the service's own alerts fires (`bubblescope_run_alert_firing`); its name is in the `bubblescope_alert` label"
        ),
        summary="Run {{ $labels.run }}: {{ $labels.bubblescope_alert }}",
        description=lambda t: (
            "The Bubblescope service's own rule {{ $labels.bubblescope_alert }} is firing for run "
            "{{ $labels.run }} (severity {{ $labels.severity }}); the service's /api/v1 alerts carry its figures."
        ),
        note=lambda t: (
            "Prometheus sets `alertname` to this rule's; the original is kept in `bubblescope_alert`. "
            "docker-compose.yml drops these at Prometheus (alert_relabel_configs): there the service pushes."
        ),
    ),
    by_service=False,
)
TARGET_DOWN: Final = AlertSpec(
    "BubblescopeTargetDown",
    "critical",
    "Prometheus cannot scrape the service for 5 minutes: down, unreachable, or refusing the read token "
    "(every other rule here is then blind).",
    "Check the service (GET /api/v1/health) and the scrape's last error on Prometheus's targets page.",
    PrometheusRule(
        expr=lambda t: 'up{job="bubblescope"} == 0',
        when=lambda t: "the scrape has failed for 5 minutes (also: a wrong read token)",
        summary="Prometheus cannot scrape Bubblescope at {{ $labels.instance }}",
        description=lambda t: (
            "The scrape of {{ $labels.instance }} has failed for 5 minutes: the service is down, "
            "unreachable, or refuses the read token."
        ),
        group="service",
        hold=lambda t: 300,
        note=lambda t: "Also what a wrong read token looks like (401 on /metrics): every other rule here is blind.",
    ),
    by_service=False,
)
INGEST_REJECTIONS: Final = AlertSpec(
    "BubblescopeIngestRejections",
    "warning",
    "More than 5% of ingest batches refused for one reason over 5 minutes, for 10 minutes.",
    "docs/limits.md names each reason: raise the limit, scale the service, or fix the database.",
    PrometheusRule(
        expr=lambda t: (
            "sum by (job, instance, reason) (rate(bubblescope_ingest_rejected_batches_total[5m]))\n"
            "  / on (job, instance) group_left ()\n"
            "(\n"
            "  sum by (job, instance) (rate(bubblescope_ingest_rejected_batches_total[5m]))\n"
            "    + sum by (job, instance) (rate(bubblescope_ingest_batches_total[5m]))\n"
            ")\n"
            "> 0.05"
        ),
        when=lambda t: "over 5% of ingest batches are refused for one reason, for 10 minutes",
        summary="Bubblescope at {{ $labels.instance }} refuses {{ $value | humanizePercentage }} of ingest batches "
        "({{ $labels.reason }})",
        description=lambda t: (
            "{{ $value | humanizePercentage }} of the ingest batches {{ $labels.instance }} "
            "received over 5 minutes were refused with {{ $labels.reason }}. busy and database_unavailable are retried "
            "by the collector (the service or its database is short of capacity); the others are dropped."
        ),
        group="service",
        hold=lambda t: 600,
        note=lambda t: "Refused batches as a share of all batches (stored + refused), by the refusal's reason.",
    ),
    by_service=False,
)
ALERT_DELIVERY_FAILING: Final = AlertSpec(
    "BubblescopeAlertDeliveryFailing",
    "critical",
    "Deliveries of the service's own alerts to a target (Alertmanager, a webhook) failed in the last 15 "
    "minutes, for 10 minutes: nobody is being told.",
    "Check that the target (Alertmanager, webhook) is up and reachable from the service, and the service's log "
    "for the error.",
    PrometheusRule(
        expr=lambda t: (
            "sum by (job, instance, target) (\n"
            '  increase(bubblescope_alert_deliveries_total{outcome!~"delivered|sent|success|ok"}[15m])\n'
            ") > 0"
        ),
        when=lambda t: "deliveries of the service's own alerts to a target keep failing, for 10 minutes",
        summary="Bubblescope cannot deliver alerts to {{ $labels.target }}",
        description=lambda t: (
            '{{ $value | printf "%.0f" }} deliveries of the service\'s own alerts to '
            "{{ $labels.target }} failed in the last 15 minutes: the service keeps them and retries, but nobody is "
            "being told."
        ),
        group="service",
        hold=lambda t: 600,
        note=lambda t: "Any outcome that is not a delivery counts as a failure.",
    ),
    by_service=False,
)
AUTH_FAILURES_BURST: Final = AlertSpec(
    "BubblescopeAuthFailuresBurst",
    "warning",
    "More than 20 requests refused by serve --auth for one reason in 5 minutes.",
    "Find the caller in the service's access log; issue it a token of the right scope (bubblescope token create).",
    PrometheusRule(
        expr=lambda t: "sum by (job, instance, reason) (increase(bubblescope_auth_failures_total[5m])) > 20",
        when=lambda t: "more than 20 requests refused for one reason in 5 minutes",
        summary='Bubblescope at {{ $labels.instance }}: {{ $value | printf "%.0f" }} refused requests '
        "({{ $labels.reason }})",
        description=lambda t: (
            '{{ $value | printf "%.0f" }} requests to {{ $labels.instance }} were refused in 5 '
            "minutes for {{ $labels.reason }}: a job or a scraper with a missing, revoked or wrong-scope token, or "
            "someone guessing."
        ),
        group="service",
    ),
    by_service=False,
)

CATALOG: Final[tuple[AlertSpec, ...]] = (
    RUN_FAILED,
    RUN_HUNG,
    RUN_SILENT,
    STRAGGLER,
    STEP_TIME_REGRESSION,
    BUBBLE_ABOVE_FLOOR,
    COLLECTOR_DROPPING,
    RANKS_MISSING,
    SERVICE_ALERT,
    TARGET_DOWN,
    INGEST_REJECTIONS,
    ALERT_DELIVERY_FAILING,
    AUTH_FAILURES_BURST,
)
