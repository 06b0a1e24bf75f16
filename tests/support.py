"""Test helpers: databases built by the migrations, a real uvicorn server, real torchrun jobs."""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
PG_ADMIN_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=test connect_timeout=3"
PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/{database}"


def postgres_unreachable_reason() -> str | None:
    """Why PostgreSQL tests must skip, or None. With BUBBLESCOPE_REQUIRE_POSTGRES=1 (CI) it raises."""
    try:
        import psycopg

        with psycopg.connect(PG_ADMIN_DSN):
            return None
    except Exception as error:
        if os.environ.get("BUBBLESCOPE_REQUIRE_POSTGRES") == "1":
            raise RuntimeError(
                f"PostgreSQL required (BUBBLESCOPE_REQUIRE_POSTGRES=1) but unreachable: {error}"
            ) from error
        return f"PostgreSQL at 127.0.0.1:5432 unreachable: {error}"


def create_postgres_database() -> tuple[str, str]:
    """A fresh empty database; returns (url, name)."""
    import psycopg

    name = f"bubblescope_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    return PG_URL.format(database=name), name


def drop_postgres_database(name: str) -> None:
    import psycopg

    with psycopg.connect(PG_ADMIN_DSN, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


REQUIRE_COMPONENTS_ENV = "BUBBLESCOPE_REQUIRE_COMPONENTS"


def require_program(path: str, package: str) -> None:
    """Skip the test when the real component ``path`` is not installed, with the apt-get that installs it;
    where ``BUBBLESCOPE_REQUIRE_COMPONENTS=1`` (CI), fail instead: a machine without it must not pass."""
    import shutil

    import pytest

    if shutil.which(path):
        return
    message = f"{path} is not installed (apt-get install -y {package})"
    if os.environ.get(REQUIRE_COMPONENTS_ENV) == "1":
        pytest.fail(f"{message}; {REQUIRE_COMPONENTS_ENV}=1 says every component must be here")
    pytest.skip(message)


@contextmanager
def migrated_database(backend: str, folder: Path) -> Iterator[str]:
    """A database of its own built by the migrations: an SQLite file in ``folder``, or a fresh
    PostgreSQL database (dropped afterwards; the test skips when PostgreSQL is unreachable)."""
    from bubblescope.backend.db import migrate

    if backend == "sqlite":
        url = f"sqlite:///{folder / 'bubblescope.db'}"
        migrate.upgrade(url)
        yield url
        return
    reason = postgres_unreachable_reason()
    if reason:
        import pytest

        pytest.skip(reason)
    url, name = create_postgres_database()
    try:
        migrate.upgrade(url)
        yield url
    finally:
        drop_postgres_database(name)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class LiveServer:
    url: str
    db_url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()


def start_server(db_url: str, log_dir: Path, port: int | None = None, extra_args: Sequence[str] = ()) -> LiveServer:
    port = port or free_port()
    log_path = log_dir / f"server-{port}.log"
    handle = open(log_path, "wb")  # noqa: SIM115 (the server writes it until it stops)
    process = subprocess.Popen(
        [sys.executable, "-m", "bubblescope.cli", "serve", "--db", db_url, "--port", str(port), *extra_args],
        stdout=handle,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited early: {log_path.read_text()}")
        try:
            if httpx.get(f"{url}/api/v1/health", timeout=1).status_code == 200:
                return LiveServer(url, db_url, process, log_path)
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"server did not start: {log_path.read_text()}")


def gzip_json(document: Any) -> bytes:
    return gzip.compress(json.dumps(document).encode())


@dataclass(frozen=True)
class JobResult:
    run_key: str
    returncode: int
    output: str
    wall_s: float


def run_pipeline_job(
    url: str,
    *,
    stages: int,
    schedule: str,
    microbatches: int,
    steps: int = 4,
    hidden: int = 512,
    microbatch_size: int = 32,
    spool_dir: Path | None = None,
    extra_env: dict[str, str] | None = None,
    extra_args: Sequence[str] = (),
    timeout_s: float = 300,
) -> JobResult:
    """A real torchrun job (gloo, CPU) of the demo pipeline, instrumented by the collector."""
    run_key = f"test-{schedule}-p{stages}m{microbatches}-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "BUBBLESCOPE_URL": url,
        "BUBBLESCOPE_RUN_ID": run_key,
        "BUBBLESCOPE_FLUSH_INTERVAL_S": "0.2",
        "OMP_NUM_THREADS": "1",
        **(extra_env or {}),
    }
    if spool_dir is not None:
        env["BUBBLESCOPE_SPOOL_DIR"] = str(spool_dir)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={stages}",
        "-m",
        "bubblescope.demo_job",
        f"--schedule={schedule}",
        f"--microbatches={microbatches}",
        f"--steps={steps}",
        f"--hidden={hidden}",
        f"--microbatch-size={microbatch_size}",
        "--full-spans-every=1",  # these tests read every step's spans
        *extra_args,
    ]
    started = time.monotonic()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s)
    return JobResult(run_key, done.returncode, done.stdout + done.stderr, time.monotonic() - started)


