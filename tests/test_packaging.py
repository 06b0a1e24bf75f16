"""The wheel installs in a fresh venv; the collector works there without any server dependency."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from tests.support import REPO

pytestmark = [pytest.mark.slow, pytest.mark.timing]


def test_wheel_collector_works_without_server_dependencies(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(REPO)],
        check=True,
        capture_output=True,
        text=True,
    )
    wheels = list(dist.glob("bubblescope-*.whl"))
    assert len(wheels) == 1
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--no-deps", "--no-index", str(wheels[0])],
        check=True,
        capture_output=True,
        text=True,
    )
    probe = (
        "import importlib.util, sys\n"
        "from bubblescope import collector\n"
        "for name in ('fastapi', 'sqlalchemy', 'pydantic', 'torch'):\n"
        "    assert importlib.util.find_spec(name) is None, name\n"
        f"collector.init(run='wheel', url='http://127.0.0.1:9', spool_dir={str(tmp_path / 'spool')!r}, run_key='w1')\n"
        "with collector.step():\n"
        "    with collector.span('forward', microbatch=0):\n"
        "        pass\n"
        "collector.shutdown()\n"
        "from bubblescope.collector import native\n"
        "print('collector-ok', 'c-hot-path' if native.hotpath is not None else 'python-wrappers')\n"
    )
    # cwd outside the checkout, so the repo's own bubblescope/ folder cannot shadow the install
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0 and "collector-ok" in done.stdout, done.stderr
    if shutil.which((sysconfig.get_config_var("CC") or "cc").split()[0]):  # the wheel carries the C hot path
        assert "c-hot-path" in done.stdout, done.stdout
    assert list((tmp_path / "spool").rglob("*.msg"))
    cli = subprocess.run([str(env_dir / "bin" / "bubblescope"), "serve"], capture_output=True, text=True, cwd=tmp_path)
    assert cli.returncode == 2 and "bubblescope[server]" in cli.stderr
    files = subprocess.run(
        [
            str(python),
            "-c",
            "import bubblescope.frontend as f, os; print(sorted(os.listdir(os.path.dirname(f.__file__))))",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout
    assert "run.js" in files and "index.html" in files
    migrations = subprocess.run(
        [
            str(python),
            "-c",
            "import bubblescope.migrations.versions as v, os; print(os.listdir(os.path.dirname(v.__file__)))",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout
    assert "0001_initial.py" in migrations
