"""Our own Perfetto export (``GET /runs/{key}/trace``, ``analysis/trace_events.py``) read back as a run: every slice
whose category is a span kind is that span again, with its step, stage, micro-batch, peer, group and name; each
rank's step slices are its windows. One file holds every exported rank. Times are the export's aligned clock."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from bubblescope import wire
from bubblescope.analysis import BUBBLESCOPE_TRACE_MARK
from bubblescope.kineto import TraceError, read_trace
from bubblescope.trace_import import NAME_CHARS, ImportedRank, Span, batches_of


class _NotAnExport(Exception):
    pass


def _integer(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def convert_export(path: Path, run_key: str) -> list[ImportedRank] | None:
    """Each rank of an export as wire batches; None when ``path`` is not an export of ours (a profiler's trace)."""
    origin = [0]  # otherData.origin_ns, read before the events (the export writes it first)
    spans: dict[int, dict[int, list[Span]]] = defaultdict(lambda: defaultdict(list))
    windows: dict[int, dict[int, tuple[int, int]]] = defaultdict(dict)

    def check(metadata: dict[str, Any]) -> None:
        if BUBBLESCOPE_TRACE_MARK not in metadata:
            raise _NotAnExport
        other = metadata.get("otherData")
        if isinstance(other, dict) and _integer(other.get("origin_ns")) is not None:
            origin[0] = other["origin_ns"]

    def add(event: dict[str, Any]) -> None:
        if event.get("ph") != "X":
            return
        rank, args = _integer(event.get("pid")), event.get("args")
        ts, dur = event.get("ts"), event.get("dur")
        if (
            rank is None
            or not isinstance(args, dict)
            or not isinstance(ts, (int, float))
            or not isinstance(dur, (int, float))
        ):
            return
        step = _integer(args.get("step"))
        if step is None:
            return
        start = origin[0] + round(ts * 1000)
        end = start + round(dur * 1000)
        kind = event.get("cat")
        if kind == "step":
            windows[rank][step] = (start, end)
        elif kind in wire.SPAN_KINDS:
            name = args.get("span_name")
            spans[rank][step].append(
                (
                    str(kind),
                    start,
                    end,
                    args.get("group") if isinstance(args.get("group"), str) else None,
                    name[:NAME_CHARS] if isinstance(name, str) else None,
                    _integer(args.get("stage")),
                    _integer(args.get("microbatch")),
                    _integer(args.get("peer")),
                )
            )

    try:
        metadata = read_trace(path, add, check)
    except _NotAnExport:
        return None
    if not windows:
        raise TraceError(f"{path}: an export of bubblescope with no step in it: nothing to import")
    found = metadata.get("otherData")
    other: dict[str, Any] = found if isinstance(found, dict) else {}
    out = []
    for rank in sorted(windows):
        batches: list[dict[str, Any]] = []
        for step in sorted(windows[rank]):
            batches += batches_of(run_key, rank, len(batches), step, spans[rank][step], windows[rank][step])
        out.append(
            ImportedRank(
                rank=rank,
                file=path.name,
                pid=0,
                world_size=_integer(other.get("world_size")),
                profiler=f"bubblescope export of run {other.get('run_key', '?')}",
                steps=sorted(windows[rank]),
                batches=batches,
                pg_config=[],
            )
        )
    return out
