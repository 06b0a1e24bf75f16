"""Waiting for peers inside collectives: the part of a rank's collective before its last participant
arrived is a wait (bubble), not transfer.

Algorithm:
1. A collective span (all_reduce, all_gather, reduce_scatter, all_to_all, broadcast) names its group by
   label (``collector.register_mesh`` / ``register_group``). The group *instance* a rank's span belongs to:
   "world", every rank; a mesh dimension ("dp", "tp", ...), the ranks whose mesh coordinates equal the
   rank's on every other dimension. Another label says nothing of who the members are: such spans stay
   transfer.
2. Per group instance, each member's spans of that label in start order; when every member present has
   the same number, the k-th of each is one call (a collective is called in the same order on every
   member). A member whose spans were not read (a big run's sample) is not waited for: there the wait is
   a lower bound.
3. A member's wait in a call runs from its own start until the last member present started, cut at its
   own end; a member that ended before the last one started did not wait for it (nothing to cut).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from typing import Final

from bubblescope import intervals, wire
from bubblescope.analysis.model import TimedSpan

COLLECTIVE_KINDS: Final = wire.COMMUNICATION_KINDS - {"send", "recv"}

InstanceKey = tuple[str, tuple[tuple[str, int], ...]]  # label, the other mesh coordinates


def _instance(label: str, coords: Mapping[str, int]) -> InstanceKey | None:
    if label == wire.WORLD_GROUP:
        return (wire.WORLD_GROUP, ())
    if label in coords:
        return (label, tuple(sorted((k, v) for k, v in coords.items() if k != label)))
    return None


def collective_waits(
    spans: Iterable[TimedSpan], coords: Mapping[int, Mapping[str, int]]
) -> dict[int, list[intervals.Interval]]:
    """Per rank, the intervals of its collectives spent before the call's last participant arrived."""
    waits: dict[int, list[intervals.Interval]] = defaultdict(list)
    for by_rank in collective_waits_by_group(spans, coords).values():
        for rank, found in by_rank.items():
            waits[rank].extend(found)
    return waits


MESH_EXCLUDED: Final = frozenset({wire.WORLD_GROUP, wire.PIPELINE_GROUP})
"""Group labels that are not a mesh dimension outside the pipeline: a collective on any other (dp, tp, ...)
is what the pipeline replay does not model."""


def _calls(
    spans: Iterable[TimedSpan], coords: Mapping[int, Mapping[str, int]]
) -> Iterator[tuple[str, tuple[TimedSpan, ...]]]:
    """Each call of a collective (algorithm, 1-2): its group's label and its members' spans."""
    calls: dict[InstanceKey, dict[int, list[TimedSpan]]] = defaultdict(lambda: defaultdict(list))
    for span in spans:
        if span.kind in COLLECTIVE_KINDS and span.group:
            key = _instance(span.group, coords.get(span.rank, {}))
            if key is not None:
                calls[key][span.rank].append(span)
    for (label, _), members in calls.items():
        if len(members) < 2 or len({len(own) for own in members.values()}) != 1:
            continue
        ordered = [sorted(own, key=lambda s: s.start_ns) for own in members.values()]
        for call in zip(*ordered):
            yield label, call


def collective_waits_by_group(
    spans: Iterable[TimedSpan], coords: Mapping[int, Mapping[str, int]]
) -> dict[str, dict[int, list[intervals.Interval]]]:
    """``collective_waits`` by the group's label ("world", "dp", "tp", ...)."""
    return _waits(spans, coords, None)


def waits_and_culprits(
    spans: Iterable[TimedSpan], coords: Mapping[int, Mapping[str, int]]
) -> tuple[dict[str, dict[int, list[intervals.Interval]]], dict[int, int]]:
    """``collective_waits_by_group`` and, from the same calls, per rank the time its peers waited in them for it
    to arrive (it started the call last), ns: the culprit of the waits. Each peer's waits for it are merged
    first, so calls in flight together (DDP's buckets) count their shared wait once."""
    waited: dict[int, dict[int, list[intervals.Interval]]] = defaultdict(lambda: defaultdict(list))
    waits = _waits(spans, coords, waited)
    caused = {
        culprit: sum(intervals.union_length(found) for found in by_victim.values())
        for culprit, by_victim in waited.items()
    }
    return waits, caused


def _waits(
    spans: Iterable[TimedSpan],
    coords: Mapping[int, Mapping[str, int]],
    waited_for: dict[int, dict[int, list[intervals.Interval]]] | None,
) -> dict[str, dict[int, list[intervals.Interval]]]:
    """Algorithm step 3; ``waited_for`` (when given) collects each wait under the rank waited for too."""
    waits: dict[str, dict[int, list[intervals.Interval]]] = defaultdict(lambda: defaultdict(list))
    for label, call in _calls(spans, coords):
        latest = max(call, key=lambda s: s.start_ns)
        last = latest.start_ns
        for s in call:
            if s.start_ns < last <= s.end_ns:
                waits[label][s.rank].append((s.start_ns, last))
                if waited_for is not None:
                    waited_for[latest.rank][s.rank].append((s.start_ns, last))
    return waits
