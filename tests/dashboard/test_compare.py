"""The compare page: a run before a fix (4 micro-batches) and after it (16) side by side; the bubble's
drop and the step's change read from it, each column linking to its run. The run page links to it."""

from __future__ import annotations

from typing import Any

import pytest

from tests.dashboard.synthetic import synthetic_run
from tests.support import LiveServer

pytestmark = pytest.mark.browser


@pytest.mark.parametrize("width", [1440, 900])
def test_two_runs_side_by_side(browser: Any, sqlite_server: LiveServer, output_dir: Any, width: int) -> None:
    with sqlite_server.client() as client:
        before = synthetic_run(client, 4, 4, 4)
        after = synthetic_run(client, 4, 16, 4)
        bubbles = [client.get(f"/api/v1/runs/{key}/analysis").json() for key in (before, after)]
    page = browser.new_page(viewport={"width": width, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(f"{sqlite_server.url}/runs/{after}")
    page.wait_for_selector("body[data-drawn='true']", timeout=30_000)
    page.fill(".compare-link input[name=a]", before)
    page.click(".compare-link button")
    page.wait_for_selector("body[data-drawn='true']", timeout=30_000)
    assert f"a={before}" in page.url and f"b={after}" in page.url
    rows = {
        cells[0]: cells[1:]
        for cells in (
            [td.inner_text() for td in row.locator("td").all()] for row in page.locator("#compare-table tbody tr").all()
        )
        if cells
    }
    measured = [b["attribution"]["measured_bubble_fraction"] for b in bubbles]
    assert rows["Measured bubble"][:2] == [f"{100 * m:.1f}%" for m in measured]
    assert measured[1] < measured[0] and rows["Measured bubble"][2].startswith("−")
    assert rows["Median step"][0].endswith(" ms") and "stage 3 compute" in rows
    assert page.locator("#head-a a").get_attribute("href") == f"/runs/{before}"
    assert page.evaluate("() => document.documentElement.scrollWidth <= document.documentElement.clientWidth")
    assert errors == []
    page.screenshot(path=str(output_dir / f"compare-{width}.png"), full_page=True)
    page.close()
