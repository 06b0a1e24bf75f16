"""Launching ``tests.collector.hand_loop`` as a real process and reading its report."""

from __future__ import annotations

import gzip
import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bubblescope import wire
from bubblescope.collector.spool import Spool
from tests.support import REPO


@dataclass(frozen=True)
class LoopReport:
    baseline_s: list[float]
    instrumented_s: list[float]
    baseline_cpu_s: list[float]
    instrumented_cpu_s: list[float]
    baseline_cpu_wait_s: list[float]
    instrumented_cpu_wait_s: list[float]
    loop_s: float
    shipper_cpu_s: float | None
    shutdown_s: float
    spans_recorded: int
    dropped_spans: int | None  # None when the collector was disabled
    shipper_alive: bool
    enabled: bool
    threads_after_init: list[str]
    io_calls: dict[str, dict[str, int]]  # io_probe's counts during the loop, by thread

    @staticmethod
    def _own(walls: list[float], waits: list[float]) -> list[float]:
        return [wall - wait for wall, wait in zip(walls, waits)]

    @property
    def instrumented_own_s(self) -> list[float]:
        """Step wall times less the time the step waited for a CPU held by other processes."""
        return self._own(self.instrumented_s, self.instrumented_cpu_wait_s)

    @property
    def baseline_own_s(self) -> list[float]:
        return self._own(self.baseline_s, self.baseline_cpu_wait_s)

    def figures(self) -> str:
        """Step-time figures in ms, for assertion messages and the log (``bench/collector_faults.py``
        prints them for every misbehaving server; the tests assert no wall time)."""
        ms = lambda seconds: f"{seconds * 1e3:.2f} ms"
        median = statistics.median
        walls = (
            f"wall median {ms(median(self.instrumented_s))} vs baseline {ms(median(self.baseline_s))}, "
            f"worst {ms(max(self.instrumented_s))} vs {ms(max(self.baseline_s))}; "
            f"worst less CPU waits {ms(max(self.instrumented_own_s))} vs {ms(max(self.baseline_own_s))}; "
            f"CPU median {ms(median(self.instrumented_cpu_s))} vs {ms(median(self.baseline_cpu_s))}; "
            if self.baseline_s
            else ""
        )
        return (
            f"{walls}shipper thread CPU {self.shipper_cpu_s} s in a {self.loop_s:.2f} s loop; "
            f"shutdown {self.shutdown_s:.2f} s; dropped {self.dropped_spans} of {self.spans_recorded} spans; "
            f"calls that can block: {self.io_calls}"
        )

    def assert_loop_not_held_up(self) -> None:
        """The collector does not hold the training loop up, read from behaviour, not wall time
        (on a shared 2-core machine other jobs stretch single steps by 30-70 ms at random):

        - Inside the loop, the training thread makes no call that can block on the collector's
          behalf: no socket I/O, no spool write, no sleep, no wait (``io_probe``). A network
          wait, a retry pause or a spool write on the training thread fails this, however fast
          the machine happens to be; whatever the server does then reaches the loop only
          through the CPU it takes, which the next two bounds check.
        - The median step's thread CPU time within 30% (+0.5 ms) of the baseline's: the
          collector's own work per step (span records, hand-off) stays small.
        - The shipper thread busy for at most a fifth of the loop: a shipper hogging the
          interpreter (and so the GIL) would show here.

        How much wall time the steps take against the baseline is ``bench/collector_faults.py``'s
        figure.
        """
        median = statistics.median
        assert not self.io_calls["on_training_thread"], self.figures()
        assert median(self.instrumented_cpu_s) <= median(self.baseline_cpu_s) * 1.3 + 0.0005, self.figures()
        if self.shipper_cpu_s is not None:
            assert self.shipper_cpu_s <= 0.2 * self.loop_s, self.figures()


def launch(
    tmp_path: Path, url: str | None, run_key: str, *args: str, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], Path]:
    """Start the hand-written loop; returns the process and the path its report will have."""
    report = tmp_path / f"{run_key}.json"
    command = [
        sys.executable,
        "-m",
        "tests.collector.hand_loop",
        "--spool",
        str(tmp_path / "spool"),
        "--run-key",
        run_key,
        "--report",
        str(report),
        *args,
    ]
    if url is not None:
        command += ["--url", url]
    log = open(tmp_path / f"{run_key}.log", "wb")  # noqa: SIM115 (the job writes it until it ends)
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    process = subprocess.Popen(command, cwd=REPO, env=full_env, stdout=log, stderr=subprocess.STDOUT)
    return process, report


def read_report(tmp_path: Path, run_key: str, process: subprocess.Popen[bytes], timeout_s: float = 120) -> LoopReport:
    code = process.wait(timeout_s)
    output = (tmp_path / f"{run_key}.log").read_text()
    assert code == 0, output[-3000:]
    document = json.loads((tmp_path / f"{run_key}.json").read_text())
    return LoopReport(**{k: document[k] for k in LoopReport.__dataclass_fields__})


def spooled_ingest_contents(spool: Path) -> tuple[set[int], int]:
    """Steps and span count of every ingest batch waiting in a spool, read back from the files."""
    steps: set[int] = set()
    spans = 0
    for _path, message in Spool(spool, 1 << 62).pending():
        if message.path == f"{wire.API_PREFIX}/ingest":
            batch = json.loads(gzip.decompress(message.body))
            steps |= {step["step"] for step in batch["steps"]}
            spans += len(batch["spans"]["step"])
    return steps, spans
