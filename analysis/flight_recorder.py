"""PyTorch Flight Recorder dumps, one per rank, read together: where each rank's collectives stand, the first
collective not every rank joined, and the collectives whose ranks disagree on what they run.

Algorithm, per process group (a collective's ``process_group`` name; its ranks from ``pg_config``, else the ranks
whose dumps hold its collectives):

1. Progress: each rank's last enqueued, started and completed collective sequence id, from its ``pg_status``
   (``-1``: none), else from its entries (the highest id in each state; a retired entry counts as completed).
2. Wavefront: collective ids are numbered in the order a rank calls them, so a rank that enqueued id N joined
   every id up to N. The first collective not every rank joined is the lowest last-enqueued id + 1, where some
   rank went further: joined by the ranks that went that far, missing on the others. A rank whose last
   enqueued collective is not completed is blocked in it.
3. Mismatches: each collective id two or more ranks hold in their buffers (a dump keeps the newest entries
   only): the ranks' op (``profiling_name``), input sizes and input dtypes compared; each field that differs is
   a mismatch, with every rank's value, as torch's own ``tools/flight_recorder`` checks type, size and dtype.

P2P entries (``is_p2p``) are numbered apart and left out of 2 and 3.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

COMPARED: Final = (("op", "profiling_name"), ("input sizes", "input_sizes"), ("input dtypes", "input_dtypes"))
STATUS_KEYS: Final = ("last_enqueued_collective", "last_started_collective", "last_completed_collective")


@dataclass(frozen=True)
class FrDump:
    """One rank's dump, as torch writes it: its format version, process groups, per-group status, entries."""

    rank: int
    file: str
    version: str
    pg_config: Mapping[str, Any]
    pg_status: Mapping[str, Any]
    entries: Sequence[Mapping[str, Any]]


@dataclass(frozen=True)
class RankProgress:
    """A rank's last enqueued, started and completed collective in a group (None: none)."""

    rank: int
    last_enqueued: int | None
    last_started: int | None
    last_completed: int | None
    blocked_in: str | None = None  # "#4 gloo:all_reduce" where its last enqueued collective is not completed


@dataclass(frozen=True)
class Wavefront:
    """The first collective not every rank of the group joined."""

    seq: int
    op: str | None
    joined: list[int]
    missing: list[int]


@dataclass(frozen=True)
class Mismatch:
    """A collective whose ranks disagree on one field (op, input sizes, input dtypes)."""

    seq: int
    what: str
    values: dict[int, str]


@dataclass(frozen=True)
class GroupReport:
    group: str
    description: str
    ranks: list[int]  # its members, as the dumps say
    without_dump: list[int]  # members whose dump was not given
    progress: list[RankProgress]
    wavefront: Wavefront | None
    mismatches: list[Mismatch] = field(default_factory=list)


@dataclass(frozen=True)
class FlightRecorderReport:
    ranks: list[int]
    groups: list[GroupReport]

    @property
    def stuck(self) -> list[GroupReport]:
        """The groups where some rank went further than another."""
        return [group for group in self.groups if group.wavefront is not None]


def _seq(value: Any) -> int | None:
    """A sequence id: an int (the pickle) or a numeric string (the JSON writes ``pg_status`` as text); -1: none."""
    if isinstance(value, str) and value.lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _ranks(text: Any) -> list[int]:
    return [int(r) for r in re.findall(r"\d+", str(text))] if text is not None else []


def _group_of(entry: Mapping[str, Any]) -> tuple[str, str]:
    group = entry.get("process_group")
    if isinstance(group, (list, tuple)) and group:
        return str(group[0]), str(group[1]) if len(group) > 1 else ""
    return str(entry.get("pg_id", "?")), ""


def _members(name: str, description: str, dumps: Sequence[FrDump], holders: set[int], groups: int) -> list[int]:
    for dump in dumps:
        configs = dump.pg_config
        if name in configs and isinstance(configs[name], Mapping) and _ranks(configs[name].get("ranks")):
            return sorted(set(_ranks(configs[name].get("ranks"))))
        for config in configs.values():
            if isinstance(config, Mapping) and description and config.get("desc") == description:
                return sorted(set(_ranks(config.get("ranks"))))
        if groups == 1 and len(configs) == 1:  # one group seen, one configured: the same one (gloo names it "")
            only = next(iter(configs.values()))
            if isinstance(only, Mapping) and _ranks(only.get("ranks")):
                return sorted(set(_ranks(only.get("ranks"))))
    return sorted(holders)


