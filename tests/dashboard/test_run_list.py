"""The run list page: filters (name or key, state) in the URL, pages of 50 with "Older" and "Newest",
and a word when nothing matches; at 900 px nothing overflows."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from tests.support import LiveServer

pytestmark = pytest.mark.browser


def test_the_run_list_filters_and_pages(browser: Any, sqlite_server: LiveServer) -> None:
    tag = uuid.uuid4().hex[:8]
    with sqlite_server.client() as client:
        for index in range(60):
            key = f"list-{tag}-{index:02d}"
            assert client.put(f"/api/v1/runs/{key}", json={"name": f"sweep {tag}", "world_size": 1}).status_code == 200
    page = browser.new_page(viewport={"width": 900, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(f"{sqlite_server.url}/?name={tag}")
    rows = page.locator("#runs tbody tr")
    page.wait_for_function("() => document.querySelectorAll('#runs tbody tr').length === 50", timeout=15_000)
    assert page.locator("#runs-page").inner_text() == "runs 1–50"
    assert page.locator("[name=name]").input_value() == tag
    page.click("#runs-older")
    page.wait_for_function("() => document.querySelectorAll('#runs tbody tr').length === 10", timeout=15_000)
    assert page.locator("#runs-page").inner_text() == "runs 51–60" and page.locator("#runs-older").is_disabled()
    assert all(tag in text for text in rows.all_inner_texts())
    page.select_option("[name=state]", "failed")
    page.click("#run-filters button[type=submit]")
    page.wait_for_function("() => document.querySelectorAll('#runs tbody tr').length === 0", timeout=15_000)
    assert "state=failed" in page.url and page.locator("#runs-none").inner_text() == "No run matches these filters."
    assert page.evaluate("() => document.documentElement.scrollWidth <= document.documentElement.clientWidth")
    assert errors == []
    page.close()


def test_a_run_is_found_by_its_name_and_two_picked_runs_compare(
    browser: Any, sqlite_server: LiveServer, output_dir: Any
) -> None:
    """/runs/NAME opens the newest run of that name (the key carries a run id nobody types); a part of a name
    lists the matches; two runs picked in the list open the compare page, earlier one first. /runs and an unknown
    path in a browser are pages, not JSON; the API's answer to a client stays JSON."""
    tag = uuid.uuid4().hex[:8]
    name = f"pp2-{tag}"
    keys = [f"{name}-{suffix}" for suffix in ("f820cc4b", "9a1b2c3d")]
    with sqlite_server.client() as client:
        for index, key in enumerate(keys):  # the second registers later: the newest (times are to the second)
            time.sleep(1.1 * index)
            assert client.put(f"/api/v1/runs/{key}", json={"name": name, "world_size": 1}).status_code == 200
        assert client.get("/runs").status_code == 404 and client.get("/runs").json()["detail"][0]["loc"] == ["path"]
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(f"{sqlite_server.url}/runs/{name}")
    page.wait_for_url(f"**/runs/{keys[1]}", timeout=15_000)
    page.wait_for_selector("#run-title")
    page.goto(f"{sqlite_server.url}/runs/{tag}")  # part of the name: not opened, listed
    note = page.locator("#run-error")
    page.wait_for_function("() => document.querySelectorAll('#run-error a').length >= 3", timeout=15_000)
    assert f'Runs whose name or key holds "{tag}"' in note.inner_text(), note.inner_text()
    assert set(note.locator("a").all_inner_texts()) >= set(keys)
    page.screenshot(path=str(output_dir / "run-by-part-of-its-name.png"), full_page=True)

    page.goto(f"{sqlite_server.url}/?name={tag}")
    page.wait_for_function("() => document.querySelectorAll('#runs tbody tr').length === 2", timeout=15_000)
    assert page.locator("#compare-link").is_hidden()
    for key in reversed(keys):
        page.locator(f"#runs tbody tr[data-run='{key}'] input[type=checkbox]").check()
    link = page.locator("#compare-link")
    assert link.is_visible() and link.get_attribute("href") == f"/compare?a={keys[0]}&b={keys[1]}"
    page.screenshot(path=str(output_dir / "run-list-two-picked.png"), full_page=True)
    link.click()
    page.wait_for_url(f"**/compare?a={keys[0]}&b={keys[1]}", timeout=15_000)

    page.goto(f"{sqlite_server.url}/runs")
    page.wait_for_url(f"{sqlite_server.url}/", timeout=15_000)
    answer = page.goto(f"{sqlite_server.url}/no/such/page")
    assert answer is not None and answer.status == 404
    assert "Nothing at /no/such/page" in page.locator("h1").inner_text()
    assert errors == []
    page.close()
