"""What a first run meets: ``bubblescope demo --url`` streams into the running service it names;
the demo job runs under torchrun as documented (``--run-name``, ``--url``), takes its name from
``--run-name``, then ``BUBBLESCOPE_RUN``, then its schedule; and a job without a service URL says
where it spools and how to deliver it later, with a command that does."""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support import LiveServer, wait_for_steps

pytestmark = pytest.mark.timing  # binds the demo's default port, which the README quickstart's demo serves on

JOB = ["--steps", "2", "--hidden", "64", "--microbatches", "2", "--microbatch-size", "4"]


def clean_env(**settings: str) -> dict[str, str]:
    """No BUBBLESCOPE_* variable from outside the test; one thread per process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUBBLESCOPE_")}
    return {**env, "OMP_NUM_THREADS": "1", "BUBBLESCOPE_FLUSH_INTERVAL_S": "0.2", **settings}


def run(command: list[str], env: dict[str, str], timeout_s: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s)


def bubblescope(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run([sys.executable, "-m", "bubblescope.cli", *args], env or clean_env())


def torchrun_demo_job(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """As a user runs it: ``torchrun --standalone --nproc-per-node 2 -m bubblescope.demo_job ...``."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    return run([*command, "-m", "bubblescope.demo_job", *args, *JOB], env)


def upload(command: str, url: str) -> subprocess.CompletedProcess[str]:
    """The ``bubblescope upload-spool ...`` command a notice gave, with its ``URL`` filled in."""
    program, *args = shlex.split(command.replace("--url URL", f"--url {url}", 1))
    assert program == "bubblescope", command
    return bubblescope(*args)


def run_detail(server: LiveServer, run_key: str, ranks: int = 2, steps: int = 2) -> dict[str, Any]:
    with server.client() as client:
        return wait_for_steps(client, run_key, ranks=ranks, steps=steps)


def test_no_serve_without_url_is_an_error_naming_the_option() -> None:
    done = bubblescope("demo", "--no-serve")
    assert done.returncode == 2 and "--url" in done.stderr, done.stderr


def test_the_embedded_service_without_auth_is_refused_on_a_non_loopback_address() -> None:
    done = bubblescope("demo", "--host", "0.0.0.0")
    assert done.returncode == 2 and "--host 0.0.0.0" in done.stderr and "serve --auth" in done.stderr, done.stderr


def test_url_with_the_embedded_service_options_is_an_error_naming_them(tmp_path: Path) -> None:
    done = bubblescope("demo", "--url", "http://127.0.0.1:9", "--db", str(tmp_path / "x.db"), "--port", "9999")
    assert done.returncode == 2 and "--db and --port" in done.stderr, done.stderr
    done = bubblescope("demo", "--url", "127.0.0.1:8765")
    assert done.returncode == 2 and "http://HOST:PORT" in done.stderr, done.stderr


