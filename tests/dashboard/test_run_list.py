"""The run list page: filters (name or key, state) in the URL, pages of 50 with "Older" and "Newest",
and a word when nothing matches; at 900 px nothing overflows."""

from __future__ import annotations

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
