"""/metrics with many recent runs: the per-run series come from memory (rendered in the background), at most
``--metrics-max-runs`` of them, runs with a firing alert first; the gauges say how many were left out. Real
server, SQLite, 10,000 runs heard from in the last minutes."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

from sqlalchemy import insert

from bubblescope.backend.db import migrate
from bubblescope.backend.db.engine import build_engine
from bubblescope.backend.db.models import Run
from tests.support import register, scrape_until, start_server, wait_until

RUNS = 10_000
CAP = 100


def _gauge(text: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    assert found, f"{name} is not in the scrape"
    return float(found.group(1))


def test_a_scrape_at_10000_runs_exports_the_cap_firing_runs_first(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'bubblescope.db'}"
    migrate.upgrade(url)
    live = start_server(url, tmp_path, extra_args=["--metrics-max-runs", str(CAP), "--alert-interval", "1"])
    try:
        with live.client() as client:
            failed = register(client, world_size=1)  # heard from first: older than every run below
            client.put(f"/api/v1/runs/{failed}/ranks/0", json={"host": "h", "pid": 1}).raise_for_status()
            end = {"outcome": "failed", "error": "RuntimeError: boom", "pid": 1}
            client.put(f"/api/v1/runs/{failed}/ranks/0/end", json=end).raise_for_status()
            wait_until(
                lambda: any(a["run"] == failed for a in client.get("/api/v1/alerts").json()["alerts"]),
                60,
                "the failed run's alert",
            )
            newer = datetime.now(timezone.utc).replace(tzinfo=None) + timedelta(seconds=1)  # SQLite's are naive UTC
            rows = [
                {"key": f"many-{i:05d}", "name": "many", "world_size": 1, "config": {}, "updated_at": newer}
                for i in range(RUNS)
            ]
            engine = build_engine(url)
            with engine.begin() as connection:
                connection.execute(insert(Run), rows)
            engine.dispose()

            text = scrape_until(client, lambda text: "bubblescope_metrics_runs_omitted" in text and _omitted(text))
            assert _gauge(text, "bubblescope_metrics_runs_exported") == CAP
            assert _gauge(text, "bubblescope_metrics_runs_omitted") == RUNS + 1 - CAP
            exported = set(re.findall(r'^bubblescope_run_info\{[^}]*run="([^"]+)"', text, re.M))
            assert len(exported) == CAP and failed in exported  # the firing run, though the oldest heard
            firing = f'bubblescope_run_alert_firing{{alertname="BubblescopeRunFailed",run="{failed}",severity="critical"}} 1.0'
            assert firing in text
            assert 0 <= _gauge(text, "bubblescope_metrics_age_seconds") < 120
    finally:
        live.stop()


def _omitted(text: str) -> bool:
    found = re.search(r"^bubblescope_metrics_runs_omitted (\S+)$", text, re.M)
    return found is not None and float(found.group(1)) > 0
