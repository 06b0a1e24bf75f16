"""Text a job wrote, shown as it is and not as it would trick a reader (issue 37): Unicode direction
overrides (U+202E) are shown as visible escapes on every page, in alerts and in /metrics; an 800-character
error and a 128-character run key neither widen the page nor stack into dozens of lines. Real server, real
headless Chromium, at 1440 and 900 px."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support import LiveServer, scrape_until, wait_until

pytestmark = pytest.mark.browser

RLO = "\u202e"  # RIGHT-TO-LEFT OVERRIDE: "report\u202egnp.exe" reads "reportexe.png"
SHOWN = "<U+202E>"


@pytest.fixture(scope="module")
def hostile_run(sqlite_server: LiveServer) -> str:
    key = "k" + uuid.uuid4().hex + "-" + "x" * (127 - 33)  # 128 characters
    assert len(key) == 128
    with sqlite_server.client() as client:
        registered = client.put(f"/api/v1/runs/{key}", json={"name": f"report{RLO}gnp.exe", "world_size": 1})
        assert registered.status_code == 200, registered.text
        rank = {"host": f"node{RLO}1-evil", "pid": 7}
        assert client.put(f"/api/v1/runs/{key}/ranks/0", json=rank).status_code == 200
        error = f"RuntimeError: {RLO}" + "/very/long/path/without/spaces" * 27  # ~800 characters
        end = {"outcome": "failed", "error": error, "pid": 7}
        assert client.put(f"/api/v1/runs/{key}/ranks/0/end", json=end).status_code == 200
        wait_until(lambda: any(a["run"] == key for a in client.get("/api/v1/alerts").json()["alerts"]), 60, "the alert")
    return key


def test_direction_overrides_reach_no_alert_and_no_metric(sqlite_server: LiveServer, hostile_run: str) -> None:
    with sqlite_server.client() as client:
        [alert] = [a for a in client.get("/api/v1/alerts").json()["alerts"] if a["run"] == hostile_run]
        words = str(alert["labels"]) + str(alert["annotations"])
        assert RLO not in words and SHOWN in words, words
        metrics = scrape_until(client, lambda text: hostile_run in text)
    assert RLO not in metrics and f"report{SHOWN}gnp.exe" in metrics


@pytest.mark.parametrize("width", [1440, 900])
def test_pages_show_escapes_and_keep_their_width(
    browser: Any, sqlite_server: LiveServer, hostile_run: str, output_dir: Path, width: int
) -> None:
    page = browser.new_page(viewport={"width": width, "height": 1000})
    page.goto(f"{sqlite_server.url}/?q={hostile_run[:12]}")
    page.wait_for_selector(f"tr[data-run='{hostile_run}']", timeout=15_000)
    page.screenshot(path=str(output_dir / f"hostile-text-list-{width}.png"), full_page=True)
    text = page.inner_text("body")
    assert RLO not in text and f"report{SHOWN}gnp.exe" in text
    key_cell = page.locator(f"tr[data-run='{hostile_run}'] td.key")  # a locator: the list redraws its rows every 5 s
    assert key_cell.get_attribute("title") == hostile_run  # the whole key on hover
    box = key_cell.bounding_box()
    assert box is not None and box["height"] < 100, box  # the row: 3 lines at most, not 43
    assert page.evaluate("document.documentElement.scrollWidth") <= width

    page.goto(f"{sqlite_server.url}/runs/{hostile_run}")
    # the run's state shows the error first; the host comes with the alerts' answer (the ranks table, the banner)
    page.wait_for_selector("body[data-drawn='true']", timeout=60_000)
    page.wait_for_function("document.body.innerText.includes('very/long/path')", timeout=20_000)
    page.screenshot(path=str(output_dir / f"hostile-text-run-{width}.png"), full_page=True)
    text = page.inner_text("body")
    assert RLO not in text and SHOWN in text
    assert re.search(r"node<U\+202E>1-evil", text), "the host, escaped"
    assert page.evaluate("document.documentElement.scrollWidth") <= width, "the error widened the page"
    page.close()
