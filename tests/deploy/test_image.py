"""The Dockerfile, performed natively (no Docker engine here): its COPY from a read-only tree filtered by
.dockerignore, its RUN pip steps into a fresh virtual environment, then the installed ``bubblescope``:
``serve --help``, ``db upgrade`` on a new SQLite file, and a served page. The old compose installed the
package at container start from a read-only mount of the tree, which failed ("could not create
'bubblescope.egg-info': Read-only file system"); the tree here must come out of the build unchanged."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import venv
from pathlib import Path

import httpx
import pytest

from tests.deploy.files import (
    Instruction,
    context_files,
    docker_copy,
    dockerfile_env,
    dockerfile_instructions,
    dockerignore_rules,
    ignored,
)
from tests.support import REPO, free_port, wait_until

# Not part of what a `docker build` would see anyway (.dockerignore leaves them out), and large.
SNAPSHOT_SKIP = {".git", ".venv", "test-output", ".pytest_cache", ".ruff_cache", ".mypy_cache", "build", "dist"}


def test_the_dockerfile_builds_a_server_image_that_runs_as_a_user() -> None:
    instructions = dockerfile_instructions()
    assert instructions[0] == Instruction("FROM", "python:3.11-slim")
    assert sum(1 for i in instructions if i.keyword == "FROM") == 1, "one stage: what the test performs is the image"
    users = [i.arguments for i in instructions if i.keyword == "USER"]
    assert users and users[-1] not in {"root", "0", "0:0"}, users
    (entrypoint,) = [i.json_form() for i in instructions if i.keyword == "ENTRYPOINT"]
    assert entrypoint == ["bubblescope"]
    installs = [i.arguments for i in instructions if i.keyword == "RUN" and "pip" in i.arguments]
    assert len(installs) == 1 and "'.[server]'" in installs[0], installs
    assert " -e " not in f" {installs[0]} " and "--editable" not in installs[0]  # /build is removed after


def test_the_server_extra_needs_no_torch() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert not [requirement for requirement in extras["server"] if re.match(r"torch\b", requirement)]


def test_dockerignore_leaves_out_secrets_tests_and_build_output(tmp_path: Path) -> None:
    rules = dockerignore_rules()
    for kept in ("pyproject.toml", "setup.py", "README.md", "backend/app.py", "collector/_hotpath.c"):
        assert not ignored(kept, rules), kept
    kept_frontend = ("frontend/run.html", "migrations/versions/0001_initial.py", "bubblescope/cli.py")
    assert not any(ignored(path, rules) for path in kept_frontend)
    for left_out in (
        ".env",
        ".env.example",
        "tests/test_docs.py",
        "docs/deployment.md",
        "deploy/prometheus/prometheus.yml",
        ".git/config",
        "bubblescope.egg-info/PKG-INFO",
        "backend/__pycache__/app.cpython-311.pyc",
        "collector/_hotpath.cpython-311-x86_64-linux-gnu.so",
        "build/lib/bubblescope/cli.py",
        ".venv/bin/python",
        "bubblescope.db",
        "docker-compose.yml",
    ):
        assert ignored(left_out, rules), left_out
    # The matcher itself: Docker's semantics, not .gitignore's (a bare name is anchored at the root).
    assert ignored("a/b.pyc", dockerignore_rules("**/*.pyc")) and not ignored("a/b.pyc", dockerignore_rules("*.pyc"))
    assert not ignored("keep/x", dockerignore_rules("*\n!keep")) and ignored("other/x", dockerignore_rules("*\n!keep"))
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("")
    (tmp_path / ".env").write_text("BUBBLESCOPE_ADMIN_TOKEN=bs_secret\n")
    assert list(context_files(tmp_path, dockerignore_rules("*\n!pkg"))) == ["pkg/m.py"]


def _snapshot(tree: Path) -> dict[str, tuple[int, int]]:
    return {
        path.relative_to(tree).as_posix(): (path.stat().st_mtime_ns, path.stat().st_size)
        for path in tree.rglob("*")
        if not path.is_symlink()
    }


def _read_only_copy(destination: Path) -> Path:
    """The working tree as a read-only folder, like the ``./:/app:ro`` mount of the old compose."""
    shutil.copytree(
        REPO,
        destination,
        symlinks=True,
        ignore=lambda folder, names: [n for n in names if Path(folder) == REPO and n in SNAPSHOT_SKIP],
    )
    for path in [destination, *destination.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode & ~0o222)
    return destination


def _head_revision() -> str:
    """The migration no other one revises: what ``db upgrade`` must leave the database at."""
    revisions, revised = set(), set()
    for script in (REPO / "migrations" / "versions").glob("*.py"):
        text = script.read_text()
        if found := re.search(r'^revision\s*=\s*"([^"]+)"', text, re.M):
            revisions.add(found[1])
        if found := re.search(r'^down_revision\s*=\s*"([^"]+)"', text, re.M):
            revised.add(found[1])
    (head,) = revisions - revised
    return head


def _run_step(instruction: Instruction, workdir: str, root: Path, env: dict[str, str]) -> None:
    """A RUN step natively: the container's paths under ``root``, in the Dockerfile's working directory."""
    command = instruction.arguments
    for container_path in sorted({workdir, "/build"}, key=len, reverse=True):
        command = re.sub(
            rf"(?<![\w/.]){re.escape(container_path)}(?![\w.-])", str(root / container_path.lstrip("/")), command
        )
    done = subprocess.run(
        ["/bin/sh", "-c", command], cwd=root / workdir.lstrip("/"), env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"RUN {instruction.arguments}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


@pytest.mark.slow
def test_the_image_installs_from_a_read_only_tree_and_serves(tmp_path: Path) -> None:
    source = _read_only_copy(tmp_path / "source")
    before = _snapshot(source)
    root = tmp_path / "image"  # the container's file system
    env_dir = tmp_path / "venv"
    # The system's packages stay visible (no reinstalling FastAPI and the rest); bubblescope itself must be
    # the one the Dockerfile's step installs into this environment.
    venv.EnvBuilder(system_site_packages=True, with_pip=True).create(env_dir)
    instructions = dockerfile_instructions()
    env = {
        **os.environ,
        **dockerfile_env(instructions),
        "PATH": f"{env_dir / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "VIRTUAL_ENV": str(env_dir),
    }
    env.pop("PYTHONPATH", None)
    workdir = "/"
    copied: list[str] = []
    performed = []
    for instruction in instructions:
        if instruction.keyword == "WORKDIR":
            workdir = instruction.arguments
            (root / workdir.lstrip("/")).mkdir(parents=True, exist_ok=True)
        elif instruction.keyword == "COPY":
            sources_and_target = shlex.split(instruction.arguments)
            assert sources_and_target == [".", "."], f"COPY {instruction.arguments}: the whole context, to WORKDIR"
            copied = docker_copy(source, root / workdir.lstrip("/"))
            performed.append("COPY")
        elif instruction.keyword == "RUN" and re.search(r"\bpip\b", instruction.arguments):
            _run_step(instruction, workdir, root, env)
            performed.append("RUN pip")
        elif instruction.keyword == "RUN":
            # Everything else the image runs only sets up its user: nothing that installs.
            assert re.match(r"(useradd|groupadd)\b", instruction.arguments), f"RUN {instruction.arguments}"
    assert performed == ["COPY", "RUN pip"], performed
    assert "pyproject.toml" in copied and "frontend/run.html" in copied
    assert not any(name.startswith(("tests/", "docs/", "deploy/")) or name == ".env" for name in copied)

    # The tree was only read: nothing written next to its sources (bubblescope.egg-info, build/, ...).
    assert _snapshot(source) == before
    assert not (root / "build").exists(), "the build directory is removed once installed"

    bin_dir = env_dir / "bin"
    # No torch in the image: a torch that cannot be imported shadows the system's.
    no_torch = tmp_path / "no-torch"
    (no_torch / "torch").mkdir(parents=True)
    (no_torch / "torch" / "__init__.py").write_text("raise ImportError('torch is not in the service image')\n")
    run_env = {**env, "PYTHONPATH": str(no_torch)}
    here = tmp_path / "cwd"  # outside the checkout, so the repository's own folders cannot be imported
    here.mkdir()

    def bubblescope(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(bin_dir / "bubblescope"), *args], cwd=here, env=run_env, capture_output=True, text=True, timeout=120
        )

    where = subprocess.run(
        [str(bin_dir / "python"), "-c", "import bubblescope.backend.app as m; print(m.__file__)"],
        cwd=here,
        env=run_env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(where).is_relative_to(env_dir), f"bubblescope imported from {where}, not the image's install"

    helped = bubblescope("serve", "--help")
    assert helped.returncode == 0, helped.stderr
    assert "--auth" in helped.stdout and "--alertmanager-url" in helped.stdout

    database = tmp_path / "data" / "bubblescope.db"
    database.parent.mkdir()
    head = _head_revision()
    upgraded = bubblescope("db", "upgrade", "--db", f"sqlite:///{database}")
    assert upgraded.returncode == 0, upgraded.stderr
    assert f"schema revision {head} (head {head})" in upgraded.stdout, upgraded.stdout
    with sqlite3.connect(database) as connection:
        (revision,) = connection.execute("SELECT version_num FROM alembic_version").fetchone()
        tables = {name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert revision == head
    assert {"runs", "ranks", "alerts", "api_tokens"} <= tables, tables

    # The installed package carries its pages and assets: serve one, from this install.
    port = free_port()
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115 (the server writes it until it stops)
    server = subprocess.Popen(
        [str(bin_dir / "bubblescope"), "serve", "--db", f"sqlite:///{database}", "--port", str(port)],
        cwd=here,
        env=run_env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:

        def healthy() -> bool:
            assert server.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                return httpx.get(f"http://127.0.0.1:{port}/api/v1/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(healthy, 60, "the installed service to answer", interval_s=0.2)
        page = httpx.get(f"http://127.0.0.1:{port}/runs/some-run", timeout=10)
        assert page.status_code == 200 and "<html" in page.text.lower()
    finally:
        server.terminate()
        server.wait(30)
        log.close()
