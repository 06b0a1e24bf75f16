"""How a real job ended, as the service shows it: a clean torchrun job is finished; one whose
rank raises is failed, naming that rank and its exception; a ``torch.multiprocessing.spawn``
worker that raises reads finished (spawn catches the exception and calls ``sys.exit(1)``: a
documented limit); a job with one rank's collector disabled never finishes and turns silent. (A
killed job: silent, in ``tests/collector/test_killed_and_disabled.py``.)"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support import REPO, LiveServer, run_parallel_job, wait_until

pytestmark = pytest.mark.slow


def run_once_ended(server: LiveServer, run_key: str, state: str) -> dict[str, Any]:
    """The run detail once the service shows ``state`` (the ends travel asynchronously)."""
    with server.client() as client:
        found: dict[str, Any] = {}

        def reached() -> bool:
            found.update(client.get(f"/api/v1/runs/{run_key}").json())
            return found.get("state") == state

        wait_until(reached, 30, f"run state {state!r}", interval_s=0.2)
        return found


def test_a_clean_job_is_finished_on_every_rank(sqlite_server: LiveServer) -> None:
    job = run_parallel_job(sqlite_server.url, "naive", 2, "--steps=2")
    assert job.returncode == 0, job.output[-3000:]
    run = run_once_ended(sqlite_server, job.run_key, "finished")
    assert run["state_detail"] == "all 2 ranks finished"
    assert [(r["outcome"], r["error"]) for r in run["ranks"]] == [("finished", None), ("finished", None)]
    assert all(r["ended_at"] for r in run["ranks"])


def test_a_rank_that_raises_fails_the_run_and_names_its_exception(sqlite_server: LiveServer) -> None:
    job = run_parallel_job(sqlite_server.url, "naive", 2, "--steps=8", "--raise-at=1:3")
    assert job.returncode != 0 and "injected failure on rank 1 at step 3" in job.output, job.output[-3000:]
    run = run_once_ended(sqlite_server, job.run_key, "failed")
    assert run["state_detail"].startswith("rank 1 failed"), run["state_detail"]
    assert "RuntimeError: injected failure on rank 1 at step 3" in run["state_detail"]
    rank1 = run["ranks"][1]
    assert rank1["outcome"] == "failed" and rank1["error"] == "RuntimeError: injected failure on rank 1 at step 3"
    # rank 0 either fails in turn on the closed connection (then after rank 1) or is killed by torchrun
    assert run["ranks"][0]["outcome"] in (None, "failed")
    assert {s["step"] for s in run["steps"]} >= {0, 1, 2}  # what ran before the failure is kept
    # the step rank 1 died in, where rank 0 reported it, is partial: not the default, not analysed
    partial = [s["step"] for s in run["steps"] if not s["complete"] and s["has_spans"]]
    with sqlite_server.client() as client:
        analysis = client.get(f"/api/v1/runs/{job.run_key}/analysis").json()
    print(f"partial steps {partial}, analysed {analysis['steps']}, default {run['default_step']}")
    assert run["default_step"] in {s["step"] for s in run["steps"] if s["complete"]}
    assert analysis["partial_steps_left_out"] == partial and not set(partial) & set(analysis["steps"])
    # the survivor sat waiting on the dead peer in the partial step, and the warm-up ran slow: neither is
    # a straggler to drain (seen: "Drain host vm" on a 4-step crashed run, from steps 0 and 3)
    assert not [s for s in analysis["suggestions"] if s["kind"] == "drain_straggler"], analysis["suggestions"]


SPAWN_SCRIPT = textwrap.dedent(
    """
    import torch.multiprocessing as mp

    def worker(index):
        from bubblescope import collector
        collector.init(run="spawned")
        with collector.step():
            pass
        raise RuntimeError("worker failed")

    if __name__ == "__main__":
        mp.spawn(worker, nprocs=1, join=True)
    """
)


def test_a_spawn_worker_that_raises_reads_finished_as_documented(sqlite_server: LiveServer, tmp_path: Path) -> None:
    """README (Run states): ``torch.multiprocessing.spawn`` catches the worker's exception and
    calls ``sys.exit(1)``, which an atexit hook cannot tell from a clean exit, so the worker
    reports finished; the parent sees the failure (its own exit code)."""
    run_key = f"spawn-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "BUBBLESCOPE_URL": sqlite_server.url, "BUBBLESCOPE_RUN_ID": run_key, "OMP_NUM_THREADS": "1"}
    script = tmp_path / "spawned.py"  # spawn's workers import the main module: a file, not -c
    script.write_text(SPAWN_SCRIPT)
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode != 0 and "worker failed" in done.stderr, done.stderr[-3000:]
    run = run_once_ended(sqlite_server, run_key, "finished")
    assert [(r["outcome"], r["error"]) for r in run["ranks"]] == [("finished", None)]


def test_a_rank_with_the_collector_disabled_keeps_the_run_from_finishing_and_it_turns_silent(
    sqlite_server: LiveServer,
) -> None:
    """Rank 1 runs with ``BUBBLESCOPE_DISABLED=1``: it never registers nor reports an end, so a run
    of world size 2 is not finished when rank 0 is; once nothing has been heard for the asked
    threshold it is silent, with one rank that never reported an end."""
    job = run_parallel_job(
        sqlite_server.url,
        "naive",
        2,
        "--steps=2",
        "--disable-rank=1",
        extra_env={"BUBBLESCOPE_CLOCK_HANDSHAKE_TIMEOUT_S": "3"},
    )
    assert job.returncode == 0, job.output[-3000:]
    with sqlite_server.client() as client:

        def rank0_ended() -> bool:
            ranks = client.get(f"/api/v1/runs/{job.run_key}").json()["ranks"]
            return [(r["rank"], r["outcome"]) for r in ranks] == [(0, "finished")]

        wait_until(rank0_ended, 30, "rank 0's end", interval_s=0.2)
        run = client.get(f"/api/v1/runs/{job.run_key}").json()
        assert run["world_size"] == 2
        assert run["state"] == "running" and "1 of 2 ranks finished" in run["state_detail"], run["state_detail"]
        time.sleep(2.2)  # SQLite stamps whole seconds
        later = client.get(f"/api/v1/runs/{job.run_key}", params={"silent_after_s": 1}).json()
    assert later["state"] == "silent", later["state_detail"]
    assert "1 of 2 ranks never reported an end" in later["state_detail"], later["state_detail"]