def _progress(dump: FrDump, entries: Sequence[Mapping[str, Any]]) -> RankProgress:
    pg_ids = {str(e.get("pg_id")) for e in entries if e.get("pg_id") is not None}
    status = next((dump.pg_status[i] for i in pg_ids if isinstance(dump.pg_status.get(i), Mapping)), None)
    seqs = [s for e in entries if (s := _seq(e.get("collective_seq_id"))) is not None]
    if status is not None:
        enqueued, started, completed = (_seq(status.get(key)) for key in STATUS_KEYS)
    else:
        enqueued = max(seqs, default=None)
        started = max(
            (_seq(e.get("collective_seq_id")) or 0 for e in entries if e.get("state") != "scheduled"), default=None
        )
        done = [e for e in entries if e.get("state") == "completed" or e.get("retired") is True]
        completed = max((_seq(e.get("collective_seq_id")) or 0 for e in done), default=None)
    blocked = None
    if enqueued is not None and (completed is None or completed < enqueued):
        op = next((e.get("profiling_name") for e in entries if _seq(e.get("collective_seq_id")) == enqueued), None)
        blocked = f"#{enqueued} {op or 'a collective'}"
    return RankProgress(dump.rank, enqueued, started, completed, blocked)


def _mismatches(by_rank: Mapping[int, Sequence[Mapping[str, Any]]]) -> list[Mismatch]:
    held: dict[int, dict[int, Mapping[str, Any]]] = defaultdict(dict)
    for rank, entries in by_rank.items():
        for entry in entries:
            seq = _seq(entry.get("collective_seq_id"))
            if seq is not None:
                held[seq][rank] = entry
    found = []
    for seq in sorted(held):
        if len(held[seq]) < 2:
            continue
        for what, key in COMPARED:
            values = {rank: str(entry.get(key)) for rank, entry in sorted(held[seq].items())}
            if len(set(values.values())) > 1:
                found.append(Mismatch(seq, what, values))
    return found


def flight_recorder_report(dumps: Sequence[FrDump]) -> FlightRecorderReport:
    """The report of ``dumps`` (one per rank)."""
    grouped: dict[str, dict[int, list[Mapping[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    descriptions: dict[str, str] = {}
    for dump in dumps:
        for entry in dump.entries:
            if entry.get("is_p2p") is True:
                continue
            name, description = _group_of(entry)
            descriptions.setdefault(name, description)
            grouped[name][dump.rank].append(entry)
    by_rank = {dump.rank: dump for dump in dumps}
    groups = []
    for name in sorted(grouped, key=lambda n: (not n.isdigit(), int(n) if n.isdigit() else 0, n)):
        holders = grouped[name]
        members = _members(name, descriptions[name], dumps, set(holders), len(grouped))
        progress = [_progress(by_rank[rank], holders.get(rank, [])) for rank in sorted(set(members) & set(by_rank))]
        groups.append(
            GroupReport(
                group=name,
                description=descriptions[name],
                ranks=members,
                without_dump=sorted(set(members) - set(by_rank)),
                progress=progress,
                wavefront=_wavefront(progress, holders),
                mismatches=_mismatches(holders),
            )
        )
    return FlightRecorderReport(sorted(by_rank), groups)


def _wavefront(
    progress: Sequence[RankProgress], holders: Mapping[int, Sequence[Mapping[str, Any]]]
) -> Wavefront | None:
    reached = {p.rank: p.last_enqueued or 0 for p in progress}
    if not reached or min(reached.values()) == max(reached.values()):
        return None
    seq = min(reached.values()) + 1
    op = next(
        (
            e.get("profiling_name")
            for entries in holders.values()
            for e in entries
            if _seq(e.get("collective_seq_id")) == seq
        ),
        None,
    )
    joined = sorted(rank for rank, last in reached.items() if last >= seq)
    return Wavefront(seq, None if op is None else str(op), joined, sorted(set(reached) - set(joined)))
