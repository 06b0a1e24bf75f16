"""A run-bound ingest token in a real job written as a user writes it (``bubblescope.data_parallel_job``: plain DDP,
instrumented as docs/collector.md says), on torchrun: under a run key its binding allows, the whole run streams;
under another team's key nothing is stored, the job still trains to its end, and its batches wait in the spool."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from bubblescope.backend.auth.scopes import Scope
from tests.auth.support import Tokens, bearer, make_token
from tests.support import LiveServer

pytestmark = pytest.mark.slow
STEPS = 8


def ddp_job(server: LiveServer, run_key: str, token: str, spool: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("BUBBLESCOPE_")},
        "BUBBLESCOPE_URL": server.url,
        "BUBBLESCOPE_RUN_ID": run_key,
        "BUBBLESCOPE_TOKEN": token,
        "BUBBLESCOPE_SPOOL_DIR": str(spool),
        "BUBBLESCOPE_FLUSH_INTERVAL_S": "0.2",
        "OMP_NUM_THREADS": "1",
    }
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    job = ["-m", "bubblescope.data_parallel_job", f"--steps={STEPS}", "--width=256", "--batch=32"]
    return subprocess.run([*command, *job], env=env, capture_output=True, text=True, timeout=300)


def test_a_team_token_streams_its_own_ddp_run_and_cannot_write_another_teams(
    auth_server: LiveServer, auth_db: str, tokens: Tokens, tmp_path: Path
) -> None:
    team = uuid.uuid4().hex[:6]
    token = make_token(auth_db, Scope.INGEST, runs=[f"team-a-{team}-*"])
    mine, theirs = f"team-a-{team}-ddp", f"team-b-{team}-ddp"
    admin = bearer(tokens.valid[Scope.ADMIN])

    allowed = ddp_job(auth_server, mine, token, tmp_path / "spool-a")
    assert allowed.returncode == 0, allowed.stderr[-3000:]
    refused = ddp_job(auth_server, theirs, token, tmp_path / "spool-b")
    assert refused.returncode == 0, refused.stderr[-3000:]  # the collector never stops the training

    with auth_server.client() as client:
        run = client.get(f"/api/v1/runs/{mine}", headers=admin).json()
        assert run["step_count"] == STEPS and run["state"] == "finished", run
        assert client.get(f"/api/v1/runs/{theirs}", headers=admin).status_code == 404
    assert not list((tmp_path / "spool-a").rglob("*.msg")), "an allowed run leaves nothing spooled"
    assert list((tmp_path / "spool-b").rglob("*.msg")), "the refused run's batches wait in the spool"
    said = [line for line in refused.stderr.splitlines() if "refused this job's token" in line]
    assert said and theirs in said[0] and "bubblescope upload-spool" in said[0], refused.stderr[-3000:]
    assert "bound to other runs" in said[0] and "BUBBLESCOPE_RUN_ID" in said[0], said[0]  # not "revoked"
    assert f"bubblescope: run 'ddp' streams to {auth_server.url}/runs/{mine}" in allowed.stderr + allowed.stdout
