"""Detection latency of each alert rule on real torchrun jobs (gloo, CPU) with an injected fault.

A real ``bubblescope serve`` (SQLite) evaluates its rules; the demo job (``--inject``) makes one rank
raise, die of SIGKILL, or hang before its all-reduce or its pipeline step; for ``silent`` the whole
job is killed with SIGKILL; for ``slow``, tests/stragglers/straggler_job.py runs rank 3 at 1.6x the
others from its first step (latency from the job's launch, torchrun's start included). Prints, per scenario: the alert expected, the rank it named,
the seconds from the fault (the time the job printed as it injected it; for ``silent`` the kill) to
the alert being seen firing in ``GET /api/v1/alerts`` (polled every 0.2 s), and for the hangs the
seconds from the hang's end to the alert being seen resolved. The thresholds in force are printed
too: a hang cannot be detected before ``--hung-after``, a silence before ``--silent-after``.

    python bench/alert_latency.py [--scenarios raise,kill,hang-collective,hang-pipeline,silent,slow]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.alerts.fault_jobs import DEMO, STRAGGLER_JOB, alerts, injected_at, kill_job, launch
from tests.support import LiveServer, migrated_database, start_server

HUNG_AFTER_S = 5.0
SILENT_AFTER_S = 15.0
ALERT_INTERVAL_S = 2.0
WATCHDOG_S = 2.0
HANG_S = 25.0
POLL_S = 0.2


@dataclass(frozen=True)
class Scenario:
    name: str
    alert: str
    ranks: int
    args: tuple[str, ...]
    resolves_after_s: float | None = None  # the fault's end, after its injection
    job: tuple[str, ...] = DEMO


SCENARIOS = {
    "raise": Scenario("raise", "BubblescopeRunFailed", 2, ("--steps=12", "--inject=raise", "--inject-rank=1")),
    "kill": Scenario(
        "kill", "BubblescopeRunFailed", 2, ("--steps=60", "--inject=kill", "--inject-rank=1", "--inject-step=30")
    ),
    "hang-collective": Scenario(
        "hang-collective",
        "BubblescopeRunHung",
        2,
        ("--steps=30", "--inject=hang-collective", "--inject-rank=1", f"--inject-seconds={HANG_S}"),
        HANG_S,
    ),
    "hang-pipeline": Scenario(
        "hang-pipeline",
        "BubblescopeRunHung",
        2,
        ("--steps=30", "--inject=hang-pipeline", "--inject-rank=1", f"--inject-seconds={HANG_S}"),
        HANG_S,
    ),
    "silent": Scenario("silent", "BubblescopeRunSilent", 2, ("--steps=100000",)),
    "slow": Scenario(  # slow from its first step: measured from the job's start
        "slow", "BubblescopeStraggler", 4, ("--steps=200", "--hosts=hA,hA,hB,hB", "--slow=3:1.6"), job=STRAGGLER_JOB
    ),
}


@dataclass
class Measured:
    scenario: str
    alert: str
    named: str
    detect_s: float | None
    resolve_s: float | None


def run(service: LiveServer, scenario: Scenario, timeout_s: float = 240) -> Measured:
    run_key = f"latency-{scenario.name}-{uuid.uuid4().hex[:6]}"
    job = launch(service.url, run_key, scenario.ranks, *scenario.args, watchdog_s=WATCHDOG_S, job=scenario.job)
    started = time.time()
    fault_at: float | None = None
    seen_firing = seen_resolved = None
    named = "-"
    with service.client() as client:
        while time.time() - started < timeout_s:
            if scenario.name == "silent" and fault_at is None and time.time() - started > 20:
                fault_at = time.time()
                kill_job(job)  # the whole job: torchrun and every worker
            for alert in alerts(client, run_key):
                if alert["labels"]["alertname"] != scenario.alert:
                    continue
                if seen_firing is None:
                    seen_firing = time.time()
                    named = alert["labels"].get("rank", "-")
                if alert["status"] == "resolved" and seen_resolved is None:
                    seen_resolved = time.time()
            done = seen_firing is not None and (scenario.resolves_after_s is None or seen_resolved is not None)
            if done or (job.poll() is not None and scenario.name != "silent" and seen_firing is None and _late(job)):
                break
            time.sleep(POLL_S)
    if job.poll() is None:
        kill_job(job)
    output, _ = job.communicate(timeout=60)
    fault_at = fault_at or injected_at(output) or (started if scenario.job is STRAGGLER_JOB else None)
    detect = None if seen_firing is None or fault_at is None else seen_firing - fault_at
    resolve = None
    if seen_resolved is not None and fault_at is not None and scenario.resolves_after_s is not None:
        resolve = seen_resolved - (fault_at + scenario.resolves_after_s)
    return Measured(scenario.name, scenario.alert, named, detect, resolve)


def _late(job: subprocess.Popen[str]) -> bool:
    """The job ended: give the rules two more rounds before giving up on the alert."""
    time.sleep(2 * ALERT_INTERVAL_S + 1)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    args = parser.parse_args()
    serve = ["--hung-after", str(HUNG_AFTER_S), "--silent-after", str(SILENT_AFTER_S)]
    serve += ["--alert-interval", str(ALERT_INTERVAL_S)]
    print(f"serve {' '.join(serve)}; BUBBLESCOPE_WATCHDOG_AFTER_S={WATCHDOG_S}; hangs last {HANG_S:.0f} s")
    print(f"{'scenario':<16} {'alert':<28} {'rank named':>10} {'detected after s':>17} {'resolved after s':>17}")
    with tempfile.TemporaryDirectory() as folder, migrated_database("sqlite", Path(folder)) as url:
        service = start_server(url, Path(folder), extra_args=serve)
        try:
            for name in args.scenarios.split(","):
                measured = run(service, SCENARIOS[name])
                detect = "not detected" if measured.detect_s is None else f"{measured.detect_s:.1f}"
                resolve = "-" if measured.resolve_s is None else f"{measured.resolve_s:.1f}"
                print(f"{name:<16} {measured.alert:<28} {measured.named:>10} {detect:>17} {resolve:>17}", flush=True)
        finally:
            service.stop()


if __name__ == "__main__":
    main()
