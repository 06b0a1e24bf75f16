"""What a misbehaving service costs the training loop in wall time (the tests check behaviour only).

For each server behaviour, the hand-written loop of ``tests.collector.hand_loop`` runs in its own
process against a real misbehaving HTTP server (``tests/collector/misbehaving_server.py``) for the
whole loop: instrumented steps, and interleaved blocks of the same loop uninstrumented (the
baseline, under the same machine load). ``down`` is a port nothing listens on. Prints, per
behaviour: the median step wall ratio (instrumented / baseline), the worst step of each side less
the time it waited for a CPU (Linux schedstat), the median thread-CPU ratio, the shipper thread's
CPU share of the loop, and the shutdown time. The target: a misbehaving service costs the loop
no more than a healthy one does (compare with ``proxy``, a real service behind the same server).

    python bench/collector_faults.py [--steps 500] [--work 12000] [--modes down,error,...] [--repeats 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bubblescope.backend.db import migrate
from tests.collector.jobs import launch, read_report
from tests.collector.misbehaving_server import MisbehavingServer
from tests.support import free_port, start_server

MODES = ("proxy", "down", "error", "garbage", "wrong_json", "drop", "half", "slow")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--work", type=int, default=12000, help="sum(range(work)) in each of a step's 20 spans")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    env = {
        "BUBBLESCOPE_FLUSH_INTERVAL_S": "0.1",
        "BUBBLESCOPE_FULL_SPANS_EVERY": "1",
        "BUBBLESCOPE_REQUEST_TIMEOUT_S": "3",
        "BUBBLESCOPE_SHUTDOWN_TIMEOUT_S": "2",
    }
    loop = ["--steps", str(args.steps), "--baseline-steps", str(args.steps), "--work", str(args.work)]
    print(
        f"{'server':12s} {'wall ratio':>10s} {'worst own ms (base)':>20s} {'CPU ratio':>9s} "
        f"{'shipper CPU':>11s} {'shutdown s':>10s}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        db_url = f"sqlite:///{workdir / 'faults.db'}"
        migrate.upgrade(db_url)
        service = start_server(db_url, workdir)
        try:
            for mode in args.modes.split(","):
                for _ in range(args.repeats):
                    server = None
                    if mode == "down":
                        url = f"http://127.0.0.1:{free_port()}"
                    else:
                        server = MisbehavingServer(mode, upstream=service.url).start()
                        url = server.url
                    run_key = f"faults-{mode}-{uuid.uuid4().hex[:8]}"
                    run_dir = workdir / run_key
                    run_dir.mkdir()
                    try:
                        process, _ = launch(run_dir, url, run_key, *loop, env=env)
                        report = read_report(run_dir, run_key, process, timeout_s=600)
                    finally:
                        if server is not None:
                            server.stop()
                    median = statistics.median
                    wall = median(report.instrumented_s) / median(report.baseline_s)
                    cpu = median(report.instrumented_cpu_s) / median(report.baseline_cpu_s)
                    worst = f"{max(report.instrumented_own_s) * 1e3:.1f} ({max(report.baseline_own_s) * 1e3:.1f})"
                    shipper = (report.shipper_cpu_s or 0.0) / report.loop_s
                    print(
                        f"{mode:12s} {wall:10.3f} {worst:>20s} {cpu:9.3f} {shipper:10.1%} {report.shutdown_s:10.2f}",
                        flush=True,
                    )
        finally:
            service.stop()


if __name__ == "__main__":
    main()
