"""A real hung job and a real crashed job (the demo pipeline with one faulty rank, under torchrun) on the run page,
in headless Chromium: the banner, the glance's culprit card, its first thing to do, the state badge and the ranks
table all name the same rank; a run with too few steps says so instead of advising; a red card says why."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.alerts.fault_jobs import fault_service, finish, launch, wait_for
from tests.support import LiveServer

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    yield from fault_service(tmp_path_factory)


def glance(page: Any, part: str) -> str:
    return str(page.locator(f"#glance-{part}").inner_text())


def open_run(browser: Any, url: str, width: int) -> tuple[Any, list[str]]:
    page = browser.new_page(viewport={"width": width, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(url)
    return page, errors


def test_a_hung_run_names_one_culprit_everywhere(browser: Any, service: LiveServer, output_dir: Path) -> None:
    run_key = f"hung-{uuid.uuid4().hex[:8]}"
    job = launch(
        service.url, run_key, 2, "--steps=20", "--inject=hang-collective", "--inject-rank=1", "--inject-seconds=40"
    )
    try:
        with service.client() as client:
            wait_for(client, run_key, "BubblescopeRunHung", "firing", timeout_s=60)
        for width in (1440, 900):
            page, errors = open_run(browser, f"{service.url}/runs/{run_key}", width)
            expect(page.locator("#alert-banner li.alert")).to_have_count(1, timeout=20_000)
            expect(page.locator("#glance-slowest .value")).to_have_text("rank 1", timeout=20_000)
            assert "CULPRIT" in glance(page, "slowest").upper() and "the run is hung" in glance(page, "slowest")
            do_first = glance(page, "do")
            assert "Find why rank 1 is stuck" in do_first and "py-spy dump --pid" in do_first, do_first
            assert "nothing to change" not in do_first
            assert page.locator("#run-state .state").inner_text() == "hung"
            assert "wait for rank 1" in page.locator("#alert-banner").inner_text()
            page.screenshot(path=str(output_dir / f"hung-run-{width}.png"), full_page=True)
            assert errors == []
            page.close()
    finally:
        finish(job, timeout_s=120)


def test_a_run_hung_on_two_ranks_names_both_everywhere(browser: Any, service: LiveServer, output_dir: Path) -> None:
    run_key = f"hung2-{uuid.uuid4().hex[:8]}"
    job = launch(
        service.url, run_key, 4, "--steps=20", "--inject=hang-collective", "--inject-rank=1,3", "--inject-seconds=40"
    )
    try:
        with service.client() as client:
            wait_for(client, run_key, "BubblescopeRunHung", "firing", timeout_s=90)
            run = client.get(f"/api/v1/runs/{run_key}").json()
        assert run["state"] == "hung" and "2 ranks (1, 3)" in run["state_detail"], run
        for width in (1440, 900):
            page, errors = open_run(browser, f"{service.url}/runs/{run_key}", width)
            expect(page.locator("#glance-slowest .value")).to_have_text("ranks 1, 3", timeout=20_000)
            assert "the others wait for them: the run is hung" in glance(page, "slowest")
            do_first = glance(page, "do")
            assert "Find why ranks 1, 3 are stuck" in do_first and "py-spy dump --pid" in do_first, do_first
            assert "2 ranks" in page.locator("#alert-banner").inner_text()
            page.screenshot(path=str(output_dir / f"hung-two-ranks-{width}.png"), full_page=True)
            assert errors == []
            page.close()
    finally:
        finish(job, timeout_s=120)


def test_a_crashed_run_names_one_culprit_and_gives_no_advice_on_one_step(
    browser: Any, service: LiveServer, output_dir: Path
) -> None:
    run_key = f"crash-{uuid.uuid4().hex[:8]}"
    job = launch(service.url, run_key, 2, "--steps=12", "--inject=raise", "--inject-rank=1")
    finish(job)
    with service.client() as client:
        wait_for(client, run_key, "BubblescopeRunFailed", "firing", timeout_s=60)
        analysis = client.get(f"/api/v1/runs/{run_key}/analysis").json()
    assert analysis["suggestions"] == [] and "analysed" in analysis["advice_withheld"], analysis.get("advice_withheld")
    for width in (1440, 900):
        page, errors = open_run(browser, f"{service.url}/runs/{run_key}", width)
        expect(page.locator("#glance-slowest .value")).to_have_text("rank 1", timeout=20_000)
        assert "it failed first" in glance(page, "slowest")
        expect(page.locator("#glance-do .value")).to_have_text("Read rank 1's log", timeout=20_000)
        assert "Rebalance" not in glance(page, "do")
        step = glance(page, "step")
        assert "no baseline yet" in step and "+0.0%" not in step, step
        assert page.locator("#run-state .state").inner_text() == "failed"
        expect(page.locator("#suggestions")).to_contain_text("Too few steps to advise", timeout=20_000)
        for red in page.locator("#glance .glance-item.bad").all():  # a red card says why
            assert red.locator(".note").inner_text().strip(), red.inner_text()
        page.screenshot(path=str(output_dir / f"crashed-run-{width}.png"), full_page=True)
        assert errors == []
        page.close()