def wait_for_steps(client: httpx.Client, run_key: str, ranks: int, steps: int, timeout_s: float = 30) -> dict[str, Any]:
    """Run detail once every rank reported every step (the collector ships asynchronously)."""
    deadline = time.monotonic() + timeout_s
    detail: dict[str, Any] = {}
    while time.monotonic() < deadline:
        response = client.get(f"/api/v1/runs/{run_key}")
        if response.status_code == 200:
            detail = response.json()
            complete = [s for s in detail["steps"] if s["ranks_reported"] == ranks and s["has_spans"]]
            if len(complete) >= steps:
                return detail
        time.sleep(0.2)
    raise AssertionError(f"run {run_key} incomplete after {timeout_s}s: {detail}")


def run_rows(db_url: str, run_key: str, query: str) -> list[Any]:
    """Rows of ``query`` read straight from the DB; ``{run}`` in it stands for the run's id."""
    from sqlalchemy import create_engine, text

    engine = create_engine(db_url)
    try:
        with engine.connect() as connection:
            sql = text(query.replace("{run}", "(SELECT id FROM runs WHERE key = :key)"))
            return list(connection.execute(sql, {"key": run_key}).all())
    finally:
        engine.dispose()


def count_rows(db_url: str, table: str, run_key: str) -> int:
    """Rows of ``table`` (spans, steps, ingested_batches, ...) stored for one run, read from the DB."""
    return int(run_rows(db_url, run_key, f"SELECT count(*) FROM {table} WHERE run_id = {{run}}")[0][0])


