"""The README's first command, as a new user runs it: its install line in a fresh virtual
environment that sees none of this machine's packages, then ``bubblescope demo`` (shortened to a
few steps, stopping when the job ends) through to a job that streamed every rank's steps."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import venv
from pathlib import Path

import pytest

from bubblescope.demo import DEFAULT_STAGES, usable_cores
from tests.support import REPO, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timing]


def readme_first_command() -> str:
    blocks = re.findall(r"```bash\n(.*?)\n```", (REPO / "README.md").read_text(), re.S)
    return blocks[0].strip()


def test_the_readme_quickstart_installs_and_runs_the_demo_in_a_fresh_venv(tmp_path: Path) -> None:
    install, _and, run = readme_first_command().partition(" && ")
    assert install.startswith("pip install ") and run == "bubblescope demo", "the README's first command changed shape"
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env_dir)
    path = f"{env_dir / 'bin'}{os.pathsep}{os.environ['PATH']}"
    env = {**os.environ, "PATH": path, "VIRTUAL_ENV": str(env_dir), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PYTHONPATH", None)
    installed = subprocess.run(["bash", "-c", install], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert installed.returncode == 0, installed.stderr[-4000:]

    database = tmp_path / "demo.db"
    steps = 3
    demo = f"{run} --steps {steps} --exit-after-job --db {database} --port {free_port()}"
    done = subprocess.run(["bash", "-c", demo], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "training job finished" in done.stdout, output[-6000:]
    assert re.search(r"dashboard: http://127\.0\.0\.1:\d+/runs/demo-1f1b-", done.stdout), done.stdout
    with sqlite3.connect(database) as connection:
        rows = connection.execute("SELECT rank, COUNT(DISTINCT step) FROM steps GROUP BY rank").fetchall()
    stages = max(2, min(DEFAULT_STAGES, usable_cores()))  # sized to the machine, and said so when lowered
    assert sorted(rows) == [(rank, steps) for rank in range(stages)], rows
    assert (f"{stages} stages, not {DEFAULT_STAGES}" in done.stdout) == (stages < DEFAULT_STAGES), done.stdout
