"""deploy/prometheus/ as Debian's Prometheus reads it: ``promtool check config`` and ``check rules``, the
rules' unit tests (``promtool test rules``), and a real Prometheus and Alertmanager started the way
docker-compose.yml starts them, scraping with the read token from its secret file and sending what fires."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from bubblescope.analysis import DEFAULT_THRESHOLDS, prometheus_rules
from bubblescope.analysis.alert_catalog import CATALOG
from bubblescope.backend.settings import ServiceSettings
from tests.deploy.files import compose
from tests.support import REPO, free_port, require_program, wait_until

PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"
ALERTMANAGER = "/usr/bin/prometheus-alertmanager"
FOLDER = REPO / "deploy" / "prometheus"
RULES = FOLDER / "bubblescope-rules.yml"
RULES_TEST = FOLDER / "bubblescope-rules.test.yml"
SECRET = "/run/secrets/bubblescope_read_token"
READ_TOKEN = "bs_read-0123456789abcdefghijklmnopqrstuvwxyzABC"
EXTERNAL_URL = "https://bubblescope.example.org"


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    require_program(PROMTOOL, "prometheus")
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def config_copy(folder: Path, replacements: dict[str, str] | None = None) -> Path:
    """prometheus.yml and its rules in ``folder``, the secret file the container gets from compose written
    there (with the read token) and its path replaced, and the other ``replacements`` made."""
    text = (FOLDER / "prometheus.yml").read_text()
    token_file = folder / "bubblescope_read_token"
    token_file.write_text(READ_TOKEN)  # compose writes the variable's value, without a newline
    for old, new in {SECRET: str(token_file), **(replacements or {})}.items():
        assert old in text, f"prometheus.yml has no {old!r} any more"
        text = text.replace(old, new)
    for rule_file in yaml.safe_load(text)["rule_files"]:
        shutil.copyfile(FOLDER / rule_file, folder / rule_file)
    config = folder / "prometheus.yml"
    config.write_text(text)
    return config


def test_promtool_checks_the_config_with_its_rules_and_secret(tmp_path: Path) -> None:
    checked = promtool("check", "config", str(config_copy(tmp_path)))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "1 rule files found" in checked.stdout and f"{len(rules())} rules found" in checked.stdout


def test_the_rules_file_is_the_one_the_alert_registry_generates() -> None:
    """One registry (analysis/alert_catalog.py) for the service's alerts and these rules: names, severities,
    runbook lines and thresholds (serve's defaults) come from it, none is written here by hand."""
    assert RULES.read_text() == prometheus_rules(), "regenerate: bubblescope prometheus-rules > " + str(
        RULES.relative_to(REPO)
    )
    by_name = {spec.alertname: spec for spec in CATALOG}
    for rule in rules():
        spec = by_name[rule["alert"]]
        assert rule.get("labels", {}).get("severity") == spec.severity
        assert rule["annotations"]["action"] == spec.action
    assert "> 1.25" in RULES.read_text() and "> 0.10" in RULES.read_text()  # 25 % and 10 points: serve's defaults
    assert DEFAULT_THRESHOLDS.regression_percent == ServiceSettings().regression_percent == 25


def test_the_rules_follow_the_thresholds_they_are_given() -> None:
    stricter = replace(DEFAULT_THRESHOLDS, regression_percent=40, regression_for_s=900, bubble_over_floor_points=5)
    text = prometheus_rules(stricter)
    assert "> 1.40" in text and "for: 15m" in text and "> 0.05" in text and "more than 5 points" in text
    done = subprocess.run(
        [sys.executable, "-m", "bubblescope.cli", "prometheus-rules", "--regression-percent", "40", "--regression-for",
         "900", "--bubble-over-floor-points", "5"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert done.stdout == text


def test_promtool_checks_the_rules() -> None:
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_rules_pass_their_unit_tests() -> None:
    tested = promtool("test", "rules", str(RULES_TEST))
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("> 0.10", "> 0.03"),  # the bubble rule would fire for the run 5 points above its floor
        ("> 1.25", "> 1.05"),  # the regression rule would fire on the healthy run's slow drift
        ('(bubblescope_run_state{state="running"} == 1)', '(bubblescope_run_state{state="running"} >= 0)'),
        ("> 0.05", "> 0.005"),  # the refusal rule would fire for the healthy service's 1% busy refusals
    ],
    ids=["bubble-threshold", "regression-threshold", "finished-runs", "rejection-threshold"],
)
def test_the_unit_tests_catch_a_loosened_rule(old: str, new: str, tmp_path: Path) -> None:
    text = RULES.read_text()
    assert old in text
    (tmp_path / RULES.name).write_text(text.replace(old, new))
    shutil.copyfile(RULES_TEST, tmp_path / RULES_TEST.name)
    tested = promtool("test", "rules", str(tmp_path / RULES_TEST.name))
    assert tested.returncode != 0, tested.stdout


def test_every_rule_has_a_severity_a_summary_a_link_and_a_unit_test() -> None:
    tests = yaml.safe_load(RULES_TEST.read_text())["tests"]
    cases = [case for test in tests for case in test["alert_rule_test"]]
    fired = {case["alertname"] for case in cases if case.get("exp_alerts")}
    quiet = {case["alertname"] for case in cases if not case.get("exp_alerts")}
    documented = (REPO / "docs" / "metrics.md").read_text()
    for rule in rules():
        name = rule["alert"]
        # BubblescopeServiceAlert keeps the severity the service gave its own alert.
        assert (
            rule.get("labels", {}).get("severity") in {"critical", "warning", "info"} or "alert_firing" in rule["expr"]
        )
        annotations = rule["annotations"]
        assert {"summary", "description", "action", "dashboard"} <= set(annotations), name
        assert annotations["dashboard"].startswith("{{ $externalLabels.bubblescope_url }}/"), name
        if "$labels.run" in annotations["summary"]:
            assert annotations["dashboard"].endswith("/runs/{{ $labels.run }}"), name
        assert name in fired, f"{name}: no unit test where it fires"
        assert name in quiet, f"{name}: no unit test where it must not fire"
        assert f"`{name}`" in documented, f"{name} is not listed in docs/metrics.md"


def test_dashboard_links_are_the_run_page() -> None:
    """The run page is served at /runs/{key} (backend/web/router.py)."""
    assert '@router.get("/runs/{run_key}")' in (REPO / "backend" / "web" / "router.py").read_text()


# ---- A real Prometheus and Alertmanager -----------------------------------------------------------------

EXPOSITION = """\
# HELP bubblescope_run_state 1 for the run's state
# TYPE bubblescope_run_state gauge
bubblescope_run_state{run="bad",state="running"} 0
bubblescope_run_state{run="bad",state="failed"} 1
# HELP bubblescope_run_alert_firing 1 per firing alert of the service's own rules
# TYPE bubblescope_run_alert_firing gauge
bubblescope_run_alert_firing{run="r1",alertname="RunHung",severity="critical"} 1
"""


@dataclass
class Target:
    """A stand-in for the service's /metrics that, like ``serve --auth``, wants a bearer token."""

    url: str
    authorizations: list[str | None] = field(default_factory=list)


@pytest.fixture
def target() -> Iterator[Target]:
    seen: list[str | None] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization"))
            ok = self.path == "/metrics" and self.headers.get("Authorization") == f"Bearer {READ_TOKEN}"
            body = EXPOSITION.encode() if ok else b"unauthorized\n"
            self.send_response(200 if ok else 401)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Target(f"127.0.0.1:{server.server_address[1]}", seen)
    finally:
        server.shutdown()
        server.server_close()


def container_command(service: dict[str, Any], paths: dict[str, str], listen: str) -> list[str]:
    """The service's command with the container's paths mapped to ``paths`` and a loopback listen address."""
    words = []
    for word in service["command"]:
        name, sep, value = word.partition("=")
        words.append(f"{name}={paths[value]}" if sep and value in paths else word)
    return [*words, f"--web.listen-address={listen}"]


@contextmanager
def started(command: list[str], url: str, log_path: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """A process running ``command`` until the block ends, once ``url``/-/ready answers 200."""
    log = open(log_path, "wb")  # noqa: SIM115 (the process writes it until it stops)
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)

    def ready() -> bool:
        assert process.poll() is None, log_path.read_text()[-3000:]
        try:
            return httpx.get(f"{url}/-/ready", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(ready, 60, f"{command[0]} to start", interval_s=0.2)
        yield url
    finally:
        process.terminate()
        process.wait(30)
        log.close()


def test_prometheus_scrapes_with_the_secret_and_sends_alerts_as_compose_runs_it(target: Target, tmp_path: Path) -> None:
    require_program(PROMETHEUS, "prometheus")
    require_program(ALERTMANAGER, "prometheus-alertmanager")
    stack = compose(
        {
            "BUBBLESCOPE_DB_PASSWORD": "x",
            "BUBBLESCOPE_ADMIN_TOKEN": "x",
            "BUBBLESCOPE_INGEST_TOKEN": "x",
            "BUBBLESCOPE_READ_TOKEN": READ_TOKEN,
            "BUBBLESCOPE_EXTERNAL_URL": EXTERNAL_URL,
        }
    )
    prometheus_port, alertmanager_port = free_port(), free_port()
    (tmp_path / "prometheus").mkdir()
    config = config_copy(
        tmp_path / "prometheus",
        {
            "api:8765": target.url,
            "alertmanager:9093": f"127.0.0.1:{alertmanager_port}",
            "localhost:9090": f"127.0.0.1:{prometheus_port}",
            "scrape_interval: 15s": "scrape_interval: 1s",
            "evaluation_interval: 15s": "evaluation_interval: 1s",
        },
    )
    am_service = stack["services"]["alertmanager"]
    am_command = container_command(
        am_service,
        {
            "/etc/alertmanager/alertmanager.yml": str(REPO / "deploy" / "alertmanager" / "alertmanager.yml"),
            "/alertmanager": str(tmp_path / "alertmanager-data"),
        },
        f"127.0.0.1:{alertmanager_port}",
    )
    prometheus_service = stack["services"]["prometheus"]
    prometheus_command = container_command(
        prometheus_service,
        {"/etc/prometheus/prometheus.yml": str(config), "/prometheus": str(tmp_path / "prometheus-data")},
        f"127.0.0.1:{prometheus_port}",
    )
    prometheus_env = {"PATH": os.environ["PATH"], **prometheus_service["environment"]}
    with (
        started([ALERTMANAGER, *am_command], f"http://127.0.0.1:{alertmanager_port}", tmp_path / "am.log") as am,
        started(
            [PROMETHEUS, *prometheus_command],
            f"http://127.0.0.1:{prometheus_port}",
            tmp_path / "prometheus.log",
            prometheus_env,
        ) as prometheus,
    ):

        def received() -> list[dict[str, Any]]:
            alerts: list[dict[str, Any]] = httpx.get(f"{am}/api/v2/alerts", timeout=5).json()
            return alerts

        wait_until(
            lambda: any(alert["labels"]["alertname"] == "BubblescopeRunFailed" for alert in received()),
            60,
            "Alertmanager to receive BubblescopeRunFailed",
            interval_s=0.2,
        )
        rule_alerts = httpx.get(f"{prometheus}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
        delivered = received()

    # Scraped with the read token from the secret file, every time.
    assert target.authorizations and set(target.authorizations) == {f"Bearer {READ_TOKEN}"}
    (failed,) = [alert for alert in delivered if alert["labels"]["alertname"] == "BubblescopeRunFailed"]
    assert failed["labels"]["run"] == "bad" and failed["labels"]["severity"] == "critical"
    # The external label, expanded from the environment, is on the alert and starts its dashboard link.
    assert failed["labels"]["bubblescope_url"] == EXTERNAL_URL
    assert failed["annotations"]["dashboard"] == f"{EXTERNAL_URL}/runs/bad"
    # The forwarded copy of the service's own alert fires in Prometheus, evaluated in the same group and
    # sent in the same batch, but is dropped on its way: the service pushes the original itself.
    forwarded = [alert for alert in rule_alerts if alert["labels"]["alertname"] == "BubblescopeServiceAlert"]
    assert forwarded and forwarded[0]["state"] == "firing" and forwarded[0]["labels"]["bubblescope_alert"] == "RunHung"
    assert not [alert for alert in delivered if alert["labels"]["alertname"] == "BubblescopeServiceAlert"]