@pytest.mark.slow
def test_demo_with_a_url_streams_into_that_service_and_starts_none(sqlite_server: LiveServer) -> None:
    done = bubblescope(
        "demo", "--url", sqlite_server.url, "--stages", "2", "--steps", "2", "--hidden", "64", "--microbatches", "2"
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "bubblescope service on" not in output and "serving until" not in output, output
    match = re.search(re.escape(sqlite_server.url) + r"/runs/(\S+)", done.stdout)
    assert match, done.stdout
    detail = run_detail(sqlite_server, match.group(1))
    assert detail["name"] == "demo-1f1b"


def demo_job_long_options() -> list[str]:
    from bubblescope.demo_job import build_parser

    return [
        option
        for action in build_parser()._actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    ]


def test_no_demo_job_option_is_ambiguous_to_torchruns_parser() -> None:
    from torch.distributed.run import get_args_parser

    torchrun = get_args_parser()
    clashing = []
    for option in demo_job_long_options():
        if option == "--run":
            continue  # the old spelling, kept only to name the new one
        try:
            parsed = torchrun.parse_args(["--standalone", "-m", "bubblescope.demo_job", option, "x"])
        except SystemExit:
            clashing.append(option)
            continue
        assert parsed.training_script_args == [option, "x"], option
    assert clashing == []


def test_the_old_run_option_names_the_new_one() -> None:
    done = run([sys.executable, "-m", "bubblescope.demo_job", "--run", "x"], clean_env(), timeout_s=60)
    assert done.returncode == 2 and "--run is now --run-name" in done.stderr, done.stderr


@pytest.mark.slow
def test_run_name_and_url_options_under_torchrun_beat_the_environment(sqlite_server: LiveServer) -> None:
    key = f"first-run-{uuid.uuid4().hex[:8]}"
    env = clean_env(BUBBLESCOPE_RUN="named-by-env", BUBBLESCOPE_RUN_ID=key)  # no BUBBLESCOPE_URL
    done = torchrun_demo_job("--run-name", "named-by-option", "--url", sqlite_server.url, env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "no service URL" not in done.stderr
    assert run_detail(sqlite_server, key)["name"] == "named-by-option"


@pytest.mark.slow
def test_a_job_without_url_is_named_by_the_environment_and_says_how_to_deliver_its_spool(
    sqlite_server: LiveServer, tmp_path: Path
) -> None:
    key = f"first-run-spooled-{uuid.uuid4().hex[:8]}"
    env = clean_env(BUBBLESCOPE_RUN="named-by-env", BUBBLESCOPE_RUN_ID=key, BUBBLESCOPE_SPOOL_DIR=str(tmp_path))
    done = torchrun_demo_job(env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    notices = [line for line in done.stderr.splitlines() if "no service URL" in line]
    assert len(notices) == 1, done.stderr  # once per host: local rank 0
    command = notices[0].split("deliver them later with: ")[1]
    assert str(tmp_path / key) in command
    assert upload(command, sqlite_server.url).returncode == 0
    assert run_detail(sqlite_server, key)["name"] == "named-by-env"


NO_URL = textwrap.dedent(
    """
    import sys
    from bubblescope import collector
    collector.init(run="no-url", run_key=sys.argv[1], full_spans_every=1)
    for step in range(3):
        with collector.step():
            with collector.span("forward", microbatch=0, stage=0):
                pass
    collector.shutdown()
    """
)


def test_a_job_without_url_warns_once_where_it_spools_and_the_command_delivers_it(
    sqlite_server: LiveServer, tmp_path: Path
) -> None:
    key = f"no-url-{uuid.uuid4().hex[:8]}"
    env = clean_env(BUBBLESCOPE_SPOOL_DIR=str(tmp_path / "spool dir"))
    done = run([sys.executable, "-c", NO_URL, key], env, timeout_s=60)
    assert done.returncode == 0, done.stderr
    notices = [line for line in done.stderr.splitlines() if "no service URL" in line]
    assert len(notices) == 1, done.stderr
    assert str(tmp_path / "spool dir" / key) in notices[0]
    command = notices[0].split("deliver them later with: ")[1]
    assert command.startswith("bubblescope upload-spool --url URL --spool-dir ")
    delivered = upload(command, sqlite_server.url)
    assert delivered.returncode == 0 and "delivered" in delivered.stdout, delivered.stdout + delivered.stderr
    detail = run_detail(sqlite_server, key, ranks=1, steps=3)
    assert detail["name"] == "no-url"


def test_demo_moves_off_a_taken_default_port_and_exits_after_its_job_without_inviting_a_visit(tmp_path: Path) -> None:
    """The default port held by another program: the demo says so in one line and serves on a free one; with
    ``--exit-after-job`` it does not tell the reader to open a dashboard that is about to stop."""
    from bubblescope.demo import DEFAULT_PORT

    holder = socket.socket()
    try:
        holder.bind(("127.0.0.1", DEFAULT_PORT))
        holder.listen()
    except OSError:
        pass  # taken already by another program: the demo must move off it all the same
    try:
        done = bubblescope(
            "demo", "--exit-after-job", "--db", str(tmp_path / "demo.db"), "--stages", "2", *JOB, env=clean_env()
        )
    finally:
        holder.close()
    assert done.returncode == 0, done.stderr[-3000:]
    moved = re.search(rf"port {DEFAULT_PORT} is taken on 127\.0\.0\.1: serving on (\d+) instead", done.stdout)
    assert moved and int(moved[1]) != DEFAULT_PORT, done.stdout
    assert f"dashboard: http://127.0.0.1:{moved[1]}/runs/" in done.stdout, done.stdout
    assert "training job finished" in done.stdout and "the service stops (--exit-after-job)" in done.stdout
    assert "open the dashboard" not in done.stdout, done.stdout
