"""``bench/collector_overhead_one_device.py`` runs (here on the CPU, gloo) and reports its figures.

This checks that the bench works and that what it prints is well formed: the steps and block
pairs it counted, ratios that are positive finite numbers in a consistent interval. It does not
bound the overhead: 80 tiny steps on a shared 2-core machine say nothing about it, and the
overhead target is the bench's own figure (README, Benchmarks).
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys

import pytest

from tests.support import REPO

pytestmark = pytest.mark.slow  # a DDP job (gloo, a world of one) in a subprocess

# The bench must run where only torch is (a lent GPU machine): the server's stack is hidden from it.
WITHOUT_THE_SERVER_STACK = """
import runpy, sys
for name in ("sqlalchemy", "alembic", "fastapi", "uvicorn", "plotly", "pydantic"):
    sys.modules[name] = None
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_the_one_device_bench_runs_on_the_cpu_without_the_server_stack_and_reports_well_formed_figures() -> None:
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
    number = r"([-+\w.]+)"  # whatever it printed, nan and inf included: parsed and checked below
    ratio = re.search(
        rf"step-time ratio \(median of (\d+) block pairs\): {number} \(95% CI {number}–{number}\); "
        rf"ratio of totals {number}",
        done.stdout,
    )
    assert ratio is not None, done.stdout
    pairs = int(ratio[1])
    median, low, high, totals = (float(ratio[i]) for i in range(2, 6))
    assert pairs == 8, done.stdout  # 40 + 40 steps in blocks of 5: 8 ABBA block pairs
    assert all(math.isfinite(x) and x > 0 for x in (median, low, high, totals)), done.stdout
    assert low <= median <= high, done.stdout
    shipper = re.search(rf"shipper thread: {number} ms CPU per collected step", done.stdout)
    assert shipper is not None and math.isfinite(float(shipper[1])) and float(shipper[1]) >= 0, done.stdout
