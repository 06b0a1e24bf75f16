"""A real NCCL Flight Recorder dump, from an H100 (torch 2.11, NCCL 2.28.9; ``bench/gpu_fr_dump.py`` in the README's GPU
checks): three all-reduces and a broadcast in a world of one, dumped as the pickle and the JSON torch writes.

Its pickle was written before NCCL's watchdog had noted the completions in ``pg_status`` (last completed -1, and -1
started, since starts are tracked only with ``TORCH_NCCL_ENABLE_TIMING``) while every entry says "completed"; the
JSON, dumped a moment later, says 4. Both must read as four collectives completed."""

from __future__ import annotations

from pathlib import Path

import pytest

from bubblescope.analysis import flight_recorder_report
from bubblescope.fr_dump import parse_dump

DUMPS = Path(__file__).parent / "data" / "h100_nccl"


@pytest.mark.parametrize("name", ["nccl_trace_rank_0.pkl", "nccl_trace_rank_0.json"])
def test_an_nccl_dump_whose_status_lags_its_entries_reads_as_completed(name: str) -> None:
    path = DUMPS / name
    dump = parse_dump(path.read_bytes(), path.name)
    assert dump.rank == 0
    report = flight_recorder_report([dump])
    (group,) = report.groups
    (progress,) = group.progress
    assert (progress.last_enqueued, progress.last_started, progress.last_completed) == (4, 4, 4), progress
    assert progress.blocked_in is None and group.wavefront is None and group.mismatches == []
