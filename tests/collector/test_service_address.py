"""A job pointed at the service by a URL as users type it: ``…/api/v1`` (the API's own prefix) stores every
span; a path with no bubblescope API behind it spools everything, says so in one line that names the folder
and the command, and ``upload-spool`` with the right URL delivers it all. Rank 0 prints the run's page. A service
that refuses a message for good (a 422, as an older service answers a field it does not know) gets one readable
line per status, and the message is kept on disk, not lost."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path

from bubblescope.collector.spool import MAX_REJECTED, REJECTED_SUFFIX
from tests.collector.jobs import launch, read_report
from tests.collector.misbehaving_server import MisbehavingServer
from tests.support import LiveServer

STEPS = 12


def test_a_url_ending_in_the_api_prefix_stores_every_step(sqlite_server: LiveServer, tmp_path: Path) -> None:
    run_key = f"prefixed-{uuid.uuid4().hex[:8]}"
    process, _ = launch(tmp_path, f"{sqlite_server.url}/api/v1/", run_key, "--steps", str(STEPS))
    report = read_report(tmp_path, run_key, process)
    assert report.dropped_spans == 0
    log = (tmp_path / f"{run_key}.log").read_text()
    assert f"streams to {sqlite_server.url}/runs/{run_key}" in log, log  # the page, at the service's root
    with sqlite_server.client() as client:
        assert client.get(f"/api/v1/runs/{run_key}").json()["step_count"] == STEPS
    assert not list((tmp_path / "spool").rglob("*.msg"))


def test_a_url_with_no_api_behind_it_spools_everything_and_upload_spool_delivers_it(
    sqlite_server: LiveServer, tmp_path: Path
) -> None:
    run_key = f"misaddressed-{uuid.uuid4().hex[:8]}"
    wrong = f"{sqlite_server.url}/bubblescope"
    process, _ = launch(tmp_path, wrong, run_key, "--steps", str(STEPS), env={"BUBBLESCOPE_FLUSH_INTERVAL_S": "0.05"})
    report = read_report(tmp_path, run_key, process)
    assert report.dropped_spans == 0
    log = (tmp_path / f"{run_key}.log").read_text()
    lines = [line for line in log.splitlines() if "has no bubblescope API" in line]
    assert len(lines) == 1, log
    folder = tmp_path / "spool" / run_key
    assert f"no such path: /bubblescope{'/api/v1/'}" in lines[0] and not re.search(r"(?<!\w)b'", lines[0]), lines[0]
    assert f"such as {sqlite_server.url};" in lines[0], lines[0]  # the root, guessed from the URL given
    assert f"bubblescope upload-spool --url {sqlite_server.url} --spool-dir {folder}" in lines[0], lines[0]
    assert list(folder.rglob("*.msg")), "everything should be spooled"
    with sqlite_server.client() as client:
        assert client.get(f"/api/v1/runs/{run_key}").status_code == 404
        command = [sys.executable, "-m", "bubblescope.cli", "upload-spool", "--spool-dir", str(folder)]
        again = subprocess.run([*command, "--url", wrong], capture_output=True, text=True, timeout=120)
        assert again.returncode == 1 and "has no bubblescope API" in again.stderr, again
        assert list(folder.rglob("*.msg")), "an upload to the wrong URL removes nothing"
        done = subprocess.run([*command, "--url", sqlite_server.url], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done
        assert client.get(f"/api/v1/runs/{run_key}").json()["step_count"] == STEPS


def test_a_message_refused_for_good_is_kept_on_disk_and_said_in_one_readable_line(tmp_path: Path) -> None:
    run_key = f"refused-{uuid.uuid4().hex[:8]}"
    server = MisbehavingServer("refuse").start()
    try:
        process, _ = launch(
            tmp_path, server.url, run_key, "--steps", str(STEPS), env={"BUBBLESCOPE_FLUSH_INTERVAL_S": "0.05"}
        )
        report = read_report(tmp_path, run_key, process)  # the job ends as it would have (exit 0)
    finally:
        server.stop()
    assert server.requests["refuse"] > 0
    log = (tmp_path / f"{run_key}.log").read_text()
    lines = [line for line in log.splitlines() if "the service refused" in line]
    assert len(lines) == 1, log  # once per status, not once per message
    assert "(422: " in lines[0] and "extra fields not permitted" in lines[0], lines[0]
    assert not re.search(r"(?<!\w)b'", lines[0]), lines[0]
    kept = list((tmp_path / "spool").rglob(f"*{REJECTED_SUFFIX}"))
    assert 0 < len(kept) <= MAX_REJECTED and f"kept as *.rejected in {kept[0].parent}" in lines[0], lines[0]
    assert kept[0].read_bytes().split(b"\n", 1)[0].startswith((b"POST ", b"PUT ")), "the message as it was sent"
    assert not list((tmp_path / "spool").rglob("*.msg")), "a refused message is not pending: no retry would help"
    assert report.dropped_spans > 0  # the refused spans are counted as dropped


def test_refused_messages_kept_stay_within_the_spools_bound_and_count(tmp_path: Path) -> None:
    """Kept refused messages share the spool's byte bound with the pending ones, and are at most MAX_REJECTED."""
    from bubblescope.collector.spool import Spool
    from bubblescope.collector.transport import Message

    message = Message("POST", "/api/v1/ingest", b"x" * 1000)
    small = Spool(tmp_path / "small", max_bytes=2500)
    assert small.keep_rejected(message) and small.keep_rejected(message)
    assert not small.keep_rejected(message)  # a third would pass 2,500 bytes
    assert len(list((tmp_path / "small").glob(f"*{REJECTED_SUFFIX}"))) == 2
    roomy = Spool(tmp_path / "roomy", max_bytes=1 << 30)
    assert (
        sum(roomy.keep_rejected(Message("POST", "/api/v1/ingest", b"y")) for _ in range(MAX_REJECTED + 5))
        == MAX_REJECTED
    )
