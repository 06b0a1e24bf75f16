"""How long straggler scoring takes for a large job: ``find_stragglers`` on a synthetic
rank × step matrix (what ``GET /runs/{key}/stragglers`` scores after reading the aggregates).

Every rank computes 10 ms a step (±2% uniform noise) in a 15 ms window; one rank is 1.3× slow
on every step. Without placements all ranks are one comparable group, so past 32 ranks each
step's MAD is shared by the group (the scale path). Prints the median and the worst of
``--repeats`` timings (wall and the thread's CPU time) and checks that the one slow rank is the
one finding.

    python bench/stragglers_scale.py [--ranks 1024] [--steps 100] [--repeats 5]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bubblescope.analysis.stragglers import RankStepTimes, find_stragglers

WINDOW_NS = 15_000_000


def rows(ranks: int, steps: int, slow_rank: int) -> list[RankStepTimes]:
    noise = random.Random(0)
    out = []
    for rank in range(ranks):
        for step in range(steps):
            compute = int(10_000_000 * (1.3 if rank == slow_rank else 1.0) * noise.uniform(0.98, 1.02))
            wait = WINDOW_NS - compute
            out.append(RankStepTimes(rank, step, WINDOW_NS, compute, wait, wait // 2, wait // 2))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    slow_rank = args.ranks // 3
    data = rows(args.ranks, args.steps, slow_rank)
    walls, cpus = [], []
    for _ in range(args.repeats):
        began, began_cpu = time.perf_counter(), time.thread_time()
        report = find_stragglers(data)
        walls.append(time.perf_counter() - began)
        cpus.append(time.thread_time() - began_cpu)
        found = [(f.kind, f.ranks, f.verdict) for f in report.findings]
        if found != [("slow rank", [slow_rank], "persistent")]:
            raise SystemExit(f"wrong findings: {found}")
    print(f"find_stragglers, {args.ranks} ranks × {args.steps} steps ({len(data)} cells), {args.repeats} repeats:")
    print(f"  wall: median {statistics.median(walls):.3f} s, worst {max(walls):.3f} s")
    print(f"  thread CPU: median {statistics.median(cpus):.3f} s, worst {max(cpus):.3f} s")
    print(f"  findings: rank {slow_rank} persistent, as injected")


if __name__ == "__main__":
    main()
