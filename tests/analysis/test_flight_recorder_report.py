"""The Flight Recorder report on dumps built as torch writes them (the entries' and status' fields of
``_dump_fr_trace``), for what a two-rank gloo job cannot show: P2P numbers in a group's status, a rank whose
buffer kept nothing of a group, split groups sharing a name, torch's mismatch exemptions, malformed numbers."""

from __future__ import annotations

from typing import Any

from bubblescope.analysis import FrDump, flight_recorder_report


def entry(seq: int, op: str = "nccl:all_reduce", group: str = "0", p2p: bool = False, **fields: Any) -> dict[str, Any]:
    return {
        "collective_seq_id": 0 if p2p else seq,
        "p2p_seq_id": seq if p2p else 0,
        "is_p2p": p2p,
        "pg_id": int(group) if group.isdecimal() else 9,
        "process_group": (group, "default_pg" if group == "0" else "sub"),
        "profiling_name": op,
        "input_sizes": [[8]],
        "output_sizes": [[8]],
        "input_dtypes": ["Float"],
        "state": "completed",
        "retired": True,
        **fields,
    }


def dump(rank: int, entries: list[dict[str, Any]], status: dict[str, Any] | None = None, config: Any = None) -> FrDump:
    return FrDump(rank, f"rank{rank}", "2.10", config or {"0": {"ranks": "[0, 1]"}}, status or {}, entries)


def test_a_p2p_number_in_the_groups_status_is_not_read_as_a_collective() -> None:
    """NCCL counts a send in lastEnqueuedSeq too: rank 0's status says 9 (its 9th send), its collectives stop
    at 3 like rank 1's."""
    rank0 = dump(
        0, [entry(s) for s in (1, 2, 3)] + [entry(9, "nccl:send", p2p=True)], {"0": {"last_enqueued_collective": 9}}
    )
    rank1 = dump(1, [entry(s) for s in (1, 2, 3)], {"0": {"last_enqueued_collective": 3}})
    [group] = flight_recorder_report([rank0, rank1]).groups
    assert group.wavefront is None and [p.last_enqueued for p in group.progress] == [3, 3]


def test_a_rank_whose_buffer_kept_nothing_of_a_group_is_not_missing_from_it() -> None:
    """Rank 1's ring buffer was filled by group 0's collectives: of group 1 it says nothing, so nobody is missing."""
    config = {"0": {"ranks": "[0, 1]"}, "1": {"ranks": "[0, 1]"}}
    rank0 = dump(0, [entry(s, group="1") for s in (1, 2, 7)] + [entry(s) for s in (1, 2)], config=config)
    rank1 = dump(1, [entry(s) for s in (1, 2)], config=config)
    groups = {g.group: g for g in flight_recorder_report([rank0, rank1]).groups}
    assert groups["1"].wavefront is None and [p.rank for p in groups["1"].progress if p.last_enqueued] == [0]


def test_split_groups_sharing_a_name_are_reported_apart() -> None:
    """Group "1" is [0, 1] on ranks 0-1 and [2, 3] on ranks 2-3 (torch's split_group): ranks 2 and 3 disagree."""
    low = {"1": {"ranks": "[0, 1]"}}
    high = {"1": {"ranks": "[2, 3]"}}
    dumps = [
        dump(0, [entry(s, group="1") for s in (1, 2, 3)], config=low),
        dump(1, [entry(s, group="1") for s in (1, 2, 3)], config=low),
        dump(2, [entry(s, group="1") for s in (1, 2, 3, 4, 5)], config=high),
        dump(3, [entry(s, group="1") for s in (1, 2, 3)], config=high),
    ]
    groups = flight_recorder_report(dumps).groups
    assert [(g.group, g.ranks, g.wavefront and g.wavefront.missing) for g in groups] == [
        ("1", [0, 1], None),
        ("1", [2, 3], [3]),
    ]
    assert groups[1].wavefront is not None and groups[1].wavefront.seq == 4


def test_torchs_exemptions_and_real_mismatches() -> None:
    """An all-to-all's inputs may differ in size (uneven splits), a broadcast's dtype on a rank without input; an
    all-reduce's sizes and dtypes may not, and another op is one mismatch (its sizes are not listed again)."""
    rank0 = [
        entry(1, "nccl:all_to_all", input_sizes=[[100, 8]], output_sizes=[[100, 8]]),
        entry(2, "nccl:broadcast", input_dtypes=["Float"]),
        entry(3, input_sizes=[[8]]),
        entry(4, input_dtypes=["Float"]),
        entry(5, "nccl:all_reduce"),
    ]
    rank1 = [
        entry(1, "nccl:all_to_all", input_sizes=[[140, 8]], output_sizes=[[60, 8]]),
        entry(2, "nccl:broadcast", input_dtypes=["Half"]),
        entry(3, input_sizes=[[16]], output_sizes=[[16]]),
        entry(4, input_dtypes=["Double"]),
        entry(5, "nccl:all_gather", output_sizes=[[16]]),
    ]
    [group] = flight_recorder_report([dump(0, rank0), dump(1, rank1)]).groups
    assert [(m.seq, m.what) for m in group.mismatches] == [
        (3, "input sizes"),
        (3, "output sizes"),
        (4, "input dtypes"),
        (5, "op"),
    ]


def test_malformed_numbers_and_names_are_read_as_unknown_not_raised() -> None:
    odd = [entry(1, group="²"), {**entry(2), "collective_seq_id": "--5"}, {"process_group": 5, "profiling_name": None}]
    status = {"0": {"last_enqueued_collective": "--5", "last_completed_collective": "9" * 40}}
    report = flight_recorder_report([dump(0, odd, status), dump(1, [entry(1)], {"0": "not a mapping"})])
    assert report.ranks == [0, 1] and report.groups


def test_groups_described_alike_are_not_given_one_anothers_ranks() -> None:
    """Torch describes groups it was not told about "undefined": such a description names no group."""
    config = {"a": {"desc": "undefined", "ranks": "[0, 1]"}, "b": {"desc": "undefined", "ranks": "[2, 3]"}}
    entries = [{**entry(s, group="9"), "process_group": ("9", "undefined")} for s in (1, 2)]
    [group] = flight_recorder_report([dump(2, entries, config=config), dump(3, entries, config=config)]).groups
    assert group.ranks == [2, 3] and group.without_dump == []
