"""Closed-form pipeline bubbles for equal stage times and free communication (DESIGN.md §5)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BubbleFloor:
    fraction: float
    formula: str


_ALIASES = {
    "schedulegpipe": "gpipe",
    "gpipe": "gpipe",
    "schedule1f1b": "1f1b",
    "1f1b": "1f1b",
    "scheduleinterleaved1f1b": "interleaved1f1b",
    "interleaved1f1b": "interleaved1f1b",
    "naive": "naive",
    "modelparallel": "naive",
}


def closed_form_bubble(schedule: str | None, p: int, m: int, v: int = 1) -> BubbleFloor | None:
    """Bubble fraction of wall time for p stages, m micro-batches, v virtual stages per rank.

    None when the schedule has no closed form here (the simulator of a later issue covers it).
    """
    if schedule is None or p < 1 or m < 1:
        return None
    family = _ALIASES.get(schedule.lower().replace("-", "").replace("_", ""))
    if family == "naive":
        return BubbleFloor((p - 1) / p, "(p-1)/p")
    if family in ("gpipe", "1f1b"):
        return BubbleFloor((p - 1) / (m + p - 1), "(p-1)/(m+p-1)")
    if family == "interleaved1f1b" and v >= 1:
        lead = (p - 1) / v
        return BubbleFloor(lead / (m + lead), "((p-1)/v)/(m+(p-1)/v)")
    return None
