"""The run page's profiler on demand, in headless Chromium at 1440 and 900 px, on a 1,024-rank run: a running run
offers "Profile the next K steps"; asking stores a profile request (kind "profile") and says which steps, which
ranks upload their traces and where the rest stay; asking again says the steps were already asked for; the list
under the form shows each profile, then the trace that arrived with links to open it as a run and download it for
Perfetto; a finished run offers no form."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.support import LiveServer, ingest_batch, post_gzip, profiled_trace, register, run_rows, upload_profile_trace

pytestmark = pytest.mark.browser


def test_a_running_runs_page_asks_for_a_profile_and_lists_its_traces(
    browser: Any, sqlite_server: LiveServer, output_dir: Path, tmp_path: Path
) -> None:
    with sqlite_server.client() as client:
        key = register(client, world_size=1024)
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
        expect(note).to_contain_text(
            f"ranks 0–7 upload their traces (listed below), every rank keeps its own in profiles/{key}/"
        )
        listed = page.locator("#profile-list li")
        expect(listed).to_have_count(1)
        if width == 1440:
            expect(listed).to_contain_text("0 of 8 traces uploaded — ranks 0–7 send theirs")
            page.locator("#profile-form").scroll_into_view_if_needed()
            page.screenshot(path=str(output_dir / f"profile-button-{width}.png"))
            profile_id, first, steps = run_rows(
                sqlite_server.db_url, key, "SELECT id, from_step, steps FROM capture_requests WHERE run_id = {run}"
            )[0]
            trace = profiled_trace(tmp_path, 0, first, steps)
            with sqlite_server.client() as client:
                sent = upload_profile_trace(client, key, profile_id, 0, trace)
            assert sent.status_code == 201, sent.text
        expect(listed).to_contain_text("1 of 8 traces uploaded (rank 0, ", timeout=20_000)  # the page hears of it
        links = listed.locator("a")
        expect(links).to_have_text(["open as a run", "Perfetto JSON"])
        expect(listed).not_to_contain_text(" 0 MiB")  # a small trace in KiB
        page.locator("#profile-list").scroll_into_view_if_needed()
        page.screenshot(path=str(output_dir / f"profile-uploaded-{width}.png"))
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        if width == 900:
            links.first.click()
            expect(page.locator("#run-title")).to_contain_text("profile steps", timeout=20_000)
        page.goto(f"{sqlite_server.url}/runs/{finished}")
        expect(page.locator("#run-state .state")).to_have_text("finished", timeout=20_000)
        expect(form).to_be_hidden()
        assert errors == [], errors
        page.close()
    rows = run_rows(sqlite_server.db_url, key, "SELECT kind, steps FROM capture_requests WHERE run_id = {run}")
    assert rows == [("profile", 2)], rows
