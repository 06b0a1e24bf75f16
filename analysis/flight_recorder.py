"""PyTorch Flight Recorder dumps, one per rank, read together: where each rank's collectives stand, the first
collective not every rank joined, and the collectives whose ranks disagree on what they run.

Algorithm, per process group (a collective's ``process_group`` name and its ranks as each rank's ``pg_config``
says them, as torch's own analyzer keys groups: split groups share a name; else the ranks whose dumps hold it):

1. Progress: each rank's last enqueued, started and completed collective sequence id, from its ``pg_status``
   (``-1``: none), except where the rank's buffer holds P2P entries of the group (NCCL numbers a P2P op in that
   status too): then from its entries, the highest id in each state (a retired entry counts as completed).
2. Wavefront: collective ids are numbered in the order a rank calls them, so a rank that enqueued id N joined
   every id up to N. Over the ranks whose progress is known, the first collective not every rank joined is the
   lowest last-enqueued id + 1, where some rank went further: joined by the ranks that went that far, missing on
   the others. A rank that joined it and has not completed it is blocked in it (completion is recorded after
   the fact, by a watchdog on NCCL, so a healthy rank's last collective may read as not yet completed: only the
   wavefront's is called blocking).
3. Mismatches: each collective id two or more ranks hold in their buffers (a dump keeps the newest entries
   only): the ranks' op type, input and output sizes and input dtypes compared as torch's ``tools/flight_recorder``
   compares them (an all-to-all's or a scatter's inputs may differ in size, an all-to-all's or a gather's outputs,
   a scatter's or a broadcast's input dtypes; a rank without input has no dtype to compare); each field that
   differs is a mismatch, with every rank's value.

P2P entries (``is_p2p``) are numbered apart and left out of 2 and 3.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

COMPARED: Final = (
    ("op", "profiling_name"),
    ("input sizes", "input_sizes"),
    ("output sizes", "output_sizes"),
    ("input dtypes", "input_dtypes"),
)
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
    blocked_in: str | None = None  # "#4 gloo:all_reduce": it joined the group's wavefront collective, not completed


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
    """A sequence id: an int (the pickle) or a decimal string (the JSON writes ``pg_status`` as text); -1: none."""
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,18}", value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _ranks(text: Any) -> tuple[int, ...]:
    return tuple(sorted({int(r) for r in re.findall(r"[0-9]{1,9}", str(text))})) if text is not None else ()


def _group_of(entry: Mapping[str, Any]) -> tuple[str, str]:
    group = entry.get("process_group")
    if isinstance(group, (list, tuple)) and group:
        return str(group[0]), str(group[1]) if len(group) > 1 else ""
    return str(entry.get("pg_id", "?")), ""


def _configured(dump: FrDump, name: str, description: str, names_seen: int) -> tuple[int, ...]:
    """The group's ranks as this rank's ``pg_config`` says them (split groups share a name, not their ranks)."""
    configs = dump.pg_config
    config = configs.get(name)
    if isinstance(config, Mapping) and _ranks(config.get("ranks")):
        return _ranks(config.get("ranks"))
    described = [c for c in configs.values() if isinstance(c, Mapping) and description and c.get("desc") == description]
    if len(described) == 1:  # a description only one group has (torch describes many groups "undefined")
        return _ranks(described[0].get("ranks"))
    if names_seen == 1 and len(configs) == 1:  # one group seen, one configured: the same one (gloo names it "")
        only = next(iter(configs.values()))
        if isinstance(only, Mapping):
            return _ranks(only.get("ranks"))
    return ()


def _type(entry: Mapping[str, Any]) -> str:
    """The collective's type as torch's analyzer reads it: ``nccl:all_reduce`` -> ``all_reduce``."""
    return str(entry.get("profiling_name", "")).split(":", 1)[-1].split(" ")[0]


def _progress(
    dump: FrDump, entries: Sequence[Mapping[str, Any]], pg_id: str | None, has_p2p: bool, at: int | None
) -> RankProgress:
    """From ``pg_status`` where it counts collectives only (a P2P op's number goes there too, so a group with P2P
    entries is read from its entries), else from the entries."""
    status = dump.pg_status.get(pg_id) if pg_id is not None else None
    done = [e for e in entries if e.get("state") == "completed" or e.get("retired") is True]
    completed = max((s for e in done if (s := _seq(e.get("collective_seq_id"))) is not None), default=None)
    if isinstance(status, Mapping) and not has_p2p:
        listed, started, reported = (_seq(status.get(key)) for key in STATUS_KEYS)
        entered = max((s for e in entries if (s := _seq(e.get("collective_seq_id"))) is not None), default=None)
        enqueued = max((s for s in (listed, entered) if s is not None), default=None)
        # NCCL's status lags its entries (an H100 dump: four all-reduces "completed", status -1) and tracks
        # starts only with TORCH_NCCL_ENABLE_TIMING: a completed collective has also started.
        completed = max((s for s in (reported, completed) if s is not None), default=None)
        started = max((s for s in (started, completed) if s is not None), default=None)
    else:
        enqueued = max((s for e in entries if (s := _seq(e.get("collective_seq_id"))) is not None), default=None)
        started = max(
            (
                s
                for e in entries
                if e.get("state") != "scheduled" and (s := _seq(e.get("collective_seq_id"))) is not None
            ),
            default=None,
        )
    blocked = None
    if at is not None and enqueued is not None and enqueued >= at and (completed is None or completed < at):
        op = next((e.get("profiling_name") for e in entries if _seq(e.get("collective_seq_id")) == at), None)
        blocked = f"#{at} {op or 'a collective'}"
    return RankProgress(dump.rank, enqueued, started, completed, blocked)


def _differs(what: str, kind: str, entries: Mapping[int, Mapping[str, Any]]) -> bool:
    """Whether the ranks' entries of one collective differ in ``what``, with torch's exemptions (an all-to-all's or
    a scatter's inputs may differ in size; a scatter's or a broadcast's in dtype; a rank without input none)."""
    if what == "input sizes" and kind in ("all_to_all", "scatter"):
        return False
    if what == "output sizes" and kind in ("all_to_all", "gather"):
        return False
    if what == "input dtypes":
        if kind in ("scatter", "broadcast"):
            return False
        entries = {r: e for r, e in entries.items() if _first(e.get("input_sizes"))}
    key = dict(COMPARED)[what]
    values = {str(entry.get(key)) if what != "op" else _type(entry) for entry in entries.values()}
    return len(values) > 1


def _first(sizes: Any) -> bool:
    return isinstance(sizes, (list, tuple)) and bool(sizes) and bool(sizes[0])


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
        kind = _type(next(iter(held[seq].values())))
        for what, key in COMPARED:
            if _differs(what, kind, held[seq]):
                values = {rank: str(entry.get(key)) for rank, entry in sorted(held[seq].items())}
                found.append(Mismatch(seq, what, values))
                if what == "op":
                    break  # other ops: their sizes differ as a matter of course
    return found


def _order(name: str) -> tuple[bool, int, str]:
    return (not name.isdecimal(), int(name) if name.isdecimal() and len(name) < 19 else 0, name)


def flight_recorder_report(dumps: Sequence[FrDump]) -> FlightRecorderReport:
    """The report of ``dumps`` (one per rank)."""
    names = {_group_of(e)[0] for dump in dumps for e in dump.entries if e.get("is_p2p") is not True}
    # a group: its name and its ranks as each rank's pg_config says them (torch keys split groups the same way)
    grouped: dict[tuple[str, tuple[int, ...]], dict[int, list[Mapping[str, Any]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    descriptions: dict[str, str] = {}
    pg_ids: dict[str, str] = {}
    with_p2p: set[tuple[str, int]] = set()
    for dump in dumps:
        for entry in dump.entries:
            name, description = _group_of(entry)
            pg_ids.setdefault(name, str(entry.get("pg_id")))
            if entry.get("is_p2p") is True:
                with_p2p.add((name, dump.rank))
                continue
            descriptions.setdefault(name, description)
            grouped[(name, _configured(dump, name, description, len(names)))][dump.rank].append(entry)
    by_rank = {dump.rank: dump for dump in dumps}
    groups = []
    for name, configured in sorted(grouped, key=lambda key: (_order(key[0]), key[1])):
        holders = grouped[(name, configured)]
        members = sorted(configured or holders)
        known = [by_rank[rank] for rank in members if rank in by_rank]
        first = [
            _progress(d, holders.get(d.rank, []), pg_ids.get(name), (name, d.rank) in with_p2p, None) for d in known
        ]
        front = _wavefront(first, holders)
        at = front.seq if front is not None else None
        progress = [
            _progress(d, holders.get(d.rank, []), pg_ids.get(name), (name, d.rank) in with_p2p, at) for d in known
        ]
        groups.append(
            GroupReport(
                group=name,
                description=descriptions.get(name, ""),
                ranks=members,
                without_dump=sorted(set(members) - set(by_rank)),
                progress=progress,
                wavefront=front,
                mismatches=_mismatches(holders),
            )
        )
    return FlightRecorderReport(sorted(by_rank), groups)


def _wavefront(
    progress: Sequence[RankProgress], holders: Mapping[int, Sequence[Mapping[str, Any]]]
) -> Wavefront | None:
    """Over the ranks whose progress is known (a rank whose buffer kept nothing of the group says nothing)."""
    reached = {p.rank: p.last_enqueued for p in progress if p.last_enqueued is not None}
    if len(reached) < 2 or min(reached.values()) == max(reached.values()):
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
