"""A real hung job and a real crashed job (the demo pipeline with one faulty rank, under torchrun) on the run page,
in headless Chromium: the banner, the glance's culprit card, its first thing to do, the state badge, the straggler
section and the ranks table all name the same rank; a run with too few steps says so instead of advising; a red
card says why."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.alerts.fault_jobs import fault_service, finish, launch, wait_for
from tests.support import LiveServer

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timing]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    yield from fault_service(tmp_path_factory)


def glance(page: Any, part: str) -> str:
    return str(page.locator(f"#glance-{part}").inner_text())


def marked_ranks(page: Any, flag: str) -> list[str]:
    """The ranks table's rows carrying ``flag`` (lagging, failed first), by their rank cell."""
    rows = page.locator("#ranks-table tbody tr").filter(has=page.locator(".flag", has_text=flag))
    return [row.locator("td").first.inner_text().split()[1] for row in rows.all()]


def assert_stragglers_name(page: Any, culprit: str, what: str) -> None:
    """The straggler section leads with the stopped run's culprit, as the banner does."""
    expect(page.locator("#straggler-culprit")).to_be_visible(timeout=20_000)
    line = page.locator("#straggler-culprit").inner_text()
    assert culprit in line and what in line, line


def assert_bubble_card_adds_up(page: Any) -> None:
    """The bubble card's figures are of one step: the floor's share plus the points above it is the bubble."""
    expect(page.locator("#glance-bubble")).to_contain_text("of the step", timeout=20_000)  # the analysis has landed
    text = glance(page, "bubble")
    bubble, floor = (float(found) for found in re.findall(r"([\d.]+)%", text)[:2])
    assert re.search(rf"{floor}% of the step, simulated", text), text
    above = re.search(r"([\d.]+) pts above its floor", text)
    if above:  # else at its floor (within 2 points) or under it
        assert floor < bubble and abs(floor + float(above[1]) - bubble) <= 0.15, text
    else:
        assert ("at its floor" in text and abs(floor - bubble) <= 2.1) or "under its simulated floor" in text, text


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
            assert_stragglers_name(page, "hung on rank 1", "the others wait for it")
            assert_bubble_card_adds_up(page)
            expect(page.locator("#ranks-table tr.lagging")).to_have_count(1, timeout=20_000)
            assert marked_ranks(page, "lagging") == ["1"]
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
            # the card names the ranks from the run's state at once, and their PIDs once the alerts have loaded
            expect(page.locator("#glance-do")).to_contain_text("py-spy dump --pid", timeout=20_000)
            do_first = glance(page, "do")
            assert "Find why ranks 1, 3 are stuck" in do_first and "py-spy dump --pid" in do_first, do_first
            expect(page.locator("#alert-banner")).to_contain_text("2 ranks", timeout=20_000)  # its own request
            assert_stragglers_name(page, "hung on ranks 1, 3", "the others wait for them")
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
        assert_stragglers_name(page, "rank 1 failed first", "before the failure")
        expect(page.locator("#ranks-table .flag", has_text="failed first")).to_have_count(1, timeout=20_000)
        assert marked_ranks(page, "failed first") == ["1"]
        expect(page.locator("#suggestions")).to_contain_text("Too few steps to advise", timeout=20_000)
        for red in page.locator("#glance .glance-item.bad").all():  # a red card says why
            assert red.locator(".note").inner_text().strip(), red.inner_text()
        page.screenshot(path=str(output_dir / f"crashed-run-{width}.png"), full_page=True)
        assert errors == []
        page.close()
