"""Flight Recorder dumps: real ones from a gloo job (torch 2.13 records gloo's collectives) read as torch writes
them, pickle and JSON; a hostile pickle refused with nothing run; mismatches found in a real dump edited."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.traces.support import settled

pytestmark = pytest.mark.slow


def import_fr(*args: str | Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "bubblescope.cli", "import-fr", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def report(*paths: Path) -> dict[str, Any]:
    done = import_fr(*paths, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_a_hung_collective_is_found_with_the_rank_missing_from_it(fr_dumps: Path) -> None:
    pickles = [fr_dumps / "nccl_trace_rank_0", fr_dumps / "nccl_trace_rank_1"]
    found = report(*pickles)
    assert found["ranks"] == [0, 1] and len(found["groups"]) == 1
    group = found["groups"][0]
    assert group["ranks"] == [0, 1] and group["without_dump"] == []
    progress = {p["rank"]: p for p in group["progress"]}
    # 3 all-reduces and a broadcast on both; rank 0 enqueued a 5th collective that rank 1 never joined
    assert progress[0]["last_enqueued"] == 5 and progress[1]["last_enqueued"] == 4, progress
    # rank 0 joined #5 and cannot complete it; rank 1 never joined it (completion of earlier ones is recorded
    # after the fact, so their completed ids are not asserted)
    assert progress[0]["blocked_in"] == "#5 gloo:all_reduce" and progress[1]["blocked_in"] is None, progress
    assert group["wavefront"] == {"seq": 5, "op": "gloo:all_reduce", "joined": [0], "missing": [1]}
    assert group["mismatches"] == []
    # The JSON says the same, but for the started and completed ids: each rank wrote its JSON a moment before its
    # pickle, and a collective can complete in between (the entries say so at once, pg_status later)
    assert settled(report(fr_dumps / "trace_rank_0.json", fr_dumps / "trace_rank_1.json")) == settled(found)
    text = import_fr(*pickles)
    assert "first collective not every rank joined: #5 gloo:all_reduce, joined by 0; missing: 1" in text.stdout


def test_ranks_that_disagree_on_a_collective_are_mismatches(fr_dumps: Path, tmp_path: Path) -> None:
    """Rank 1's dump with its third all-reduce's dtype and its broadcast's op changed: what a job that called
    them differently would have recorded."""
    document = pickle.loads((fr_dumps / "nccl_trace_rank_1").read_bytes())
    for entry in document["entries"]:
        if entry["collective_seq_id"] == 3:
            entry["input_dtypes"] = ["Double"]
        if entry["collective_seq_id"] == 4:
            entry["profiling_name"] = "gloo:all_gather"
    (tmp_path / "nccl_trace_rank_1").write_bytes(pickle.dumps(document))
    group = report(fr_dumps / "nccl_trace_rank_0", tmp_path / "nccl_trace_rank_1")["groups"][0]
    assert [(m["seq"], m["what"]) for m in group["mismatches"]] == [(3, "input dtypes"), (4, "op")]
    assert group["mismatches"][1]["values"] == {"0": "gloo:broadcast", "1": "gloo:all_gather"}


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_a_hostile_pickle_is_refused_with_nothing_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    hostile = tmp_path / "nccl_trace_rank_0"
    hostile.write_bytes(pickle.dumps({"entries": [], "version": _Payload(marker)}))
    done = import_fr(hostile)
    assert done.returncode == 2 and not marker.exists(), done
    assert "names posix.system" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_files_that_are_not_dumps_are_refused_in_one_line(tmp_path: Path) -> None:
    cases = {
        "nccl_trace_rank_0": b"\x80\x05garbage",
        "trace_rank_1.json": b'{"traceEvents": []}',
        "dump.json": json.dumps({"entries": []}).encode(),
    }
    for name, data in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        done = import_fr(path)
        assert done.returncode == 2, (name, done)
        assert len(done.stderr.strip().splitlines()) == 1 and name in done.stderr, (name, done.stderr)


def test_a_mutated_dump_is_read_or_refused_never_crashes(fr_dumps: Path, tmp_path: Path) -> None:
    """500 copies of a real dump, pickle and JSON, with bytes changed or cut: each is read and reported, or refused
    with a ``DumpError``; nothing else escapes (a length field mutated to gigabytes included)."""
    import random

    from bubblescope.analysis import flight_recorder_report
    from bubblescope.fr_dump import DumpError, read_dump

    sources = [(fr_dumps / name).read_bytes() for name in ("nccl_trace_rank_0", "trace_rank_0.json")]
    other = read_dump(fr_dumps / "nccl_trace_rank_1")
    rng = random.Random(7)
    outcomes = {"read": 0, "refused": 0}
    mutated = tmp_path / "nccl_trace_rank_0"
    for index in range(500):
        data = bytearray(sources[index % 2])  # the pickle and the JSON in turn
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        mutated.write_bytes(bytes(data[: rng.randrange(len(data))] if rng.random() < 0.3 else data))
        try:
            flight_recorder_report([read_dump(mutated), other])
            outcomes["read"] += 1
        except DumpError:
            outcomes["refused"] += 1
    assert outcomes["read"] > 0 and outcomes["refused"] > 0, outcomes
