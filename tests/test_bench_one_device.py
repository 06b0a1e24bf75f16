"""``bench/collector_overhead_one_device.py`` runs (here on the CPU, gloo) and reports its figures."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.support import REPO

# The bench must run where only torch is (a lent GPU machine): the server's stack is hidden from it.
WITHOUT_THE_SERVER_STACK = """
import runpy, sys
for name in ("sqlalchemy", "alembic", "fastapi", "uvicorn", "plotly", "pydantic"):
    sys.modules[name] = None
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_the_one_device_overhead_bench_runs_on_the_cpu_without_the_server_stack_and_reports_a_ratio() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            WITHOUT_THE_SERVER_STACK,
            str(REPO / "bench" / "collector_overhead_one_device.py"),
            "--device",
            "cpu",
            "--width",
            "256",
            "--layers",
            "2",
            "--batch",
            "16",
            "--steps",
            "80",
            "--block",
            "5",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=REPO,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "DDP world of one, 2×Linear(256)" in done.stdout and "collector at defaults" in done.stdout
    counts = re.search(r"steps: (\d+) collected, (\d+) baseline", done.stdout)
    assert counts is not None and counts.groups() == ("40", "40"), done.stdout
    ratio = re.search(
        r"step-time ratio \(median of (\d+) block pairs\): ([\d.]+) \(95% CI ([\d.]+)–([\d.]+)\)", done.stdout
    )
    assert ratio is not None, done.stdout
    pairs, median, low, high = int(ratio[1]), float(ratio[2]), float(ratio[3]), float(ratio[4])
    assert pairs == 8 and 0.5 < low <= median <= high < 2.0, done.stdout
