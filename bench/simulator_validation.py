"""How well the replay predicts real CPU pipeline runs it was not given.

Each round measures the base configuration (1F1B, m=4, an imbalanced 3,1 layer split on 2 gloo
ranks), asks the service's what-if replay for the targets, then runs the targets and measures
them. A figure is the median step time over a run's steps (step 0 left out); errors are
(predicted - measured) / measured. Prints every round's table; then per target the median error
over rounds (a 2-core machine running two ranks, their gloo threads and the service drifts by
~10% from run to run, so one round's error is mostly that drift) with the median and max |error|
of those; and the same over every single prediction.

``--suggestions`` measures instead what the analysis's own suggestions are worth (what
``tests/analysis/test_suggestions_rerun.py`` checks by behaviour only): for layer-wise model
parallelism (2 ranks, layers 2,2, micro-batch 512, hidden 1024) and an imbalanced 1F1B (layers
5,1, hidden 1280), it runs the base, takes its top suggestion, applies it as written, then runs
changed and base ``--pairs`` times each, alternating (the machine drifts by ~10% from run to run;
alternating keeps the drift off the comparison, and the median keeps up to two slow runs a side
out of it). Prints per case the median step before and after, the median prediction of the base
runs' analyses, whether the change made the step faster and the prediction's error.

    python bench/simulator_validation.py [--rounds 5] [--steps 16] [--hidden 768] [--microbatch-size 64]
    python bench/simulator_validation.py --suggestions [--pairs 5] [--steps 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

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


def suggestions(client: httpx.Client, url: str, pairs: int, steps: int) -> None:
    """The top suggestion of each base applied and re-run against its base, alternating."""
    bases = [
        JobShape("naive", 1, (2, 2), microbatch_size=512, hidden=1024, steps=steps),
        JobShape("1f1b", 4, (5, 1), microbatch_size=64, hidden=1280, steps=steps),
    ]
    for base in bases:
        _, first = run_and_analyse(url, client, base)
        if not first["suggestions"]:
            print(f"\n{base.label}: no suggestion")
            continue
        top = first["suggestions"][0]
        target = base.applied(top["apply"])
        befores, afters = [first], []
        for index in range(pairs):
            afters.append(run_and_analyse(url, client, target)[1]["step_ns"])
            if index + 1 < pairs:
                befores.append(run_and_analyse(url, client, base)[1])
        predicted = statistics.median(
            s["predicted_step_ns"]
            for analysis in befores
            for s in analysis["suggestions"]
            if s["apply"] == top["apply"]
        )
        before = statistics.median(b["step_ns"] for b in befores)
        after = statistics.median(afters)
        runs = ", ".join(f"{b['step_ns'] / 1e6:.0f}/{a / 1e6:.0f}" for b, a in zip(befores, afters))
        print(f"\n{base.label}: {top['title']} -> {target.label}")
        print(f"  runs before/after (ms): {runs}")
        print(
            f"  median before {before / 1e6:.1f} ms, after {after / 1e6:.1f} ms ({'faster' if after < before else 'NOT faster'},"
            f" {100 * (after / before - 1):+.1f}%), predicted {predicted / 1e6:.1f} ms"
            f" (error {100 * (predicted - after) / after:+.1f}%)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--microbatch-size", type=int, default=64)
    parser.add_argument("--suggestions", action="store_true", help="measure the suggestions applied instead")
    parser.add_argument("--pairs", type=int, default=5, help="--suggestions: changed and base runs each")
    args = parser.parse_args()
    if args.suggestions:
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite:///{tmp}/bench.db"
            migrate.upgrade(url)
            server = start_server(url, Path(tmp))
            try:
                suggestions(server.client(), server.url, args.pairs, args.steps)
            finally:
                server.stop()
        return
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
