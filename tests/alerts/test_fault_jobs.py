"""Real torchrun jobs (gloo, CPU) with one faulty rank: each gives the right alert, naming the right
rank and host, and it resolves. A healthy job pages nobody. (A failed alert resolves when the run runs
again, e.g. under torchrun's ``--max-restarts``: shown through the API with a re-registering worker,
because a restarted attempt of the demo job sometimes hangs on this loaded machine; see docs/alerts.md,
"Known gaps".)

The faults come from the demo job's ``--inject`` (bubblescope/demo_faults.py): an exception, a
SIGKILL (as the out-of-memory killer), a rank stuck before the gradient all-reduce, one stuck before
its pipeline step (its peer waits in a P2P recv), and a slowed rank. Detection latency is measured
by bench/alert_latency.py, not here.
"""

from __future__ import annotations

import signal
import socket
import time
import uuid
from collections.abc import Iterator

import pytest

from tests.alerts.fault_jobs import STRAGGLER_JOB, alerts, fault_service, finish, launch, wait_for
from tests.support import LiveServer, register, scrape_until

pytestmark = [pytest.mark.slow, pytest.mark.timing]
HOST = socket.gethostname()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    yield from fault_service(tmp_path_factory)


def test_a_rank_that_raises_is_named(service: LiveServer) -> None:
    run_key = f"raise-{uuid.uuid4().hex[:8]}"
    job = launch(service.url, run_key, 2, "--steps=12", "--inject=raise", "--inject-rank=1")
    with service.client() as client:
        alert = wait_for(client, run_key, "BubblescopeRunFailed", "firing")
        assert alert["labels"]["rank"] == "1" and alert["labels"]["host"] == HOST
        assert "injected failure at step 5" in alert["annotations"]["description"]
        assert alert["generatorURL"].endswith(f"/runs/{run_key}#ranks")
        finish(job)
        assert job.returncode != 0


def test_a_failed_alert_resolves_when_the_failed_rank_restarts(service: LiveServer) -> None:
    """What torchrun --max-restarts does: the failed rank's new process registers again (a new pid)."""
    with service.client() as client:
        run_key = register(client)
        for rank in (0, 1):
            worker = {"host": HOST, "pid": 100 + rank, "clock_offset_ns": 0, "clock_uncertainty_ns": 0}
            assert client.put(f"/api/v1/runs/{run_key}/ranks/{rank}", json=worker).status_code == 200
        end = {"outcome": "failed", "error": "RuntimeError: CUDA error: out of memory", "pid": 101}
        assert client.put(f"/api/v1/runs/{run_key}/ranks/1/end", json=end).status_code == 200
        fired = wait_for(client, run_key, "BubblescopeRunFailed", "firing", timeout_s=30)
        assert fired["labels"]["rank"] == "1", fired
        restarted = {"host": HOST, "pid": 201, "clock_offset_ns": 0, "clock_uncertainty_ns": 0}
        assert client.put(f"/api/v1/runs/{run_key}/ranks/1", json=restarted).status_code == 200
        resolved = wait_for(client, run_key, "BubblescopeRunFailed", "resolved", timeout_s=30)
        assert resolved["fingerprint"] == fired["fingerprint"] and resolved["startsAt"] == fired["startsAt"]


def test_a_killed_rank_is_named_though_its_peer_failed_first_on_the_broken_connection(service: LiveServer) -> None:
    run_key = f"kill-{uuid.uuid4().hex[:8]}"
    job = launch(service.url, run_key, 2, "--steps=40", "--inject=kill", "--inject-rank=1", "--inject-step=25")
    with service.client() as client:
        alert = wait_for(client, run_key, "BubblescopeRunFailed", "firing")
        assert alert["labels"]["rank"] == "1" and alert["labels"]["host"] == HOST, alert
        assert "without reporting an end" in alert["annotations"]["description"]
        finish(job)
        assert job.returncode != 0


def test_ranks_terminated_by_the_launcher_report_sigterm_as_their_end(service: LiveServer) -> None:
    """A scheduler's preemption: SIGTERM to torchrun, which passes it to every rank; each reports a failed end whose
    error says it was terminated (docs/collector.md), so the run reads failed, not silent."""
    run_key = f"sigterm-{uuid.uuid4().hex[:8]}"
    job = launch(service.url, run_key, 2, "--steps=400")
    with service.client() as client:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and client.get(f"/api/v1/runs/{run_key}").json().get("step_count", 0) < 3:
            time.sleep(0.5)
        job.send_signal(signal.SIGTERM)
        finish(job)
        assert job.returncode != 0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            run = client.get(f"/api/v1/runs/{run_key}").json()
            if all(r["outcome"] for r in run["ranks"]):
                break
            time.sleep(0.5)
    assert run["step_count"] >= 3 and run["state"] == "failed", run["state"]
    ends = {r["rank"]: (r["outcome"], r["error"]) for r in run["ranks"]}
    assert all(outcome == "failed" and error.startswith("SIGTERM: terminated") for outcome, error in ends.values()), (
        ends
    )


