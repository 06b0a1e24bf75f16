"""The run page of a crashed run opens on a complete step, not on its partial last one, and marks the
partial and warm-up steps in the step picker; the first card says how many steps were left out."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support import LiveServer, ingest_batch, post_gzip, register


@pytest.mark.browser
def test_a_crashed_run_opens_on_a_complete_step_with_partial_and_warm_up_steps_marked(
    browser: Any, sqlite_server: LiveServer
) -> None:
    with sqlite_server.client() as client:
        key = register(client)
        for rank in (0, 1):
            worker = {"host": f"h{rank}", "pid": 10 + rank, "clock_offset_ns": 0, "clock_uncertainty_ns": 0}
            assert client.put(f"/api/v1/runs/{key}/ranks/{rank}", json=worker).status_code == 200
        for step in range(8):
            for rank in (0, 1) if step < 7 else (0,):  # rank 1 died in step 7
                assert post_gzip(client, ingest_batch(key, seq=step, rank=rank, step=step)).status_code == 202
        end = {"outcome": "failed", "error": "RuntimeError: CUDA error: an illegal memory access", "pid": 11}
        assert client.put(f"/api/v1/runs/{key}/ranks/1/end", json=end).status_code == 200
    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(f"{sqlite_server.url}/runs/{key}")
    page.wait_for_selector("body[data-drawn='true']", timeout=30_000)
    shown = int(page.evaluate("() => document.body.dataset.renderedStep"))
    assert 5 <= shown <= 6  # past the 5-step warm-up, complete
    options = page.locator("#step-select option").all_inner_texts()
    assert options[7].endswith("(partial: 1 of 2 ranks)") and options[0].endswith("(warm-up)"), options
    assert "1 partial step left out" in page.locator("#glance-step").inner_text()
    assert errors == []
    page.close()


@pytest.mark.parametrize("first", [0, 100])
def test_the_warm_up_is_the_runs_first_steps_wherever_it_starts(server: LiveServer, first: int) -> None:
    """A job resumed from a checkpoint starts at step 100: its steps 100-104 are its warm-up, and the
    page reads the rule from the run (``warmup_until_step``) instead of keeping its own."""
    with server.client() as client:
        key = register(client, world_size=1)
        for seq, step in enumerate(range(first, first + 7)):
            assert post_gzip(client, ingest_batch(key, seq=seq, step=step)).status_code == 202
        run = client.get(f"/api/v1/runs/{key}").json()
    assert run["warmup_until_step"] == first + 5
    assert run["baseline_steps"] == 50
