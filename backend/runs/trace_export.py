"""GET /runs/{key}/trace: a range of a run's steps as Chrome trace-event JSON for Perfetto (``analysis.chrome_trace``),
of the ranks the step view shows (every rank of a run of up to 64, else each stage's median and slowest) or of
those asked for: a 1,024-rank run exports a few ranks, never gigabytes by default."""

from __future__ import annotations

from typing import Any, Final

from sqlalchemy.orm import Session

from bubblescope import analysis
from bubblescope.backend.derived.steps import read_step, run_rank_places
from bubblescope.backend.errors import Invalid, NotFound
from bubblescope.backend.runs.timeline_ranks import parse_ranks, timeline_ranks
from bubblescope.backend.store import steps as step_queries
from bubblescope.backend.store.runs import require_run

MAX_EXPORT_STEPS: Final = 20


def trace_export(
    session: Session, key: str, from_step: int | None, to_step: int | None, ranks: str | None
) -> tuple[dict[str, Any], str]:
    """(the trace document, a file name for it); without a range, the newest step with spans."""
    run = require_run(session, key)
    if from_step is not None and to_step is not None and to_step < from_step:
        raise Invalid("to_step", f"to_step {to_step} is before from_step {from_step}")
    with_spans = sorted(step_queries.steps_with_spans(session, run.id))
    if not with_spans:
        raise NotFound("run_key", f"run {key!r} has no step with spans to export yet")
    lo = from_step if from_step is not None else to_step if to_step is not None else with_spans[-1]
    hi = to_step if to_step is not None else lo
    if hi - lo + 1 > MAX_EXPORT_STEPS:
        raise Invalid("to_step", f"at most {MAX_EXPORT_STEPS} steps an export (asked for {hi - lo + 1})")
    asked = None if ranks is None else parse_ranks(ranks, run.world_size)
    exported = []
    for step in (s for s in with_spans if lo <= s <= hi):
        found = read_step(session, run, step)
        if found is None:
            continue
        wanted = {shown.rank for shown in timeline_ranks(found.broken.breakdowns, asked)}
        record = found.aligned.record
        exported.append(
            analysis.ExportedStep(
                step=step,
                spans=[s for s in record.spans if s.rank in wanted],
                windows={rank: window for rank, window in record.windows.items() if rank in wanted},
                matched=[(recv, sent) for recv, sent in found.broken.matched if recv.rank in wanted],
                memory=[m for m in step_queries.memory_peaks(session, run.id, [step]) if m.rank in wanted],
            )
        )
    if not exported:
        raise NotFound("from_step", f"run {key!r} has no step with spans in {lo}-{hi}")
    document = analysis.chrome_trace(key, exported, run_rank_places(session, run), run.world_size)
    return document, f"{key}-steps-{lo}-{hi}.trace.json"
