"""Reading real profiler traces: our streaming reader and figures against Holistic Trace Analysis 0.5.0's parse,
side by side in one run, each in a fresh process (wall time and the process's peak resident memory).

For each reference Kineto trace (``$BUBBLESCOPE_SHARED_DATA/kineto``, by default the workplace's shared data
folder beside the checkout; or ``--traces``): ours reads the file and computes HTA's figures as
``trace-summary`` does (``bubblescope.trace_summary.summarize``: the activities on disk, read back in order); HTA builds its ``TraceAnalysis``
of the same file (a folder holding only it) and computes its temporal breakdown. Printed: events, seconds,
events per second, peak RSS (the process's own VmHWM), and the ratios (HTA / ours). ``--scale K...`` also writes
the largest trace K times over (steps shifted in time) to a temporary gzip file and reads that with ours alone,
both the summary (``trace-summary``'s figures) and the import (``import-trace``'s
conversion, which holds one step): a trace of about K times the size, for the memory bound.

    python bench/trace_import.py [--traces FILE...] [--repeat 3] [--scale 1 10 80]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
KINETO = Path(os.environ.get("BUBBLESCOPE_SHARED_DATA", REPO.parent / "shared" / "data")) / "kineto"

PEAK = """def peak_mib():  # this process's own peak RSS (VmHWM): ru_maxrss keeps the parent's across fork and exec
    status = open("/proc/self/status").read()
    return int(status.split("VmHWM:")[1].split()[0]) / 1024"""

OURS = """
import json, sys, time
PEAK
from pathlib import Path
from bubblescope.trace_summary import summarize
start = time.perf_counter()
(summary,) = summarize([Path(sys.argv[1])])
figures = summary.hta
print(json.dumps({"s": time.perf_counter() - start, "events": summary.events, "idle": figures.share(figures.idle_us),
                  "rss_mib": peak_mib()}))
"""

IMPORT = """
import json, sys, time
PEAK
from pathlib import Path
from bubblescope.trace_import import convert, requests_for
start = time.perf_counter()
imported = convert(Path(sys.argv[1]), "bench")
spans = sum(len(d["spans"]["step"]) for method, _, d in requests_for([imported], "bench", "bench") if method == "POST")
print(json.dumps({"s": time.perf_counter() - start, "spans": spans, "steps": len(imported.steps),
                  "rss_mib": peak_mib()}))
"""

HTA = """
import json, logging, shutil, sys, tempfile, time
PEAK
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
folder = tempfile.mkdtemp()
shutil.copy(sys.argv[1], folder)
start = time.perf_counter()
analysis = TraceAnalysis(trace_dir=folder)
breakdown = analysis.get_temporal_breakdown(visualize=False)
print(json.dumps({"s": time.perf_counter() - start, "idle": float(breakdown["idle_time_pctg"].iloc[0]) / 100,
                  "rss_mib": peak_mib()}))
"""

OURS, IMPORT, HTA = (code.replace("PEAK\n", PEAK + "\n", 1) for code in (OURS, IMPORT, HTA))


def run(code: str, path: Path) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=3600, cwd=REPO
    )
    if done.returncode != 0:
        raise SystemExit(f"{path}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def scaled_copy(path: Path, times: int, folder: Path) -> Path:
    """The trace with its events written ``times`` times, each copy shifted past the previous one: its profiler
    steps numbered on, its correlation ids apart from the other copies' (a longer run of the same job)."""
    document = json.loads(gzip.decompress(path.read_bytes()))
    events = document.pop("traceEvents")
    starts = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    width = max(starts) - min(starts) + 1_000
    steps = sorted({int(e["name"].split("#")[1]) for e in events if str(e.get("name", "")).startswith("ProfilerStep#")})
    correlations = 1 + max(
        (int(e["args"].get("correlation", 0)) for e in events if isinstance(e.get("args"), dict)), default=0
    )
    out = folder / f"scaled{times}_{path.name}"
    with gzip.open(out, "wt", compresslevel=1) as handle:
        handle.write(json.dumps(document)[:-1] + ', "traceEvents": [')
        for copy in range(times):
            for index, event in enumerate(events):
                shifted = dict(event)
                if isinstance(shifted.get("ts"), (int, float)):
                    shifted["ts"] += copy * width
                if copy and steps and str(shifted.get("name", "")).startswith("ProfilerStep#"):
                    shifted["name"] = f"ProfilerStep#{int(shifted['name'].split('#')[1]) + copy * len(steps)}"
                if copy and isinstance(shifted.get("args"), dict) and "correlation" in shifted["args"]:
                    shifted["args"] = {
                        **shifted["args"],
                        "correlation": shifted["args"]["correlation"] + copy * correlations,
                    }
                handle.write(("," if copy or index else "") + json.dumps(shifted))
        handle.write("]}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--traces", nargs="*", type=Path, default=None)
    parser.add_argument("--repeat", type=int, default=3, help="runs per reader and file (the median is printed)")
    parser.add_argument(
        "--scale", type=int, nargs="*", default=[], help="also read the largest trace written K times over, each K"
    )
    args = parser.parse_args()
    traces = args.traces or sorted(KINETO.rglob("*.json.gz"))
    if not traces:
        raise SystemExit(f"no traces: none in {KINETO} (set BUBBLESCOPE_SHARED_DATA or pass --traces)")
    print(
        f"{'trace':46} {'events':>8} | {'ours s':>7} {'HTA s':>7} {'rate x':>7} | {'ours MiB':>8} {'HTA MiB':>8} {'mem /':>6} | idle ours/HTA"
    )
    for path in traces:
        ours = [run(OURS, path) for _ in range(args.repeat)]
        hta = [run(HTA, path) for _ in range(args.repeat)]
        ours_s, hta_s = statistics.median(r["s"] for r in ours), statistics.median(r["s"] for r in hta)
        ours_mib, hta_mib = statistics.median(r["rss_mib"] for r in ours), statistics.median(r["rss_mib"] for r in hta)
        print(
            f"{path.name:46} {int(ours[0]['events']):>8} | {ours_s:>7.3f} {hta_s:>7.3f} {hta_s / ours_s:>6.1f}x | "
            f"{ours_mib:>8.0f} {hta_mib:>8.0f} {ours_mib / hta_mib:>6.2f} | {100 * ours[0]['idle']:.2f}% / {100 * hta[0]['idle']:.2f}%",
            flush=True,
        )
    if args.scale:
        largest = max(traces, key=lambda p: p.stat().st_size)
        print(f"\n{largest.name} written K times over; ours alone: the summary (figures) and the import (a run)")
        print(
            f"{'K':>4} {'gzip MiB':>9} {'events':>11} | {'summary s':>9} {'peak MiB':>8} | {'import s':>8} {'peak MiB':>8}"
        )
        with tempfile.TemporaryDirectory() as folder:
            for times in args.scale:
                big = scaled_copy(largest, times, Path(folder)) if times > 1 else largest
                summary, imported = run(OURS, big), run(IMPORT, big)
                print(
                    f"{times:>4} {big.stat().st_size / 2**20:>9.0f} {int(summary['events']):>11,} | "
                    f"{summary['s']:>9.1f} {summary['rss_mib']:>8.0f} | {imported['s']:>8.1f} {imported['rss_mib']:>8.0f}",
                    flush=True,
                )
                if times > 1:
                    big.unlink()


if __name__ == "__main__":
    main()
