"""How well the replay predicts real CPU pipeline runs it was not given.

Default (interleaved): one job (``bench/whatif_job.py``) runs the base configuration (1F1B, m=4, an
imbalanced 3,1 layer split on 2 gloo ranks) and every target, one step each in turn, ``--rounds``
times; only the base's steps are recorded. The service's analysis of the base and its what-if replay
give each target's predicted step; the job's own timing of every step gives each target's measured
step. A figure is the median over rounds (the first ``--warmup`` left out). As the machine's speed
changes, every configuration's steps change together, so the comparison is made as ratios to the
base measured in the same job: error = (predicted target / the service's base step) / (measured
target / measured base) - 1. Prints per target predicted and measured (ms, and ratio to base) and the
error; then over ``--jobs`` jobs per target the median error, the median and the max of those.

``--separate-runs``: the old way, base and each target as separate jobs one after another (then the
machine's drift between runs, ~10% on this 2-core machine, is in every error).

``--suggestions`` measures instead what the analysis's own suggestions are worth (what
``tests/analysis/test_suggestions_rerun.py`` checks by behaviour only): for layer-wise model
parallelism (2 ranks, layers 2,2, the demo job's default sizes: one micro-batch of 256, hidden 512) and an imbalanced 1F1B (layers
5,1, hidden 1280), it runs the base, takes its top suggestion, applies it as written, then runs
changed and base ``--pairs`` times each, alternating (the machine drifts by ~10% from run to run;
alternating keeps the drift off the comparison, and the median keeps up to two slow runs a side
out of it). Prints per case the median step before and after, the median prediction of the base
runs' analyses, whether the change made the step faster and the prediction's error.

    python bench/simulator_validation.py [--jobs 3] [--rounds 40] [--warmup 8] [--hidden 768] [--microbatch-size 64]
    python bench/simulator_validation.py --separate-runs [--jobs 3] [--steps 16]
    python bench/simulator_validation.py --suggestions [--pairs 5] [--steps 10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import uuid
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx

from bubblescope.backend.db import migrate
from bubblescope.demo_job import DEFAULT_BATCH_SIZE, DEFAULT_HIDDEN
from tests.analysis.replay_support import JobShape, run_and_analyse, what_if
from tests.support import run_torchrun, start_server, wait_for_steps


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
        # the README's naive command: the demo job's default sizes
        JobShape("naive", 1, (2, 2), microbatch_size=DEFAULT_BATCH_SIZE, hidden=DEFAULT_HIDDEN, steps=steps),
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


def interleaved(client: httpx.Client, url: str, base: JobShape, jobs: int, rounds: int, warmup: int) -> None:
    """Base and targets in one job, step by step (``bench/whatif_job.py``), ``jobs`` times."""
    errors: dict[str, list[float]] = {t.label: [] for t in targets(base)}
    for job_index in range(jobs):
        with tempfile.TemporaryDirectory() as tmp:
            times_file = Path(tmp) / "times.json"
            run_key = f"whatif-{uuid.uuid4().hex[:8]}"
            spec = [
                {
                    "label": t.label,
                    "schedule": t.schedule,
                    "microbatches": t.microbatches,
                    "layers": list(t.layers),
                    "microbatch_size": t.microbatch_size,
                }
                for t in targets(base)
            ]
            done = run_torchrun(
                url,
                "bench/whatif_job.py",
                base.ranks,
                f"--schedule={base.schedule}",
                f"--microbatches={base.microbatches}",
                f"--layers={','.join(map(str, base.layers))}",
                f"--microbatch-size={base.microbatch_size}",
                f"--hidden={base.hidden}",
                f"--rounds={rounds}",
                f"--times-file={times_file}",
                f"--targets={json.dumps(spec)}",
                run_key=run_key,
                timeout_s=1200,
                # every base step in full: the replay reads spans
                extra_env={"BUBBLESCOPE_FLUSH_INTERVAL_S": "1.0", "BUBBLESCOPE_FULL_SPANS_EVERY": "1"},
            )
            assert done.returncode == 0, done.output[-3000:]
            times = json.loads(times_file.read_text())["times"]
        wait_for_steps(client, run_key, base.ranks, rounds)
        analysis = client.get(f"/api/v1/runs/{run_key}/analysis").json()
        service_base = analysis["step_ns"]
        job_base = statistics.median(times["base"][warmup:]) * 1e9
        print(
            f"\njob {job_index + 1}: base {base.label}: service {service_base / 1e6:.1f} ms, job {job_base / 1e6:.1f} ms"
        )
        print(
            f"{'target':40s} {'predicted ms':>13s} {'measured ms':>12s} {'pred/base':>10s} {'meas/base':>10s} {'error':>8s}"
        )
        for target in targets(base):
            predicted = what_if(client, run_key, base, target)["step_ns"]
            measured = statistics.median(times[target.label][warmup:]) * 1e9
            error = (predicted / service_base) / (measured / job_base) - 1
            errors[target.label].append(error)
            print(
                f"{target.label:40s} {predicted / 1e6:13.1f} {measured / 1e6:12.1f} {predicted / service_base:10.3f}"
                f" {measured / job_base:10.3f} {100 * error:+7.1f}%"
            )
    summarise(errors, f"{jobs} interleaved jobs of {rounds} rounds")


def summarise(errors: dict[str, list[float]], over: str) -> None:
    print(f"\n{'target':40s} {'median error over ' + over:>40s}")
    per_target = []
    for label, values in errors.items():
        per_target.append(abs(statistics.median(values)))
        print(f"{label:40s} {100 * statistics.median(values):+39.1f}%")
    print(f"per target: median |error| {100 * statistics.median(per_target):.1f}%, max {100 * max(per_target):.1f}%")
    flat = [abs(e) for values in errors.values() for e in values]
    print(
        f"every single prediction ({len(flat)}): median |error| {100 * statistics.median(flat):.1f}%, "
        f"max {100 * max(flat):.1f}%"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=3, help="jobs (interleaved) or rounds of runs (--separate-runs)")
    parser.add_argument("--rounds", type=int, default=40, help="interleaved: rounds of base + every target in a job")
    parser.add_argument("--warmup", type=int, default=8, help="interleaved: first rounds left out")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--microbatch-size", type=int, default=64)
    parser.add_argument("--separate-runs", action="store_true", help="base and targets as separate jobs")
    parser.add_argument("--suggestions", action="store_true", help="measure the suggestions applied instead")
    parser.add_argument("--pairs", type=int, default=5, help="--suggestions: changed and base runs each")
    args = parser.parse_args()
    base = JobShape("1f1b", 4, (3, 1), args.microbatch_size, args.hidden, args.steps)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/bench.db"
        migrate.upgrade(url)
        server = start_server(url, Path(tmp))
        try:
            client = server.client()
            if args.suggestions:
                suggestions(client, server.url, args.pairs, args.steps)
            elif args.separate_runs:
                separate_runs(client, server.url, base, args.jobs)
            else:
                interleaved(client, server.url, base, args.jobs, args.rounds, args.warmup)
        finally:
            server.stop()


def separate_runs(client: httpx.Client, url: str, base: JobShape, rounds: int) -> None:
    """Base and each target as separate jobs, one after another, ``rounds`` times."""
    errors: dict[str, list[float]] = {t.label: [] for t in targets(base)}
    for round_index in range(rounds):
        key, measured = run_and_analyse(url, client, base)
        print(f"\nround {round_index + 1}: base {base.label}: {measured['step_ns'] / 1e6:.1f} ms")
        print(f"{'target':40s} {'predicted ms':>13s} {'measured ms':>12s} {'error':>8s}")
        for target in targets(base):
            predicted = what_if(client, key, base, target)["step_ns"]
            _, real = run_and_analyse(url, client, target)
            error = (predicted - real["step_ns"]) / real["step_ns"]
            errors[target.label].append(error)
            print(f"{target.label:40s} {predicted / 1e6:13.1f} {real['step_ns'] / 1e6:12.1f} {100 * error:+7.1f}%")
    summarise(errors, f"{rounds} rounds of separate runs")


if __name__ == "__main__":
    main()
