"""The run page's profiler on demand, in headless Chromium at 1440 and 900 px: a running run offers "Profile the
next K steps"; asking stores a profile request (kind "profile") and says which steps and where their traces go;
asking again says the steps were already asked for; a finished run offers nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.support import LiveServer, ingest_batch, post_gzip, register, run_rows

pytestmark = pytest.mark.browser


def test_a_running_runs_page_asks_for_a_profile(browser: Any, sqlite_server: LiveServer, output_dir: Path) -> None:
    with sqlite_server.client() as client:
        key = register(client, world_size=1)
        assert client.put(f"/api/v1/runs/{key}/ranks/0", json={"host": "h", "pid": 1}).status_code == 200
        assert post_gzip(client, ingest_batch(key, step=0)).status_code == 202
        finished = register(client, world_size=1)
        assert client.put(f"/api/v1/runs/{finished}/ranks/0", json={"host": "h", "pid": 2}).status_code == 200
        assert post_gzip(client, ingest_batch(finished, step=0)).status_code == 202
        assert client.put(f"/api/v1/runs/{finished}/ranks/0/end", json={"outcome": "finished"}).status_code == 200
    for width in (1440, 900):
        page = browser.new_page(viewport={"width": width, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(f"{sqlite_server.url}/runs/{key}")
        form = page.locator("#profile-form")
        expect(form).to_be_visible(timeout=20_000)
        page.fill("#profile-steps", "2")
        page.click("#profile-form button")
        note = page.locator("#profile-note")
        said = "Every rank profiles steps" if width == 1440 else "were already asked for"
        expect(note).to_contain_text(said, timeout=20_000)
        expect(note).to_contain_text(f"profiles/{key}/rank<R>-steps")
        page.locator("#profile-form").scroll_into_view_if_needed()
        page.screenshot(path=str(output_dir / f"profile-button-{width}.png"))
        page.goto(f"{sqlite_server.url}/runs/{finished}")
        expect(page.locator("#run-state .state")).to_have_text("finished", timeout=20_000)
        expect(form).to_be_hidden()
        assert errors == [], errors
        page.close()
    rows = run_rows(sqlite_server.db_url, key, "SELECT kind, steps FROM capture_requests WHERE run_id = {run}")
    assert rows == [("profile", 2)], rows
