"""POST /api/v1/runs/{key}/flight-recorder on a real server: a job's real dumps uploaded one rank a request (by
the command, over HTTP) are read together by GET; a hostile or foreign file is a 422 naming the body with nothing
stored; the run page shows the collective a hung run's ranks are missing from, in real Chromium."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import FILE_BODY, LiveServer
from tests.traces.support import settled

pytestmark = pytest.mark.slow


def registered(server: LiveServer, key: str, world_size: int = 2) -> None:
    with server.client() as client:
        answer = client.put(f"/api/v1/runs/{key}", json={"name": key, "world_size": world_size})
        assert answer.status_code in (200, 201), answer.text


def test_dumps_uploaded_by_the_command_are_read_together(sqlite_server: LiveServer, fr_dumps: Path) -> None:
    registered(sqlite_server, "fr-hung")
    pickles = [fr_dumps / "nccl_trace_rank_0", fr_dumps / "nccl_trace_rank_1"]
    command = [sys.executable, "-m", "bubblescope.cli", "import-fr", *map(str, pickles)]
    done = subprocess.run(
        [*command, "--url", sqlite_server.url, "--run", "fr-hung"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "uploaded 2 dumps to run fr-hung" in done.stdout
    with sqlite_server.client() as client:
        report = client.get("/api/v1/runs/fr-hung/flight-recorder").json()
        again = client.post(  # a rank's later dump replaces its earlier one
            "/api/v1/runs/fr-hung/flight-recorder",
            params={"file": "trace_rank_1.json"},
            headers=FILE_BODY,
            content=(fr_dumps / "trace_rank_1.json").read_bytes(),
        )
        assert again.status_code == 201, again.text
        after = client.get("/api/v1/runs/fr-hung/flight-recorder").json()
    assert [(d["rank"], d["file"]) for d in report["dumps"]] == [(0, "nccl_trace_rank_0"), (1, "nccl_trace_rank_1")]
    [group] = report["groups"]
    assert group["wavefront"] == {"seq": 5, "op": "gloo:all_reduce", "joined": [0], "missing": [1]}
    assert [(p["rank"], p["last_enqueued"], p["blocked_in"]) for p in group["progress"]] == [
        (0, 5, "#5 gloo:all_reduce"),
        (1, 4, None),
    ]
    assert [d["file"] for d in after["dumps"]] == ["nccl_trace_rank_0", "trace_rank_1.json"]
    assert settled(after)["groups"] == settled(report)["groups"]  # one rank's JSON, dumped a moment before its pickle


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_a_hostile_or_foreign_upload_is_refused_naming_the_body(
    sqlite_server: LiveServer, fr_dumps: Path, tmp_path: Path
) -> None:
    registered(sqlite_server, "fr-refused")
    marker = tmp_path / "ran"
    cases = {
        "nccl_trace_rank_0": (pickle.dumps({"entries": [_Payload(marker)]}), "names posix.system"),
        "trace_rank_1.json": (b'{"traceEvents": []}', "no 'entries' list"),
        "dump": ((fr_dumps / "nccl_trace_rank_0").read_bytes(), "no rank in the file name"),
        "nccl_trace_rank_7": ((fr_dumps / "nccl_trace_rank_0").read_bytes(), "rank 7 is not in run"),
        "nccl_trace_rank_1": (b"", "no dump"),
    }
    with sqlite_server.client() as client:
        for name, (body, said) in cases.items():
            answer = client.post(
                "/api/v1/runs/fr-refused/flight-recorder", params={"file": name}, headers=FILE_BODY, content=body
            )
            assert answer.status_code == 422, (name, answer.text)
            assert said in answer.json()["detail"][0]["msg"], (name, answer.text)
        unknown = client.post(
            "/api/v1/runs/no-such-run/flight-recorder", params={"file": "rank0"}, headers=FILE_BODY, content=b"{}"
        )
        assert unknown.status_code == 404, unknown.text
        assert client.get("/api/v1/runs/fr-refused/flight-recorder").json()["dumps"] == []
    assert not marker.exists()


#: The longest a running run's page waits to ask for a section again (LIVE_REFRESH_MAX_MS), plus a poll and a margin.
REFRESH_BOUND_MS = 60_000 + 3_000 + 7_000


@pytest.mark.browser
def test_the_run_page_shows_who_a_hung_collective_is_missing(
    browser: Any, sqlite_server: LiveServer, fr_dumps: Path, output_dir: Path
) -> None:
    registered(sqlite_server, "fr-page")
    for width in (1440, 900):
        page = browser.new_page(viewport={"width": width, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(f"{sqlite_server.url}/runs/fr-page")
        if width == 1440:  # the page is open when the dumps arrive: an upload is news, like a batch
            page.wait_for_selector("body[data-drawn]", timeout=20_000)
            assert page.locator("#flight-recorder").is_hidden()
            with sqlite_server.client() as client:
                for rank in (0, 1):
                    path = fr_dumps / f"nccl_trace_rank_{rank}"
                    answer = client.post(
                        "/api/v1/runs/fr-page/flight-recorder",
                        params={"file": path.name},
                        headers=FILE_BODY,
                        content=path.read_bytes(),
                    )
                    assert answer.status_code == 201, answer.text
        # a running run's page asks for a section again only after 10x its last answer's time, at most 60 s
        # (frontend/run.js, LIVE_COST_FACTOR, LIVE_REFRESH_MAX_MS): on a loaded machine the first answer can take seconds
        page.wait_for_selector("#flight-recorder:not([hidden]) .fr-front", timeout=REFRESH_BOUND_MS)
        front = page.locator("#flight-recorder .fr-front").inner_text()
        assert "#5 gloo:all_reduce" in front and "missing on rank 1" in front and "joined by 1 of 2" in front, front
        rows = page.locator("#flight-recorder table tbody tr").all_inner_texts()
        assert [row.split("\t")[0] for row in rows] == ["1", "0"], rows  # the rank that went least far first
        assert "#5 gloo:all_reduce" in rows[1]
        page.locator("#flight-recorder").screenshot(path=str(output_dir / f"flight-recorder-{width}.png"))
        page.screenshot(path=str(output_dir / f"flight-recorder-page-{width}.png"))
        assert errors == []
        page.close()
