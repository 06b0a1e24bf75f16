"""Every answer of the API on stored runs, to show that a change of the code changed none of them.

Two steps, so that the same stored data is read by two versions of the service:

    python bench/api_answers.py record --db /tmp/answers.db   # the demo job, a DDP loop from the docs, the 1,024-rank run
    python bench/api_answers.py answers --db /tmp/answers.db --out before.json [--python OLD_VENV/bin/python]
    python bench/api_answers.py answers --db /tmp/answers.db --out after.json
    python bench/api_answers.py compare before.json after.json

``answers`` starts ``bubblescope serve`` on a copy of the database (with ``--python``: another checkout's
interpreter) and asks, of every run: the run list, the run, every step, the analysis (default range and a
range), the stragglers (default, compact, a range), what-if replays, the alerts, the settings, the span
kinds, the plan, and /metrics. What changes by the wall clock (``last heard``, the seconds since, the
service's own counters) is masked. ``compare`` prints each answer that differs and exits 1 if any does.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bubblescope.synthetic_run import SyntheticJob, register_job, send_job  # noqa: E402

BIG_RUN = "big-1024"
BIG_JOB = SyntheticJob(stages=8, replicas=128, steps=16, full_every=5, slow=((341, 1.3),))
DEMO_RUN = "demo-answers"
DDP_RUN = "ddp-from-docs"  # bench/ddp_from_docs.py: a plain DDP loop instrumented as docs/collector.md shows
WHATIFS: list[dict[str, Any]] = [
    {},
    {"microbatches": 16},
    {"schedule": "gpipe"},
    {"schedule": "interleaved1f1b", "stages_per_rank": 2},
    {"slowest_rank_to_median": True},
    {"overlap_communication": True},
    {"microbatches": 4, "microbatch_scale": 2.0},
    {"schedule": "nonsense"},
]
PLANS: list[dict[str, Any]] = [
    {"model": "llama-2-7b", "cluster": {"gpu": "A100-80GB", "gpus": 64}, "global_batch": 512},
    {
        "model": "llama-2-7b",
        "cluster": {"gpu": "A100-80GB", "gpus": 64},
        "global_batch": 512,
        "config": {"tp": 2, "pp": 4},
    },
    {
        "model": "gpt-175b",
        "cluster": {"gpu": "A100-80GB", "gpus": 1024},
        "global_batch": 1536,
        "config": {"tp": 8, "pp": 8},
    },
]
ALERTS_SETTLE_S = 15.0  # past the alert rules' interval (10 s)
CLOCK_KEYS = ("last_heard_at", "updated_at", "ended_at", "startsAt", "endsAt", "external_url", "generatorURL")
CLOCK_WORDS = re.compile(r"(last heard|nothing heard for) [0-9][^,;)\"]*")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Service:
    """``bubblescope serve`` on a SQLite file, in a child process of ``python``."""

    def __init__(self, python: str, db: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        code = "from bubblescope.cli import main; main()"
        self.process = subprocess.Popen(
            [python, "-c", code, "serve", "--db", str(db), "--port", str(self.port), "--silent-after", "86400"],
            cwd=tempfile.gettempdir(),  # the interpreter's own checkout, not this one's, is imported
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/api/v1/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError("the service did not start")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(20)


def record(db: Path) -> None:
    db.unlink(missing_ok=True)
    service = Service(sys.executable, db)
    try:
        demo = [sys.executable, "-m", "bubblescope.cli", "demo", "--url", service.url, "--no-serve"]
        subprocess.run([*demo, "--run", DEMO_RUN] if _demo_takes_run() else demo, check=True, cwd=REPO)
        ddp = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        env = {**os.environ, "BUBBLESCOPE_URL": service.url, "OMP_NUM_THREADS": "1"}
        subprocess.run([*ddp, str(REPO / "bench" / "ddp_from_docs.py"), "--run-name", DDP_RUN], check=True, env=env)
        with httpx.Client(base_url=service.url, timeout=120) as client:
            register_job(client, BIG_JOB, BIG_RUN, senders=4)
            send_job(client, BIG_JOB, BIG_RUN, steps_per_batch=BIG_JOB.steps, senders=4)
            for rank in range(BIG_JOB.world_size):  # ended, so its state does not move with the clock
                end = {"outcome": "finished"}
                client.put(f"/api/v1/runs/{BIG_RUN}/ranks/{rank}/end", json=end).raise_for_status()
        time.sleep(ALERTS_SETTLE_S)  # the alert rules see the ended run
    finally:
        service.stop()


def _demo_takes_run() -> bool:
    helped = subprocess.run([sys.executable, "-m", "bubblescope.cli", "demo", "--help"], capture_output=True, text=True)
    return "--run" in helped.stdout


def _masked(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: ("<clock>" if k in CLOCK_KEYS else _masked(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v) for v in value]
    if isinstance(value, str):
        return CLOCK_WORDS.sub(r"\1 <clock>", value)
    return value


def _metrics(text: str) -> list[str]:
    """The per-run series, without the seconds since each run was heard from."""
    return sorted(
        line for line in text.splitlines() if line.startswith("bubblescope_run_") and "last_heard_seconds" not in line
    )


def answers(db: Path, python: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        copy = Path(folder) / "answers.db"
        with sqlite3.connect(db) as source, sqlite3.connect(copy) as target:
            source.backup(target)  # the write-ahead log's pages too, which a file copy would miss
        service = Service(python, copy)
        try:
            with httpx.Client(base_url=service.url, timeout=300) as client:
                return _ask(client)
        finally:
            service.stop()


def _ask(client: httpx.Client) -> dict[str, Any]:
    got: dict[str, Any] = {}

    def get(path: str, **params: Any) -> Any:
        response = client.get(path, params=params)
        answer = response.json() if response.headers.get("content-type", "").startswith("application/json") else None
        got[f"GET {path} {json.dumps(params, sort_keys=True)}"] = [response.status_code, _masked(answer)]
        return answer

    def post(path: str, body: dict[str, Any]) -> None:
        response = client.post(path, json=body)
        got[f"POST {path} {json.dumps(body, sort_keys=True)}"] = [response.status_code, _masked(response.json())]

    runs = get("/api/v1/runs", limit=50)
    for state in ("running", "finished", "failed", "silent"):
        get("/api/v1/runs", state=state)
    for run in runs:
        key = run["key"]
        detail = get(f"/api/v1/runs/{key}")
        get(f"/api/v1/runs/{key}", ranks_limit=8)
        steps = [s["step"] for s in detail["steps"]]
        for step in steps:
            get(f"/api/v1/runs/{key}/steps/{step}")
        get(f"/api/v1/runs/{key}/steps/{detail['default_step']}", ranks="0-3,9", breakdown_limit=5)
        get(f"/api/v1/runs/{key}/steps/{max(steps) + 1}")
        get(f"/api/v1/runs/{key}/analysis")
        get(f"/api/v1/runs/{key}/analysis", from_step=min(steps), to_step=max(steps))
        get(f"/api/v1/runs/{key}/analysis", from_step=max(steps) - 3)
        get(f"/api/v1/runs/{key}/stragglers")
        get(f"/api/v1/runs/{key}/stragglers", compact="true")
        get(f"/api/v1/runs/{key}/stragglers", from_step=min(steps), to_step=max(steps), phases="compute")
        for change in WHATIFS:
            post(f"/api/v1/runs/{key}/whatif", change)
    get("/api/v1/runs/no-such-run")
    time.sleep(ALERTS_SETTLE_S)  # the alert rules' rounds after the start have run
    for run in runs:
        get("/api/v1/alerts", run=run["key"])
    get("/api/v1/alerts")
    get("/api/v1/span-kinds")
    get("/api/v1/settings")
    for plan in PLANS:
        post("/api/v1/plan", plan)
    got["GET /metrics (per-run series)"] = _metrics(client.get("/metrics").text)
    return got


def compare(before: dict[str, Any], after: dict[str, Any]) -> int:
    differing = 0
    for key in sorted(set(before) | set(after)):
        if before.get(key) != after.get(key):
            differing += 1
            print(f"differs: {key}")
            print(f"  before: {json.dumps(before.get(key))[:400]}")
            print(f"  after:  {json.dumps(after.get(key))[:400]}")
    same = len(set(before) & set(after)) - sum(1 for k in set(before) & set(after) if before[k] != after[k])
    print(f"{len(before)} answers before, {len(after)} after: {same} the same, {differing} differ")
    return 1 if differing else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("--db", type=Path, required=True)
    ask = sub.add_parser("answers")
    ask.add_argument("--db", type=Path, required=True)
    ask.add_argument("--out", type=Path, required=True)
    ask.add_argument("--python", default=sys.executable, help="the interpreter whose bubblescope serves")
    cmp = sub.add_parser("compare")
    cmp.add_argument("before", type=Path)
    cmp.add_argument("after", type=Path)
    args = parser.parse_args()
    os.environ.setdefault("PYTHONHASHSEED", "0")
    if args.command == "record":
        record(args.db)
    elif args.command == "answers":
        args.out.write_text(json.dumps(answers(args.db, args.python), indent=1, sort_keys=True))
        print(f"wrote {args.out}")
    else:
        sys.exit(compare(json.loads(args.before.read_text()), json.loads(args.after.read_text())))


if __name__ == "__main__":
    main()
