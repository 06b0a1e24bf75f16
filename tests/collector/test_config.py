"""Every ``BUBBLESCOPE_*`` setting lives in ``collector.config.CollectorConfig``: each variable set to
garbage warns once, naming itself and its value, and the collector runs on its default; nothing
is parsed at import; ``init()`` arguments win over the environment, which wins over the defaults;
docs/configuration.md's table is the object's own. Each case runs in a fresh interpreter."""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import textwrap
import uuid
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from bubblescope.collector.config import CollectorConfig
from bubblescope.collector.config_table import config_table
from bubblescope.collector.spool import Spool
from tests.support import REPO, LiveServer

GARBAGE = {
    "BUBBLESCOPE_URL": "abc",
    "BUBBLESCOPE_FULL_SPANS_EVERY": "0",
    "BUBBLESCOPE_GPU_TIMING": "abc",
    "BUBBLESCOPE_MODEL_BLOCKS": "maybe",
    "BUBBLESCOPE_STAGE_LAYERS": "sometimes",
    "BUBBLESCOPE_MEMORY": "maybe",
    "BUBBLESCOPE_TRACE_COLLECTIVES": "maybe",
    "BUBBLESCOPE_CLOCK_RESYNC_STEPS": "abc",
    "BUBBLESCOPE_CLOCK_HANDSHAKE_TIMEOUT_S": "1e400",
    "BUBBLESCOPE_FLUSH_INTERVAL_S": "-5",
    "BUBBLESCOPE_WATCHDOG_AFTER_S": "-1",
    "BUBBLESCOPE_REQUEST_TIMEOUT_S": "nan",
    "BUBBLESCOPE_SPOOL_MAX_BYTES": "1.5",
    "BUBBLESCOPE_SHUTDOWN_TIMEOUT_S": "5 s",
    "BUBBLESCOPE_DISABLED": "abc",
    "BUBBLESCOPE_PURE_PYTHON": "2",
    "BUBBLESCOPE_CLOCK_SKEW_NS": "1e400",
}
FREE_TEXT = (
    "BUBBLESCOPE_RUN",
    "BUBBLESCOPE_RUN_ID",
    "BUBBLESCOPE_TOKEN",
    "BUBBLESCOPE_SPOOL_DIR",
    "BUBBLESCOPE_HOSTNAME",
    "BUBBLESCOPE_GPU",
)

RECORDING = textwrap.dedent(
    """
    import json, logging, sys
    from dataclasses import fields
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    logging.getLogger("bubblescope.collector").addHandler(Keep())
    from bubblescope import collector
    from bubblescope.collector import native, pipelining
    at_import = list(seen)
    collector.init(**json.loads(sys.argv[1]))
    session = collector._session
    enabled = collector.is_enabled()
    for step in range(int(sys.argv[2])):
        with collector.step():
            with collector.span("forward", microbatch=0, stage=0):
                sum(range(1000))
    wrappers = "c" if native.hotpath is not None else "python"  # chosen on first use, after init
    config = {f.name: str(getattr(session.config, f.name)) for f in fields(session.config)} if session else None
    resync = session._resync_every if session else None
    collector.shutdown()
    print(json.dumps({"at_import": at_import, "enabled": enabled, "warnings": seen, "config": config,
                      "wrappers": wrappers, "resync_every": resync}))
    """
)


def clean_env(**settings: str) -> dict[str, str]:
    """This process's environment without any BUBBLESCOPE_* or torchrun variable, plus ``settings``."""
    torchrun = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUBBLESCOPE_") and k not in torchrun}
    return {**env, **settings}


def run_collector(env: dict[str, str], steps: int = 3, cwd: Path | None = None, **init: Any) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", RECORDING, json.dumps(init), str(steps)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def spooled_steps(spool: Path) -> list[int]:
    return sorted(
        step["step"]
        for _, message in Spool(spool, 1 << 40).pending()
        if message.path.endswith("/ingest")
        for step in json.loads(gzip.decompress(message.body))["steps"]
    )


def test_the_garbage_list_covers_every_variable_the_config_declares() -> None:
    declared = {item.metadata["env"] for item in fields(CollectorConfig)}
    assert set(GARBAGE) | set(FREE_TEXT) == declared


