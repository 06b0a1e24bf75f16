"""GET /metrics as Prometheus reads it: Debian's real ``prometheus`` scrapes a real service, and
``promtool check metrics`` lints the exposition; the series per run do not grow with its ranks."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.dashboard.synthetic import synthetic_run
from tests.support import LiveServer, free_port, require_program, scrape_until, wait_until

PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"


def series(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [
        (sample.name, sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def test_the_exposition_follows_prometheus_conventions(sqlite_server: LiveServer) -> None:
    with sqlite_server.client() as client:
        key = synthetic_run(client, stages=4, microbatches=4, steps=6)
        text = scrape_until(client, lambda text: f'bubblescope_run_ranks_reporting{{run="{key}"}} 4.0' in text)
    names = {name for name, _, _ in series(text)}
    assert all(name.startswith("bubblescope_") for name in names), names
    assert {"bubblescope_ingest_batches_total", "bubblescope_ingest_spans_total"} <= names
    assert "bubblescope_ingest_duration_seconds_bucket" in names
    run = {name: value for name, labels, value in series(text) if labels.get("run") == key}
    assert run["bubblescope_run_ranks_expected"] == 4 and run["bubblescope_run_ranks_reporting"] == 4
    assert 0 < run["bubblescope_run_step_seconds"] < 10
    assert 0 <= run["bubblescope_run_idle_ratio"] <= 1 and 0 <= run["bubblescope_run_exposed_comm_ratio"] <= 1
    assert run["bubblescope_run_bubble_floor_ratio"] == pytest.approx(3 / 7)  # GPipe, p=4, m=4
    states = {
        labels["state"]: value
        for name, labels, value in series(text)
        if name == "bubblescope_run_state" and labels["run"] == key
    }
    assert states == {"running": 1, "hung": 0, "finished": 0, "failed": 0, "silent": 0}
    if shutil.which(PROMTOOL):
        linted = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
        assert linted.returncode == 0, linted.stdout + linted.stderr


# Series that come with the alert rules' work, whose timing no scrape controls: the bubble figures
# (two, once computed) and one per firing alert and per rank a firing alert names.
FROM_THE_RULES = (
    "bubblescope_run_bubble_ratio",
    "bubblescope_run_bubble_simulated_floor_ratio",
    "bubblescope_run_alert_firing",
    "bubblescope_run_rank_flagged",
)


def test_series_per_run_do_not_grow_with_its_ranks(sqlite_server: LiveServer) -> None:
    with sqlite_server.client() as client:
        small = synthetic_run(client, stages=2, microbatches=2, steps=3)
        large = synthetic_run(client, stages=64, microbatches=2, steps=3)
        text = scrape_until(client, lambda text: f'bubblescope_run_ranks_reporting{{run="{large}"}} 64.0' in text)
    samples = [(name, labels) for name, labels, _ in series(text)]
    counted = {
        key: sum(1 for name, labels in samples if labels.get("run") == key and name not in FROM_THE_RULES)
        for key in (small, large)
    }
    assert counted[small] == counted[large], counted
    for key in (small, large):
        alerts = sum(1 for name, labels in samples if labels.get("run") == key and name == FROM_THE_RULES[2])
        flagged = sum(1 for name, labels in samples if labels.get("run") == key and name == FROM_THE_RULES[3])
        figures = sum(1 for name, labels in samples if labels.get("run") == key and name in FROM_THE_RULES[:2])
        assert figures <= 2 and flagged <= alerts, (key, figures, alerts, flagged)


@pytest.fixture
def prometheus(sqlite_server: LiveServer, tmp_path: Path) -> Iterator[str]:
    require_program(PROMETHEUS, "prometheus")
    port = free_port()
    target = httpx.URL(sqlite_server.url)
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n"
        "scrape_configs:\n  - job_name: bubblescope\n"
        f"    static_configs:\n      - targets: ['{target.host}:{target.port}']\n"
    )
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 (prometheus writes it until it stops)
    process = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        assert process.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
        try:
            return httpx.get(f"{url}/-/ready", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(ready, 60, "prometheus to start", interval_s=0.2)
        yield url
    finally:
        process.terminate()
        process.wait(30)
        log.close()


def query(prometheus: str, expression: str) -> list[dict[str, Any]]:
    answer = httpx.get(f"{prometheus}/api/v1/query", params={"query": expression}, timeout=10).json()
    assert answer["status"] == "success", answer
    return list(answer["data"]["result"])


def test_prometheus_scrapes_the_service_and_reads_each_run(sqlite_server: LiveServer, prometheus: str) -> None:
    with sqlite_server.client() as client:
        key = synthetic_run(client, stages=4, microbatches=4, steps=5)
    running = f'bubblescope_run_state{{run="{key}",state="running"}}'
    deadline = time.monotonic() + 60
    while not query(prometheus, running) and time.monotonic() < deadline:
        time.sleep(0.5)
    (sample,) = query(prometheus, running)
    assert sample["value"][1] == "1"
    assert query(prometheus, 'up{job="bubblescope"}')[0]["value"][1] == "1"
    (expected,) = query(prometheus, f'bubblescope_run_ranks_expected{{run="{key}"}}')
    assert expected["value"][1] == "4"
    (batches,) = query(prometheus, "bubblescope_ingest_batches_total")
    assert float(batches["value"][1]) >= 4
