"""A collector with a bad token: it warns once, in one line that names the spool folder and the command to
deliver it, spools everything, and loses nothing once ``upload-spool`` is given a good one. A token refused by
``upload-spool`` removes nothing. A job with no token at all is told so, not that its token was refused."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path

from bubblescope.backend.auth.scopes import Scope
from tests.auth.support import Tokens, bearer
from tests.collector.jobs import launch, read_report
from tests.support import LiveServer

STEPS = 30


def upload(server: LiveServer, spool: Path, token: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "bubblescope.cli", "upload-spool", "--url", server.url, "--spool-dir", str(spool)]
    return subprocess.run([*command, "--token", token], capture_output=True, text=True, timeout=120)


def test_a_bad_token_spools_everything_and_upload_spool_delivers_it_with_a_good_one(
    auth_server: LiveServer, tokens: Tokens, tmp_path: Path
) -> None:
    run_key = f"bad-token-{uuid.uuid4().hex[:8]}"
    env = {"BUBBLESCOPE_TOKEN": tokens.valid[Scope.READ], "BUBBLESCOPE_FLUSH_INTERVAL_S": "0.05"}  # wrong scope
    process, _ = launch(tmp_path, auth_server.url, run_key, "--steps", str(STEPS), "--work", "200", env=env)
    report = read_report(tmp_path, run_key, process)
    assert report.dropped_spans == 0
    log = (tmp_path / f"{run_key}.log").read_text()
    assert log.count("refused this job's token") == 1, log
    spool = tmp_path / "spool"
    line = next(line for line in log.splitlines() if "refused this job's token" in line)
    assert f"--spool-dir {spool / run_key}" in line and "bubblescope upload-spool --url" in line, line
    assert "this endpoint needs scope 'ingest'" in line, line  # the service's words
    assert not re.search(r"(?<!\w)b'", line), line  # not a bytes repr (a token's hex may end in b: 'read-…4b')
    spooled = sorted(spool.rglob("*.msg"))
    assert spooled, "everything should be spooled"

    with auth_server.client() as client:
        admin = bearer(tokens.valid[Scope.ADMIN])
        assert client.get(f"/api/v1/runs/{run_key}", headers=admin).status_code == 404

        refused = upload(auth_server, spool, tokens.revoked[Scope.INGEST])
        assert refused.returncode == 1 and "refused the token" in refused.stderr, refused
        assert sorted(spool.rglob("*.msg")) == spooled, "a refused upload removes nothing"

        delivered = upload(auth_server, spool, tokens.valid[Scope.INGEST])
        assert delivered.returncode == 0, delivered
        assert not list(spool.rglob("*.msg"))
        detail = client.get(f"/api/v1/runs/{run_key}", headers=admin).json()
        assert detail["step_count"] == STEPS


def test_a_job_without_a_token_is_told_it_set_none(auth_server: LiveServer, tmp_path: Path) -> None:
    run_key = f"no-token-{uuid.uuid4().hex[:8]}"
    process, _ = launch(tmp_path, auth_server.url, run_key, "--steps", "5", env={"BUBBLESCOPE_TOKEN": ""})
    read_report(tmp_path, run_key, process)
    log = (tmp_path / f"{run_key}.log").read_text()
    assert log.count("the service requires a token and this job set none") == 1, log
    assert "refused this job's token" not in log and "sign in" not in log.lower(), log
