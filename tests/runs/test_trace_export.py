"""GET /runs/{key}/trace: a real pipeline job's steps (the demo, 2 stages, 1F1B, under torchrun) as Chrome
trace-event JSON, checked against the trace-event format as Perfetto reads it, and imported back
(``bubblescope import-trace``): the same spans come out."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.support import LiveServer, run_pipeline_job, run_rows, wait_for_steps

pytestmark = pytest.mark.slow


def check_trace_events(document: dict[str, Any]) -> None:
    """The trace-event format as Perfetto reads it: every slice a ``ph: X`` with ``ts`` and ``dur``; slices on one
    thread nest (none overlaps another without holding it); every flow has its start and its end, each inside a
    slice of its thread; every process has a name."""
    events = document["traceEvents"]
    slices: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for event in events:
        if event["ph"] == "X":
            assert isinstance(event["ts"], (int, float)) and isinstance(event["dur"], (int, float)), event
            assert event["dur"] >= 0, event
            slices[(event["pid"], event["tid"])].append((event["ts"], event["ts"] + event["dur"]))
    for thread, found in slices.items():
        open_ends: list[float] = []
        for start, end in sorted(found, key=lambda s: (s[0], -s[1])):
            while open_ends and open_ends[-1] <= start + 1e-6:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1] + 1e-6, (thread, start, end, open_ends[-1])
            open_ends.append(end)
    flows: dict[int, dict[str, dict[str, Any]]] = defaultdict(dict)
    for event in events:
        if event["ph"] in ("s", "f"):
            flows[event["id"]][event["ph"]] = event
            inside = slices[(event["pid"], event["tid"])]
            assert any(lo - 1e-6 <= event["ts"] <= hi + 1e-6 for lo, hi in inside), event
    assert flows and all(set(ends) == {"s", "f"} and ends["f"].get("bp") == "e" for ends in flows.values()), flows
    named = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert named == {e["pid"] for e in events if e["ph"] == "X"}
    for counter in (e for e in events if e["ph"] == "C"):  # a counter track: numbers, on a named process
        assert counter["pid"] in named and counter["args"], counter
        assert all(isinstance(v, (int, float)) for v in counter["args"].values()), counter


def spans_of(db_url: str, key: str, steps: range) -> dict[int, Counter[tuple[Any, ...]]]:
    """Per rank, its spans in ``steps`` as (step, kind, stage, micro-batch, peer, duration in µs, start in µs from the
    rank's first span of the step)."""
    rows = run_rows(
        db_url,
        key,
        "SELECT rank, step, kind, stage, microbatch, peer, start_ns, end_ns FROM spans WHERE run_id = {run} "
        f"AND step BETWEEN {steps.start} AND {steps.stop - 1}",
    )
    first: dict[tuple[int, int], int] = {}
    for rank, step, *_rest, start, _end in rows:
        first[(rank, step)] = min(first.get((rank, step), start), start)
    out: dict[int, Counter[tuple[Any, ...]]] = defaultdict(Counter)
    for rank, step, kind, stage, microbatch, peer, start, end in rows:
        shape = (
            step,
            kind,
            stage,
            microbatch,
            peer,
            round((end - start) / 1000),
            round((start - first[(rank, step)]) / 1000),
        )
        out[rank][shape] += 1
    return out


def test_a_pipeline_jobs_steps_export_to_perfetto_and_import_back(sqlite_server: LiveServer, tmp_path: Path) -> None:
    job = run_pipeline_job(
        sqlite_server.url,
        stages=2,
        schedule="1f1b",
        microbatches=4,
        steps=6,
        extra_env={"BUBBLESCOPE_FULL_SPANS_EVERY": "1"},
    )
    assert job.returncode == 0, job.output[-3000:]
    with sqlite_server.client() as client:
        wait_for_steps(client, job.run_key, 2, 6)
        answer = client.get(f"/api/v1/runs/{job.run_key}/trace", params={"from_step": 2, "to_step": 4})
        assert answer.status_code == 200, answer.text
        assert f"{job.run_key}-steps-2-4.trace.json" in answer.headers["content-disposition"]
        document = answer.json()
        too_many = client.get(f"/api/v1/runs/{job.run_key}/trace", params={"from_step": 0, "to_step": 40})
        assert too_many.status_code == 422 and too_many.json()["detail"][0]["loc"] == ["query", "to_step"]
    check_trace_events(document)
    # memory: each rank's own peak in each exported step, a counter sample at the step's start
    peaks = run_rows(
        sqlite_server.db_url,
        job.run_key,
        "SELECT rank, step, peak_rss_bytes FROM steps WHERE run_id = {run} AND step BETWEEN 2 AND 4",
    )
    expected = sorted((rank, round(peak / 2**20, 3)) for rank, _step, peak in peaks if peak is not None)
    counted = sorted((e["pid"], e["args"]["MiB"]) for e in document["traceEvents"] if e["name"] == "peak RSS")
    assert len(expected) == 6 and counted == expected, (counted, expected)
    names = {e["args"]["name"] for e in document["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert any("stage 0" in name for name in names) and any("stage 1" in name for name in names), names
    exported = tmp_path / "export.json"
    exported.write_text(json.dumps(document))
    done = subprocess.run(
        [sys.executable, "-m", "bubblescope.cli", "import-trace", str(exported), "--url", sqlite_server.url]
        + ["--run", f"{job.run_key}-back"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    original = spans_of(sqlite_server.db_url, job.run_key, range(2, 5))
    back = spans_of(sqlite_server.db_url, f"{job.run_key}-back", range(2, 5))
    assert sorted(back) == sorted(original) == [0, 1]
    for rank in (0, 1):
        assert sum(original[rank].values()) > 20 and back[rank] == original[rank], rank


@pytest.mark.browser
def test_the_run_page_offers_the_shown_step_as_a_perfetto_trace(
    browser: Any, sqlite_server: LiveServer, output_dir: Path
) -> None:
    job = run_pipeline_job(sqlite_server.url, stages=2, schedule="1f1b", microbatches=4, steps=4)
    assert job.returncode == 0, job.output[-3000:]
    with sqlite_server.client() as client:
        wait_for_steps(client, job.run_key, 2, 4)
    for width in (1440, 900):
        page = browser.new_page(viewport={"width": width, "height": 1000})
        page.goto(f"{sqlite_server.url}/runs/{job.run_key}")
        link = page.locator("#export-trace")
        link.wait_for(state="visible", timeout=20_000)
        shown = page.locator("body").get_attribute("data-rendered-step")
        href = link.get_attribute("href") or ""
        assert f"from_step={shown}&to_step={shown}" in href, (href, shown)
        answer = page.request.get(f"{sqlite_server.url}{href}")
        assert answer.status == 200 and answer.json()["traceEvents"], answer.status
        page.screenshot(path=str(output_dir / f"perfetto-link-{width}.png"))
        page.close()
