"""How well the replay predicts real CPU pipeline runs it was not given.

Each round measures the base configuration (1F1B, m=4, an imbalanced 3,1 layer split on 2 gloo
ranks), asks the service's what-if replay for the targets, then runs the targets and measures
them. A figure is the median step time over a run's steps (step 0 left out); errors are
(predicted - measured) / measured. Prints every round's table; then per target the median error
over rounds (a 2-core machine running two ranks, their gloo threads and the service drifts by
~10% from run to run, so one round's error is mostly that drift) with the median and max |error|
of those; and the same over every single prediction.

    python bench/simulator_validation.py [--rounds 5] [--steps 16] [--hidden 768] [--microbatch-size 64]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bubblescope.backend.db import migrate
from tests.analysis.replay_support import JobShape, run_and_analyse, what_if
from tests.support import start_server


def targets(base: JobShape) -> list[JobShape]:
    return [
        replace(base, microbatches=8),
        replace(base, schedule="gpipe"),
        replace(base, schedule="gpipe", microbatches=8),
        replace(base, layers=(2, 2)),
        replace(base, microbatches=8, layers=(2, 2)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--microbatch-size", type=int, default=64)
    args = parser.parse_args()
    base = JobShape("1f1b", 4, (3, 1), args.microbatch_size, args.hidden, args.steps)
    errors: dict[str, list[float]] = {t.label: [] for t in targets(base)}
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/bench.db"
        migrate.upgrade(url)
        server = start_server(url, Path(tmp))
        try:
            client = server.client()
            for round_index in range(args.rounds):
                key, measured = run_and_analyse(server.url, client, base)
                print(f"\nround {round_index + 1}: base {base.label}: {measured['step_ns'] / 1e6:.1f} ms")
                print(f"{'target':40s} {'predicted ms':>13s} {'measured ms':>12s} {'error':>8s}")
                for target in targets(base):
                    predicted = what_if(client, key, base, target)["step_ns"]
                    _, real = run_and_analyse(server.url, client, target)
                    error = (predicted - real["step_ns"]) / real["step_ns"]
                    errors[target.label].append(error)
                    print(
                        f"{target.label:40s} {predicted / 1e6:13.1f} {real['step_ns'] / 1e6:12.1f} {100 * error:+7.1f}%"
                    )
        finally:
            server.stop()
    print(f"\n{'target':40s} {'median error over rounds':>25s}")
    per_target = []
    for label, values in errors.items():
        per_target.append(abs(statistics.median(values)))
        print(f"{label:40s} {100 * statistics.median(values):+24.1f}%")
    print(
        f"per target (median over {args.rounds} rounds): median |error| {100 * statistics.median(per_target):.1f}%, "
        f"max {100 * max(per_target):.1f}%"
    )
    flat = [abs(e) for values in errors.values() for e in values]
    print(
        f"every single prediction ({len(flat)}): median |error| {100 * statistics.median(flat):.1f}%, "
        f"max {100 * max(flat):.1f}%"
    )


if __name__ == "__main__":
    main()
