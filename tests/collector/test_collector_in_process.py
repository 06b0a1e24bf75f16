"""The collector API inside one process, against a real server and against none."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.support import LiveServer, free_port

SCRIPT = textwrap.dedent(
    """
    import sys, time
    from bubblescope import collector
    collector.init(run="hand written", url=sys.argv[1], spool_dir=sys.argv[2], run_key=sys.argv[3])
    worst = 0.0
    for step in range(20):
        began = time.perf_counter()
        with collector.step():
            for mb in range(4):
                with collector.span("forward", microbatch=mb, stage=0):
                    sum(range(2000))
                with collector.span("backward", microbatch=mb, stage=0):
                    sum(range(4000))
            with collector.span("not-a-kind"):
                pass
        worst = max(worst, time.perf_counter() - began)
    collector.shutdown()
    print(f"worst-step-s {worst:.6f}")
    """
)


def run_script(url: str, spool: Path, run_key: str) -> tuple[int, str, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", SCRIPT, url, str(spool), run_key],
                          capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout + done.stderr, time.monotonic() - started


def test_hand_written_spans_arrive_with_names_and_unknown_kinds_are_dropped(
    sqlite_server: LiveServer, tmp_path: Path
) -> None:
    code, output, _ = run_script(sqlite_server.url, tmp_path / "spool", "hand-written-1")
    assert code == 0, output
    assert "unknown span kind 'not-a-kind'" in output
    with sqlite_server.client() as client:
        detail = client.get("/api/v1/runs/hand-written-1").json()
        assert detail["name"] == "hand written" and len(detail["steps"]) == 20
        step = client.get("/api/v1/runs/hand-written-1/steps/7").json()
    kinds = sorted(s["kind"] for s in step["spans"])
    assert kinds == ["backward"] * 4 + ["forward"] * 4
    assert sorted(s["microbatch"] for s in step["spans"] if s["kind"] == "forward") == [0, 1, 2, 3]


def test_unreachable_server_neither_raises_nor_stalls(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    code, output, wall = run_script(dead, tmp_path / "spool", "offline-1")
    assert code == 0, output
    worst = float(output.split("worst-step-s")[1].split()[0])
    assert worst < 0.02, output  # a step is ~0.5 ms of work; no network wait or retry leaks in
    assert wall < 30
    assert list((tmp_path / "spool").rglob("*.msg"))
