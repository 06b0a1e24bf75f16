"""The simulated floor of identical jobs, side by side: the demo pipeline (2 stages, 1F1B, 4 micro-batches)
computing on this CPU, and the same pipeline whose layers' work is steady device time (``--device-ms``, as on a
GPU). Each job is run ``--repeats`` times, alternately, into one service; for each the floor, the measured
stage-cost ratio (last / first) and the first thing the page says to do are printed, then each shape's spread.

    python bench/floor_spread.py [--repeats 6] [--db sqlite|postgres]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.scale import service
from tests.analysis.replay_support import JobShape, run_and_analyse

SHAPES = {
    "CPU compute": JobShape("1f1b", 4, (2, 2), steps=16),
    "steady device time": JobShape("1f1b", 4, (2, 2), hidden=256, steps=16, device_ms=3.0),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    args = parser.parse_args()
    floors: dict[str, list[float]] = {label: [] for label in SHAPES}
    print(f"{'job':<20} {'floor':>7} {'cost ratio':>11}  first suggestion")
    with service(args.db) as live, httpx.Client(base_url=live.url, timeout=120) as client:
        for _ in range(args.repeats):
            for label, shape in SHAPES.items():
                analysis = run_and_analyse(live.url, client, shape)[1]
                floor = analysis["attribution"]["simulated_floor_fraction"]
                costs = analysis["imbalance"]["stage_cost_ns"]
                first = analysis["suggestions"][0] if analysis["suggestions"] else None
                said = "none" if first is None else first["kind"] + (" (within noise)" if first["within_noise"] else "")
                floors[label].append(floor)
                print(f"{label:<20} {floor:7.1%} {costs[-1] / costs[0]:11.3f}  {said}", flush=True)
    print("closed form: 20.0%")
    for label, values in floors.items():
        spread = (max(values) - min(values)) * 100
        print(
            f"{label:<20} floors {min(values):.1%}-{max(values):.1%}: spread {spread:.1f} points over {len(values)} runs"
        )


if __name__ == "__main__":
    main()
