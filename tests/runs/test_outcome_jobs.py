"""How a real job ended, as the service shows it: a clean torchrun job is finished; one whose
rank raises is failed, naming that rank and its exception. (A killed job: silent, in
``tests/collector/test_killed_and_disabled.py``.)"""

from __future__ import annotations

from typing import Any

from tests.support import LiveServer, run_parallel_job, wait_until


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
