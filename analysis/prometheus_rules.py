"""The Prometheus rules file, written from the alert registry (``alert_catalog``): what
``deploy/prometheus/bubblescope-rules.yml`` holds and ``bubblescope prometheus-rules`` prints, with
``serve``'s default thresholds or others. YAML written by hand (the analysis imports no YAML library):
every string double-quoted as JSON, which YAML reads back the same; multi-line expressions as blocks."""

from __future__ import annotations

import json

from bubblescope.analysis.alert_catalog import CATALOG, DEFAULT_THRESHOLDS, AlertSpec, PrometheusRule, Thresholds

HEADER = """\
# Prometheus alerting rules over Bubblescope's GET /metrics (docs/metrics.md#alerting-from-prometheus).
#
# Generated from the service's alert registry (analysis/alert_catalog.py) by `bubblescope prometheus-rules`,
# with the thresholds of `serve`'s defaults; do not edit by hand: change the registry, or regenerate with
# your own thresholds (`bubblescope prometheus-rules --help`). tests/deploy/test_prometheus.py checks that
# this file is the generated one, runs `promtool check rules` on it, and its unit test
# (deploy/prometheus/bubblescope-rules.test.yml, `promtool test rules`).
#
# For deployments that alert from Prometheus rather than (or as well as) the service's own rules
# (`serve --alertmanager-url`): the same names, severities and runbook lines as the service's alerts.
#
# Assumptions, to adapt where yours differ:
# - the scrape job is named "bubblescope" (BubblescopeTargetDown);
# - Prometheus has the external label `bubblescope_url`, the service's address as people reach it
#   (docker-compose.yml sets it from BUBBLESCOPE_EXTERNAL_URL): the alerts' `dashboard` links are
#   <bubblescope_url>/runs/<run>, the run's page.
#
# Severity: `critical` pages (the run is dead, or the alerts' own path is broken), `warning` goes to a
# channel (the run is alive but wasting time, or data is missing), `info` is for a dashboard or a ticket.
#
# The per-run gauges are over the run's newest 20 steps, and a run leaves /metrics 6 hours after it was
# last heard from, which resolves whatever fired for it.
"""
GROUPS = (("runs", "bubblescope-runs"), ("service", "bubblescope-service"))


def prometheus_rules(thresholds: Thresholds = DEFAULT_THRESHOLDS) -> str:
    """The rules file's text."""
    lines = [HEADER, "groups:"]
    for group, name in GROUPS:
        lines += [f"  - name: {name}", "    rules:"]
        rules = [(spec, spec.prometheus) for spec in CATALOG if spec.prometheus and spec.prometheus.group == group]
        for at, (spec, rule) in enumerate(rules):
            if at:
                lines.append("")
            lines += _rule(spec, rule, thresholds)
        lines.append("")
    return "\n".join(lines[:-1]) + "\n"


def _rule(spec: AlertSpec, rule: PrometheusRule, t: Thresholds) -> list[str]:
    out = [f"      # {line}" for line in _wrapped(rule.note(t))]
    out.append(f"      - alert: {spec.alertname}")
    expr = rule.expr(t)
    if "\n" in expr:
        out.append("        expr: |")
        out += [f"          {line}" for line in expr.splitlines()]
    else:
        out.append(f"        expr: {expr}")
    hold = rule.hold(t)
    if hold is not None:
        out.append(f"        for: {duration(hold)}")
    if spec.severity is not None:
        out += ["        labels:", f"          severity: {spec.severity}"]
    out.append("        annotations:")
    annotations = {
        "summary": rule.summary,
        "description": rule.description(t),
        "action": spec.action,
        "dashboard": rule.dashboard,
    }
    out += [f"          {key}: {json.dumps(value, ensure_ascii=False)}" for key, value in annotations.items()]
    return out


def duration(seconds: float) -> str:
    """Seconds as a Prometheus duration: ``300`` is ``5m``, ``90`` is ``90s``, ``7200`` is ``2h``."""
    whole = round(seconds)
    for unit, size in (("h", 3600), ("m", 60)):
        if whole >= size and whole % size == 0:
            return f"{whole // size}{unit}"
    return f"{whole}s"


def _wrapped(text: str, width: int = 104) -> list[str]:
    lines: list[str] = []
    for word in text.split():
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines


def prometheus_rules_table(thresholds: Thresholds = DEFAULT_THRESHOLDS) -> str:
    """The Markdown table of docs/metrics.md: each rule of the file, and whether the service raises it too."""
    rows = ["| alert | severity | fires when | the service's own rules |", "|---|---|---|---|"]
    rows += [
        f"| `{spec.alertname}` | {spec.severity or 'the service’s'} | {spec.prometheus.when(thresholds)} | "
        f"{'raise it too' if spec.by_service else '—'} |"
        for spec in CATALOG
        if spec.prometheus is not None
    ]
    return "\n".join(rows) + "\n"
