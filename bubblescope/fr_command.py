"""``bubblescope import-fr``: PyTorch Flight Recorder dumps, one per rank, read together (``fr_dump`` reads each
safely; ``analysis.flight_recorder_report`` reads them together) and printed: per process group, each rank's last
enqueued, started and completed collective, the first collective not every rank joined and who is missing from
it, and the collectives whose ranks disagree on op, sizes or dtypes."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from bubblescope.analysis import FlightRecorderReport, flight_recorder_report
from bubblescope.fr_dump import DumpError, read_dump
from bubblescope.input_files import missing_files
from bubblescope.wire import API_PREFIX

# DumpError, read_dump


def _seq(value: int | None) -> str:
    return "-" if value is None else str(value)


def format_report(report: FlightRecorderReport, version: str) -> str:
    lines = [
        f"Flight Recorder dumps of {len(report.ranks)} ranks ({', '.join(map(str, report.ranks))}), version {version}"
    ]
    for group in report.groups:
        title = f"process group {group.group}" + (f" ({group.description})" if group.description else "")
        lines.append(f"{title}: ranks {', '.join(map(str, group.ranks))}")
        if group.without_dump:
            lines.append(f"  no dump for ranks {', '.join(map(str, group.without_dump))}")
        lines.append(f"  {'rank':>5} {'enqueued':>9} {'started':>8} {'completed':>10}  blocked in")
        for p in group.progress:
            lines.append(
                f"  {p.rank:>5} {_seq(p.last_enqueued):>9} {_seq(p.last_started):>8} {_seq(p.last_completed):>10}  "
                f"{p.blocked_in or ''}".rstrip()
            )
        front = group.wavefront
        if front is None:
            lines.append("  every rank joined the same collectives")
        else:
            lines.append(
                f"  first collective not every rank joined: #{front.seq} {front.op or '(not in the buffers)'}, "
                f"joined by {', '.join(map(str, front.joined))}; missing: {', '.join(map(str, front.missing))}"
            )
        for mismatch in group.mismatches:
            values = ", ".join(f"rank {rank} {value}" for rank, value in mismatch.values.items())
            lines.append(f"  mismatch in #{mismatch.seq}: {mismatch.what} differ: {values}")
        if not group.mismatches:
            lines.append("  no mismatch in op, input sizes or dtypes")
    return "\n".join(lines)


def _upload(url: str, token: str | None, run: str, paths: list[Path]) -> str | None:
    """Each dump to ``POST /runs/{run}/flight-recorder``; what went wrong with the first the service refused."""
    for path in paths:
        query = urllib.parse.urlencode({"file": path.name})
        request = urllib.request.Request(
            f"{url.rstrip('/')}{API_PREFIX}/runs/{urllib.parse.quote(run, safe='')}/flight-recorder?{query}",
            data=path.read_bytes(),
            method="POST",
            headers={
                "Content-Type": "application/octet-stream",
                **({"Authorization": f"Bearer {token}"} if token else {}),
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=120):
                pass
        except urllib.error.HTTPError as error:
            return f"{path.name}: HTTP {error.code}: {error.read(300).decode(errors='replace')}"
        except (OSError, ValueError) as error:
            return f"{path.name}: {url}: {error}"
    return None


def main(args: argparse.Namespace) -> int:
    refusal = missing_files("import-fr", args.dumps)
    if refusal:
        print(refusal, file=sys.stderr)
        return 2
    paths = [Path(p) for p in args.dumps]
    if args.url and not args.run:
        print("bubblescope import-fr: --url needs --run KEY: the run the dumps belong to", file=sys.stderr)
        return 2
    try:
        dumps = [read_dump(path) for path in paths]
    except DumpError as error:
        print(f"bubblescope import-fr: {error}", file=sys.stderr)
        return 2
    ranks = [dump.rank for dump in dumps]
    twice = sorted({rank for rank in ranks if ranks.count(rank) > 1})
    if twice:
        print(f"bubblescope import-fr: more than one dump for rank {twice[0]}: give one per rank", file=sys.stderr)
        return 2
    if args.url:
        from bubblescope.collector.config import env_setting

        problem = _upload(args.url, args.token or env_setting("token"), args.run, paths)
        if problem:
            print(f"bubblescope import-fr: {problem}", file=sys.stderr)
            return 1
        print(f"uploaded {len(paths)} dumps to run {args.run}: open {args.url.rstrip('/')}/runs/{args.run}")
    report = flight_recorder_report(dumps)
    if args.json:
        print(json.dumps(dataclasses.asdict(report), indent=1))
    else:
        print(format_report(report, ", ".join(sorted({dump.version for dump in dumps}))))
    return 0
