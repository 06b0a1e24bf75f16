"""Closed-form pipeline bubbles for equal stage times and free communication (DESIGN.md §5).

Fractions of wall time for p ranks, m micro-batches, v virtual stages per rank. The zero-bubble
forms take T_F = T_B(input) = T_W, as DESIGN.md §5 states them; the simulator
(``simulator.py``) replays any other durations and agrees with every form here exactly (tests).
- naive: (p-1)/p; GPipe and 1F1B: (p-1)/(m+p-1);
- interleaved 1F1B and looped BFS: ((p-1)/v)/(m+(p-1)/v);
- ZB-H1 (``ScheduleInterleavedZeroBubble``, v=1): (p-1)(T_F+T_B-T_W) idle per rank, i.e.
  (p-1)/(3m+p-1); with v stages per rank ((p-1)/v)/(3m+(p-1)/v);
- ZBV and DualPipeV (v=2, m >= 2p): torch's orders idle (p-1)·T per rank, the same
  ((p-1)/v)/(3m+(p-1)/v) — DualPipeV's (S/2-1)(T_F&B+T_B-3T_W) with S = 2p stages.
"""

from __future__ import annotations

from dataclasses import dataclass

from bubblescope.backend.analysis.pipeline_orders import ScheduleError, canonical_schedule


@dataclass(frozen=True)
class BubbleFloor:
    fraction: float
    formula: str


def closed_form_bubble(schedule: str | None, p: int, m: int, v: int = 1) -> BubbleFloor | None:
    """Bubble fraction of wall time; None for an unknown schedule or a shape the form does not cover."""
    if schedule is None or p < 1 or m < 1 or v < 1:
        return None
    try:
        family = canonical_schedule(schedule)
    except ScheduleError:
        return None
    if family == "naive":
        return BubbleFloor((p - 1) / p, "(p-1)/p")
    if family in ("gpipe", "1f1b"):
        return BubbleFloor((p - 1) / (m + p - 1), "(p-1)/(m+p-1)")
    lead = (p - 1) / v
    if family in ("interleaved1f1b", "loopedbfs"):
        return BubbleFloor(lead / (m + lead), "((p-1)/v)/(m+(p-1)/v)")
    if family == "interleavedzb":
        return BubbleFloor(lead / (3 * m + lead), "((p-1)/v)/(3m+(p-1)/v), T_F=T_B=T_W")
    if family in ("zbv", "dualpipev") and v == 2 and m >= 2 * p:
        return BubbleFloor(lead / (3 * m + lead), "((p-1)/2)/(3m+(p-1)/2), T_F=T_B=T_W, m>=2p")
    return None