def wait_until(condition: Any, timeout_s: float, what: str, interval_s: float = 0.02) -> None:
    """Poll ``condition()`` until it is true; AssertionError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


def scrape_until(client: httpx.Client, holds: Any, timeout_s: float = 30, headers: Any = None) -> str:
    """/metrics once ``holds(text)`` is true of it: the per-run series are refreshed in the background (after
    news, at least a second apart), so a scrape right after an event may not show it yet."""
    scraped = ""

    def fresh() -> bool:
        nonlocal scraped
        scraped = client.get("/metrics", headers=headers).text
        return bool(holds(scraped))

    wait_until(fresh, timeout_s, "/metrics to show it", interval_s=0.2)
    return scraped


def run_torchrun(
    url: str,
    script: str,
    nproc: int,
    *args: str,
    run_key: str,
    timeout_s: float = 300,
    extra_env: dict[str, str] | None = None,
) -> JobResult:
    """A real ``torchrun --standalone`` job of the test script ``script`` (a path under the repository),
    streaming into ``url`` under ``run_key`` with a short flush interval."""
    env = {
        **os.environ,
        "BUBBLESCOPE_URL": url,
        "BUBBLESCOPE_RUN_ID": run_key,
        "BUBBLESCOPE_FLUSH_INTERVAL_S": "0.2",
        "OMP_NUM_THREADS": "1",
        **(extra_env or {}),
    }
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        str(REPO / script),
        *args,
    ]
    started = time.monotonic()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout_s, cwd=REPO)
    return JobResult(run_key, done.returncode, done.stdout + done.stderr, time.monotonic() - started)


def run_parallel_job(
    url: str, mode: str, nproc: int, *args: str, timeout_s: float = 300, extra_env: dict[str, str] | None = None
) -> JobResult:
    """A real torchrun job of ``tests/collector/parallel_job.py`` in ``mode`` (naive, ddp, fsdp, tp, ...)."""
    run_key = f"test-{mode}-{uuid.uuid4().hex[:8]}"
    return run_torchrun(
        url,
        "tests/collector/parallel_job.py",
        nproc,
        f"--mode={mode}",
        *args,
        run_key=run_key,
        timeout_s=timeout_s,
        extra_env=extra_env,
    )


# API helpers shared by the feature tests
FILE_BODY = {"Content-Type": "application/octet-stream"}  # how a file upload (trace, dump) is sent


def register(client: httpx.Client, world_size: int = 2) -> str:
    key = f"ingest-{uuid.uuid4().hex[:10]}"
    response = client.put(
        f"/api/v1/runs/{key}",
        json={"name": "ingest-test", "world_size": world_size, "config": {"schedule": "ScheduleGPipe"}},
    )
    assert response.status_code == 200, response.text
    return key


def ingest_batch(
    key: str, seq: int = 0, spans: int = 5, rank: int = 0, step: int = 0, named: bool = False
) -> dict[str, Any]:
    """A valid ingest batch: one step of ``spans`` forward spans (``named``: each with a name)."""
    start = 1_700_000_000_000_000_000 + step * 1_000_000_000
    columns: dict[str, list[Any]] = {
        "step": [step] * spans,
        "kind": ["forward"] * spans,
        "start_ns": [start + 10_000 * i for i in range(spans)],
        "end_ns": [start + 10_000 * i + 5_000 for i in range(spans)],
        "stage": [0] * spans,
        "microbatch": list(range(spans)),
    }
    if named:
        columns["name"] = [f"layer.{i}" for i in range(spans)]
    aggregate = {"step": step, "start_ns": start, "end_ns": start + 10_000 * spans, "compute_ns": 1000}
    aggregate |= {"comm_ns": 0, "exposed_comm_ns": 0, "idle_ns": 0, "span_count": spans}
    return {"run_key": key, "rank": rank, "seq": seq, "steps": [aggregate], "spans": columns}


def post_gzip(client: httpx.Client, document: Any) -> httpx.Response:
    return client.post(
        "/api/v1/ingest",
        content=gzip_json(document),
        headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
    )


def assert_names(response: httpx.Response, status: int, loc: list[Any], words: str) -> None:
    assert response.status_code == status, response.text
    detail = response.json()["detail"]
    assert any(item["loc"][: len(loc)] == loc and words in item["msg"] for item in detail), detail


def newest_step_of_every_rank(server: LiveServer, run_key: str) -> int:
    """The newest step every rank of a 2-rank run reported; -1 before the run is known."""
    with server.client() as client:
        response = client.get(f"/api/v1/runs/{run_key}")
    if response.status_code != 200:
        return -1
    full = [s["step"] for s in response.json()["steps"] if s["ranks_reported"] == 2]
    return max(full, default=-1)


def profiled_trace(folder: Path, rank: int, first: int, steps: int) -> Path:
    """A real torch.profiler trace of steps [first, first + steps) of a small CPU model, made by the collector's
    profiler as a job's rank makes it (no distributedInfo outside a job: the file's name gives the rank)."""
    import torch

    from bubblescope.collector.capture import CaptureWindows
    from bubblescope.collector.profiling import OnDemandProfiler

    windows = CaptureWindows()
    windows.learn({"captures": [{"id": 1, "from_step": first, "steps": steps, "kind": "profile"}]})
    profiler = OnDemandProfiler(windows, folder, rank)
    model = torch.nn.Linear(64, 64)
    for step in range(first, first + steps):
        profiler.between_steps(step)
        model(torch.randn(8, 64)).sum().backward()
    profiler.between_steps(first + steps)
    profiler.join(60)
    return folder / f"rank{rank}-steps{first}-{first + steps - 1}.json.gz"


def upload_profile_trace(client: httpx.Client, key: str, profile_id: int, rank: int, trace: Path) -> httpx.Response:
    """``trace`` sent as rank ``rank``'s of profile ``profile_id``, as the collector sends it."""
    return client.post(
        f"/api/v1/runs/{key}/profiles/{profile_id}",
        params={"rank": rank, "file": trace.name},
        headers={"Content-Type": "application/json"},
        content=trace.read_bytes(),
    )