def test_every_variable_set_to_garbage_warns_once_and_the_collector_still_records(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    text = dict.fromkeys(FREE_TEXT, "abc") | {"BUBBLESCOPE_SPOOL_DIR": str(spool)}
    report = run_collector(clean_env(**GARBAGE, **text))

    assert report["at_import"] == [], "nothing may be parsed (or reported) at import"
    assert report["enabled"], report
    for name, value in GARBAGE.items():
        naming = [message for message in report["warnings"] if f"{name}={value!r}" in message]
        assert len(naming) == 1, (name, report["warnings"])
        assert "using the default" in naming[0], naming
    about_spooling = [message for message in report["warnings"] if "no service URL" in message]
    assert len(report["warnings"]) == len(GARBAGE) + len(about_spooling), report["warnings"]
    # The bad URL fell back to none: every step waits in the spool, under the run key given.
    assert spooled_steps(spool / "abc") == [0, 1, 2]
    assert report["config"] == {
        **{item.name: str(item.default) for item in fields(CollectorConfig) if item.name != "spool_dir"},
        "spool_dir": str(spool),
        "run_name": "abc",
        "run_key": "abc",
        "token": "abc",
        "hostname": "abc",
        "gpu": "abc",  # free text: a name the planner does not know declares no cluster it prices, and is no error here
    }


def test_a_skew_written_1e6_is_applied_at_init_not_at_import(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import sys
        from bubblescope import collector
        from bubblescope.collector import clock
        before = clock.to_epoch(0)
        collector.init(run="skew", spool_dir=sys.argv[1], run_key="skew-1")
        print(clock.to_epoch(0) - before)
        collector.shutdown()
        """
    )
    env = clean_env(BUBBLESCOPE_CLOCK_SKEW_NS="1e6")
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1000000"]
    assert "BUBBLESCOPE_CLOCK_SKEW_NS" not in done.stderr


def run_detail(server: LiveServer, run_key: str) -> dict[str, Any]:
    with server.client() as client:
        response = client.get(f"/api/v1/runs/{run_key}")
    assert response.status_code == 200, response.text
    return response.json()


def full_steps(detail: dict[str, Any]) -> list[int]:
    return [step["step"] for step in detail["steps"] if step["has_spans"]]


def test_the_defaults_apply_when_nothing_is_set(sqlite_server: LiveServer, tmp_path: Path) -> None:
    key = f"config-defaults-{uuid.uuid4().hex[:8]}"
    report = run_collector(clean_env(), steps=11, url=sqlite_server.url, run_key=key, spool_dir=str(tmp_path))
    assert report["warnings"] == [] and report["enabled"]
    defaults = {item.name: str(item.default) for item in fields(CollectorConfig) if item.name != "spool_dir"}
    assert report["config"] == {**defaults, "url": sqlite_server.url, "run_key": key, "spool_dir": str(tmp_path)}
    assert report["resync_every"] == 500 and report["wrappers"] in ("c", "python")
    detail = run_detail(sqlite_server, key)
    assert detail["name"] == "unnamed-run"
    assert full_steps(detail) == [0, 10]  # full spans of every 10th step
    assert [rank["host"] for rank in detail["ranks"]] == [socket.gethostname()]


ENV_SETTINGS = {
    "BUBBLESCOPE_RUN": "named-by-env",
    "BUBBLESCOPE_FULL_SPANS_EVERY": "2",
    "BUBBLESCOPE_HOSTNAME": "host-from-env",
    "BUBBLESCOPE_CLOCK_RESYNC_STEPS": "7",
    "BUBBLESCOPE_FLUSH_INTERVAL_S": "0.25",
    "BUBBLESCOPE_PURE_PYTHON": "yes",
}


def test_the_environment_overrides_the_defaults(sqlite_server: LiveServer, tmp_path: Path) -> None:
    key = f"config-env-{uuid.uuid4().hex[:8]}"
    env = clean_env(**ENV_SETTINGS, BUBBLESCOPE_URL=sqlite_server.url, BUBBLESCOPE_RUN_ID=key)
    report = run_collector(env, steps=5, spool_dir=str(tmp_path))
    assert report["warnings"] == []
    assert report["config"]["flush_interval_s"] == "0.25" and report["config"]["pure_python"] == "True"
    assert report["resync_every"] == 7 and report["wrappers"] == "python"
    detail = run_detail(sqlite_server, key)
    assert detail["name"] == "named-by-env"
    assert full_steps(detail) == [0, 2, 4]
    assert [rank["host"] for rank in detail["ranks"]] == ["host-from-env"]


def test_init_arguments_win_over_the_environment(sqlite_server: LiveServer, tmp_path: Path) -> None:
    key = f"config-init-{uuid.uuid4().hex[:8]}"
    env = clean_env(**ENV_SETTINGS, BUBBLESCOPE_URL="http://127.0.0.1:9", BUBBLESCOPE_RUN_ID="not-this-key")
    report = run_collector(
        env,
        steps=5,
        url=sqlite_server.url,
        run="named-by-init",
        run_key=key,
        full_spans_every=3,
        spool_dir=str(tmp_path),
    )
    assert report["warnings"] == []
    detail = run_detail(sqlite_server, key)
    assert detail["name"] == "named-by-init"
    assert full_steps(detail) == [0, 3]


def test_a_bad_init_argument_warns_and_the_environment_applies(sqlite_server: LiveServer, tmp_path: Path) -> None:
    key = f"config-bad-init-{uuid.uuid4().hex[:8]}"
    env = clean_env(BUBBLESCOPE_FULL_SPANS_EVERY="2")
    report = run_collector(
        env, steps=3, url=sqlite_server.url, run_key=key, full_spans_every=0, spool_dir=str(tmp_path)
    )
    assert [message for message in report["warnings"] if "init(full_spans_every=0)" in message] == report["warnings"]
    assert len(report["warnings"]) == 1 and report["config"]["full_spans_every"] == "2"


@pytest.mark.parametrize(
    "raw,value",
    [(word, True) for word in ("1", "true", "YES", " on ")] + [(word, False) for word in ("0", "False", "no", "off")],
)
def test_a_flag_takes_the_usual_spellings(raw: str, value: bool) -> None:
    assert CollectorConfig.resolve(environ={"BUBBLESCOPE_DISABLED": raw}).disabled is value


@pytest.mark.parametrize(
    "raw,value",
    [("250", 250), ("1e3", 1000), ("2000.0", 2000), (" 7 ", 7), ("", 500), ("   ", 500)],
)
def test_an_integer_may_be_written_as_an_exact_float_and_blank_is_unset(raw: str, value: int) -> None:
    assert CollectorConfig.resolve(environ={"BUBBLESCOPE_CLOCK_RESYNC_STEPS": raw}).clock_resync_steps == value


def test_the_docs_table_is_generated_from_the_object() -> None:
    generated = config_table()
    document = (REPO / "docs" / "configuration.md").read_text()
    table = "".join(line + "\n" for line in document.splitlines() if line.startswith("|"))
    assert table == generated, "regenerate with: python -m bubblescope.collector.config_table"
    for item in fields(CollectorConfig):
        assert f"`{item.metadata['env']}`" in table
    done = subprocess.run(
        [sys.executable, "-m", "bubblescope.collector.config_table"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout == generated and done.stderr == "", done.stderr


def test_upload_spool_reads_the_settings_the_job_read(sqlite_server: LiveServer, tmp_path: Path) -> None:
    key = f"config-upload-{uuid.uuid4().hex[:8]}"
    spool = {"BUBBLESCOPE_SPOOL_DIR": str(tmp_path / "spool")}
    report = run_collector(clean_env(**spool), steps=2, run_key=key, full_spans_every=1)
    assert report["enabled"] and spooled_steps(tmp_path / "spool") == [0, 1]
    command = [sys.executable, "-m", "bubblescope.cli", "upload-spool"]
    missing = subprocess.run(command, env=clean_env(**spool), capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "BUBBLESCOPE_URL" in missing.stderr, missing.stderr
    # a bad URL given on the command line is an error, never a fallback to the environment's service
    bad = subprocess.run(
        [*command, "--url", "ftp://elsewhere"],
        env=clean_env(**spool, BUBBLESCOPE_URL=sqlite_server.url),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "'ftp://elsewhere'" in bad.stderr, bad.stderr
    assert spooled_steps(tmp_path / "spool") == [0, 1]  # nothing was sent anywhere
    env = clean_env(**spool, BUBBLESCOPE_URL=sqlite_server.url)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "still spooled 0" in done.stdout, done.stdout + done.stderr
    assert [step["step"] for step in run_detail(sqlite_server, key)["steps"]] == [0, 1]
