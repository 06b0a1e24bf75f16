"""A hung run's page with its Flight Recorder dumps beside the live view (issue 35): a real collected gloo job
(``tests/traces/fr_hang_job.py``) hangs with rank 1 in its own code and rank 0 blocked in an all-reduce; both ranks'
recorders are dumped while it hangs and uploaded to the run. In headless Chromium at 1440 and 900 px the alert
banner, the glance's culprit card and the Flight Recorder card name the same rank: the one the others wait for is
the one missing from the first collective not every rank joined."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.alerts.fault_jobs import fault_service, finish, launch, wait_for
from tests.support import FILE_BODY, REPO, LiveServer, wait_until

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timing]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    yield from fault_service(tmp_path_factory)


def test_the_flight_recorder_card_names_the_rank_the_live_view_blames(
    browser: Any, service: LiveServer, output_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "100")
    run_key = f"fr-hang-{uuid.uuid4().hex[:8]}"
    dumps = [tmp_path / f"nccl_trace_rank_{rank}" for rank in (0, 1)]
    job = launch(service.url, run_key, 2, f"--out={tmp_path}", job=(str(REPO / "tests/traces/fr_hang_job.py"),))
    try:
        with service.client() as client:
            wait_for(client, run_key, "BubblescopeRunHung", "firing", timeout_s=90)
            wait_until(lambda: all(path.exists() and path.stat().st_size for path in dumps), 60, "both dumps")
            for path in dumps:
                answer = client.post(
                    f"/api/v1/runs/{run_key}/flight-recorder",
                    params={"file": path.name},
                    headers=FILE_BODY,
                    content=path.read_bytes(),
                )
                assert answer.status_code == 201, answer.text
        for width in (1440, 900):
            page = browser.new_page(viewport={"width": width, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(f"{service.url}/runs/{run_key}")
            expect(page.locator("#glance-slowest .value")).to_have_text("rank 1", timeout=20_000)
            # the banner is drawn from its own request: it may come after the glance (a CI run read it empty)
            expect(page.locator("#alert-banner")).to_contain_text("wait for rank 1", timeout=20_000)
            card = page.locator("#flight-recorder")
            expect(card).to_contain_text(
                "is the first collective not every rank joined: missing on rank 1", timeout=20_000
            )
            page.screenshot(path=str(output_dir / f"hang-with-flight-recorder-{width}.png"), full_page=True)
            assert errors == [], errors
            page.close()
    finally:
        (tmp_path / "release").touch()
        output = finish(job, timeout_s=120)
    assert job.returncode == 0, output[-3000:]
    with service.client() as client:
        wait_until(lambda: client.get(f"/api/v1/runs/{run_key}").json()["state"] == "finished", 30, "the run finished")