@pytest.mark.parametrize(
    ("fault", "blocked_in"),
    [
        ("hang-collective", "rank 0 waits in all_reduce 'grad_norm'"),
        ("hang-pipeline", "rank 0 waits in send 'fwd' with rank 1 on group pp"),  # gloo: until the recv is posted
    ],
)
def test_a_stuck_rank_is_named_with_what_the_others_wait_in_and_the_alert_resolves(
    service: LiveServer, fault: str, blocked_in: str
) -> None:
    run_key = f"{fault}-{uuid.uuid4().hex[:8]}"
    job = launch(service.url, run_key, 2, "--steps=20", f"--inject={fault}", "--inject-rank=1", "--inject-seconds=14")
    with service.client() as client:
        alert = wait_for(client, run_key, "BubblescopeRunHung", "firing", timeout_s=60)
        assert alert["labels"]["rank"] == "1" and alert["labels"]["host"] == HOST, alert
        description = alert["annotations"]["description"]
        assert "rank 1 (host" in description and "outside any collective" in description, description
        assert blocked_in in description, description
        run = client.get(f"/api/v1/runs/{run_key}").json()
        ranks = {r["rank"]: r for r in run["ranks"]}
        assert ranks[1]["in_flight"]["op"] is None and ranks[0]["in_flight"]["op"] is not None
        assert ranks[0]["last_step"] == ranks[1]["last_step"] == 4
        # the run's state says it too, names the same rank, and the run list's filter and /metrics find it
        assert run["state"] == "hung" and "wait for rank 1 (host" in run["state_detail"], run["state_detail"]
        listed = client.get("/api/v1/runs", params={"state": "hung"}).json()
        assert run_key in [r["key"] for r in listed], listed
        scrape_until(client, lambda text: f'bubblescope_run_state{{run="{run_key}",state="hung"}} 1.0' in text)
        wait_for(client, run_key, "BubblescopeRunHung", "resolved", timeout_s=60)
        assert client.get(f"/api/v1/runs/{run_key}").json()["state"] in ("running", "finished")
        output = finish(job)
        assert job.returncode == 0, output[-3000:]


def test_a_healthy_job_pages_nobody(service: LiveServer) -> None:
    """No alert at all, info included, over 40 steps. Each layer also waits 5 ms forward and 10 ms backward,
    asleep, as on a GPU (demo_job ``--device-ms``), so that each action's work outweighs the CPU pipelining
    runtime's own cost per action (about 1 ms, idle between the actions, which the simulator's floor leaves
    out) however loaded the machine: with CPU work alone (hidden 1024, about 7 ms an action) a loaded CI
    machine once put the bubble 14 points above the floor (23% against 9%), a standing overhead, not a
    fault."""
    run_key = f"healthy-{uuid.uuid4().hex[:8]}"
    job = launch(service.url, run_key, 2, "--steps=40", "--hidden=256", "--device-ms=5", "--microbatches=8")
    output = finish(job)
    assert job.returncode == 0, output[-3000:]
    time.sleep(3)  # two evaluation rounds after the last batch
    with service.client() as client:
        raised = alerts(client, run_key)
        assert raised == [], [(a["labels"], a["annotations"]["description"]) for a in raised]


def test_a_slowed_rank_is_named_as_a_straggler_while_the_job_runs_and_resolves_when_it_ends(
    service: LiveServer,
) -> None:
    """tests/stragglers/straggler_job.py: four ranks on two hosts, rank 3 computing 1.6x the others."""
    run_key = f"slow-{uuid.uuid4().hex[:8]}"
    args = ("--steps=60", "--hosts=hA,hA,hB,hB", "--slow=3:1.6")
    job = launch(service.url, run_key, 4, *args, job=STRAGGLER_JOB)
    with service.client() as client:
        alert = wait_for(client, run_key, "BubblescopeStraggler", "firing", timeout_s=120)
        assert alert["labels"]["rank"] == "3" and alert["labels"]["host"] == "hB", alert
        assert "rank 3 (host hB" in alert["annotations"]["description"]
        output = finish(job)
        assert job.returncode == 0, output[-3000:]
        wait_for(client, run_key, "BubblescopeStraggler", "resolved", timeout_s=30)
