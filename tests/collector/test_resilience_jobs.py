"""The collector never hurts the job: server down for the whole job, then a later upload; what was
dropped is counted, and the count reaches the run page."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest

from bubblescope.collector import upload_spool
from bubblescope.collector.spool import COUNTERS_NAME
from tests.collector.jobs import launch, read_report, spooled_ingest_contents
from tests.support import LiveServer, count_rows, free_port, run_pipeline_job

pytestmark = pytest.mark.slow


def test_server_down_for_whole_job_then_upload_delivers_everything_once(
    sqlite_server: LiveServer, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    dead_url = f"http://127.0.0.1:{free_port()}"  # nothing listens here
    steps, m, stages = 3, 4, 2
    job = run_pipeline_job(dead_url, stages=stages, schedule="gpipe", microbatches=m, steps=steps, spool_dir=spool)
    assert job.returncode == 0, job.output[-3000:]
    files = sorted(spool.rglob("*.msg"))
    assert files, "nothing was spooled"
    assert {p.parent.name for p in files} == {"rank0", "rank1"}
    down = [line for line in job.output.splitlines() if "service unreachable" in line]
    assert len(down) == stages, job.output[-3000:]  # one line per rank, naming the folder and the command
    folder = files[0].parent.parent
    assert all(
        f"spooling to {folder}" in line and f"upload-spool --url {dead_url} --spool-dir {folder}" in line
        for line in down
    ), down
    backup = tmp_path / "backup"
    shutil.copytree(spool, backup)
    spooled_steps, expected = spooled_ingest_contents(spool)
    assert spooled_steps == set(range(steps))
    # per rank per step at least: m forward + m backward + m send + m recv + data, all_reduce, optimizer
    assert expected >= stages * steps * (4 * m + 3)

    result = upload_spool(spool, sqlite_server.url)
    assert result.remaining == 0 and result.rejected == 0 and result.delivered == len(files)
    assert count_rows(sqlite_server.db_url, "spans", job.run_key) == expected
    with sqlite_server.client() as client:
        detail = client.get(f"/api/v1/runs/{job.run_key}").json()
    assert [s["ranks_reported"] for s in detail["steps"]] == [stages] * steps

    again = upload_spool(backup, sqlite_server.url)  # the same batches a second time
    assert again.delivered == len(files) and again.remaining == 0
    assert count_rows(sqlite_server.db_url, "spans", job.run_key) == expected


def test_disabled_collector_is_a_no_op(sqlite_server: LiveServer, tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    job = run_pipeline_job(
        sqlite_server.url,
        stages=2,
        schedule="1f1b",
        microbatches=2,
        steps=2,
        spool_dir=spool,
        extra_env={"BUBBLESCOPE_DISABLED": "1"},
    )
    assert job.returncode == 0, job.output[-3000:]
    with sqlite_server.client() as client:
        assert client.get(f"/api/v1/runs/{job.run_key}").status_code == 404
    assert not spool.exists()


@pytest.mark.browser
def test_the_drop_count_reaches_the_run_page_even_from_a_full_spool(
    browser: Any, sqlite_server: LiveServer, tmp_path: Path
) -> None:
    """Service down and a 4 KiB spool: most batches are dropped whole, yet the newest drop count
    (kept in the spool's counters file) reaches the service on upload and the run page shows it."""
    run_key = f"full-spool-{uuid.uuid4().hex[:8]}"
    env = {
        "BUBBLESCOPE_SPOOL_MAX_BYTES": "4096",
        "BUBBLESCOPE_FLUSH_INTERVAL_S": "0.05",
        "BUBBLESCOPE_FULL_SPANS_EVERY": "1",
    }
    process, _ = launch(
        tmp_path, f"http://127.0.0.1:{free_port()}", run_key, "--steps", "300", "--work", "3000", env=env
    )
    report = read_report(tmp_path, run_key, process)
    assert report.dropped_spans and report.dropped_spans > 0
    assert (tmp_path / "spool" / run_key / "rank0" / COUNTERS_NAME).exists()

    result = upload_spool(tmp_path / "spool", sqlite_server.url)
    assert result.remaining == 0 and result.rejected == 0
    with sqlite_server.client() as client:
        detail = client.get(f"/api/v1/runs/{run_key}").json()
    assert detail["ranks"][0]["dropped_spans"] == report.dropped_spans
    assert len(detail["steps"]) < 300  # whole batches were lost: only the count tells

    page = browser.new_page()
    page.goto(f"{sqlite_server.url}/runs/{run_key}")
    fact = page.locator("#run-facts .fact", has_text="Dropped spans")
    fact.wait_for(timeout=15_000)
    assert fact.locator(".value").inner_text() == str(report.dropped_spans)
    page.close()
