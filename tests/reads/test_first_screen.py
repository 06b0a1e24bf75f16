"""The run page of a crashed run opens on a complete step, not on its partial last one, and marks the
partial and warm-up steps in the step picker; the first card says how many steps were left out; the
analysis leaves the partial step out (analysis/warmup.py holds the rule for both)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support import LiveServer, ingest_batch, post_gzip, register


def crashed_run(server: LiveServer) -> str:
    """Two ranks, 8 steps with spans; rank 1 died in step 7 (its last batch never came)."""
    with server.client() as client:
        key = register(client)
        for rank in (0, 1):
            worker = {"host": f"h{rank}", "pid": 10 + rank, "clock_offset_ns": 0, "clock_uncertainty_ns": 0}
            assert client.put(f"/api/v1/runs/{key}/ranks/{rank}", json=worker).status_code == 200
        for step in range(8):
            for rank in (0, 1) if step < 7 else (0,):  # rank 1 died in step 7
                assert post_gzip(client, ingest_batch(key, seq=step, rank=rank, step=step)).status_code == 202
        end = {"outcome": "failed", "error": "RuntimeError: CUDA error: an illegal memory access", "pid": 11}
        assert client.put(f"/api/v1/runs/{key}/ranks/1/end", json=end).status_code == 200
    return key


def test_a_crashed_runs_partial_step_is_marked_and_left_out_of_the_default_and_the_analysis(
    server: LiveServer,
) -> None:
    key = crashed_run(server)
    with server.client() as client:
        run = client.get(f"/api/v1/runs/{key}").json()
        analysis = client.get(f"/api/v1/runs/{key}/analysis")
        from_zero = client.get(f"/api/v1/runs/{key}/analysis", params={"from_step": 0})
    assert run["state"] == "failed"
    assert [s["step"] for s in run["steps"] if not s["complete"]] == [7]
    assert [s["step"] for s in run["steps"] if s["warmup"]] == [0, 1, 2, 3, 4]
    assert run["default_step"] in (5, 6)  # a finished run: the complete step nearest the median wall time
    assert analysis.status_code == 200, analysis.text
    assert analysis.json()["steps"] == [5, 6]
    assert analysis.json()["partial_steps_left_out"] == [7]
    assert analysis.json()["warmup_steps_left_out"] == [0, 1, 2, 3, 4]
    assert from_zero.status_code == 200, from_zero.text  # a range asked for keeps its warm-up, not the crash
    assert from_zero.json()["steps"] == list(range(7)) and from_zero.json()["partial_steps_left_out"] == [7]


@pytest.mark.browser
def test_a_crashed_run_opens_on_a_complete_step_with_partial_and_warm_up_steps_marked(
    browser: Any, sqlite_server: LiveServer
) -> None:
    key = crashed_run(sqlite_server)
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
    assert page.locator("#analysis-note").inner_text() == "(steps 5–6, 2 with spans; left out: warm-up 0–4, partial 7)"
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
