"""Each step's own memory peak, read and reset at the step's end in the job's process
(collector/memory.py), and carried by the step's aggregate."""

from __future__ import annotations

import pytest

from bubblescope import wire
from bubblescope.collector.aggregate import step_aggregate
from bubblescope.collector.memory import HostPeak, MemoryProbe, memory_limit_bytes
from bubblescope.collector.recorder import Recorder, StepRecord

MIB = 2**20


def touch(size: int) -> bytearray:
    block = bytearray(size)
    for at in range(0, size, 4096):  # resident, not just reserved
        block[at] = 1
    return block


def test_a_step_reads_its_own_peak_not_the_process_lifetime_peak() -> None:
    records: list[StepRecord] = []
    recorder = Recorder(records.append, lambda _n: None, 100)
    recorder.memory = MemoryProbe()
    recorder.begin_step()
    block = touch(256 * MIB)
    del block
    recorder.end_step()
    recorder.begin_step()
    recorder.end_step()
    big, quiet = (record.memory for record in records)
    assert big is not None and quiet is not None
    assert big[0] is not None and quiet[0] is not None
    assert big[0] - quiet[0] > 200 * MIB  # the second step's peak was reset after the first
    assert big[1:] == (None, None, None)  # no CUDA here
    fields = step_aggregate(records[0])
    assert fields["peak_rss_bytes"] == big[0]
    assert not set(wire.MEMORY_FIELDS[1:]) & set(fields)  # unmeasured readings are not sent


def test_without_a_probe_a_step_carries_no_memory_fields() -> None:
    records: list[StepRecord] = []
    recorder = Recorder(records.append, lambda _n: None, 100)
    recorder.begin_step()
    recorder.end_step()
    assert not set(wire.MEMORY_FIELDS) & set(step_aggregate(records[0]))


def test_a_reader_that_cannot_read_stays_quiet() -> None:
    peak = HostPeak()
    peak.close()
    assert peak.read_and_reset() is None


def test_the_host_limit_is_this_rank_s_share(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    whole = memory_limit_bytes(on_gpu=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    quarter = memory_limit_bytes(on_gpu=False)
    assert whole is not None and quarter is not None and whole > 256 * MIB
    assert abs(quarter - whole // 4) <= 1
