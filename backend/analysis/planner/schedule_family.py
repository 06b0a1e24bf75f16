"""Per-schedule facts the planner needs: the bubble (from ``schedules.closed_form_bubble``), the
activations in flight on the worst rank (DESIGN.md §5 table) and what a schedule requires."""

from __future__ import annotations

from bubblescope.backend.analysis.schedules import closed_form_bubble

#: Activations in flight on the worst rank, in chunks, and chunks per stage (v for interleaved).
_IN_FLIGHT_CHUNKS = {
    "naive": lambda p, m, v: 1,
    "gpipe": lambda p, m, v: m,
    "1f1b": lambda p, m, v: min(p, m),
    "interleaved1f1b": lambda p, m, v: min(p * v + p - 1, m * v),
    "interleavedzerobubble": lambda p, m, v: min(p * v + p - 1, m * v),
    "zbh1": lambda p, m, v: min(p, m),
    "zbvzerobubble": lambda p, m, v: min(2 * p, 2 * m),
    "dualpipev": lambda p, m, v: min(2 * p + 1, 2 * m),
}
_CHUNKS_PER_STAGE = {"zbvzerobubble": 2, "dualpipev": 2}

#: Schedules the search tries; others are evaluated when asked for, if they have a closed form.
SEARCHED = ("1f1b", "interleaved1f1b", "gpipe")


def family(schedule: str) -> str:
    """``Schedule1F1B``, ``1f1b``, ``interleaved-1f1b`` … → the canonical key."""
    key = schedule.strip().lower().replace("-", "").replace("_", "")
    return key[len("schedule"):] if key.startswith("schedule") else key


def chunks_per_stage(schedule: str, vpp: int) -> int:
    fam = family(schedule)
    return _CHUNKS_PER_STAGE.get(fam, vpp if fam in ("interleaved1f1b", "interleavedzerobubble") else 1)


def bubble_fraction(schedule: str, pp: int, microbatches: int, vpp: int) -> float | None:
    """Closed-form bubble of wall time; 0 without pipelining; None if the schedule has none yet."""
    if pp == 1:
        return 0.0
    floor = closed_form_bubble(family(schedule), pp, microbatches, chunks_per_stage(schedule, vpp))
    return None if floor is None else floor.fraction


def in_flight_microbatch_layers(schedule: str, pp: int, microbatches: int, vpp: int, layers: int) -> float:
    """Micro-batch·layers of activations held at once by the first stage."""
    rule = _IN_FLIGHT_CHUNKS.get(family(schedule), _IN_FLIGHT_CHUNKS["1f1b"])
    if pp == 1:
        return float(layers)  # gradient accumulation: one micro-batch at a time
    chunks = chunks_per_stage(schedule, vpp)
    return rule(pp, microbatches, chunks) * layers / chunks


def schedule_problem(schedule: str, pp: int, microbatches: int, vpp: int, layers: int) -> str | None:
    """Why this schedule cannot run this way, or None."""
    fam = family(schedule)
    if fam not in _IN_FLIGHT_CHUNKS:
        return f"unknown schedule {schedule!r}; known: {', '.join(_IN_FLIGHT_CHUNKS)}"
    if pp > 1 and bubble_fraction(schedule, pp, microbatches, vpp) is None:
        return f"schedule {schedule!r} has no closed-form bubble yet"
    if fam == "naive" and microbatches != 1:
        return "naive model parallelism runs one micro-batch per step"
    if fam in ("1f1b", "interleaved1f1b") and pp > 1 and microbatches < pp:
        return f"{fam} needs at least p={pp} micro-batches per step, got {microbatches}"
    chunks = chunks_per_stage(schedule, vpp)
    if vpp > 1 and chunks == 1:
        return f"vpp={vpp} needs an interleaved schedule, not {schedule!r}"
    if chunks > 1 and layers % (pp * chunks):
        return f"{layers} layers do not split into {pp}·{chunks} equal chunks"
    if fam == "interleaved1f1b" and microbatches % pp:
        return f"interleaved 1F1B needs micro-batches ({microbatches}) divisible by p={pp}"
    return None
