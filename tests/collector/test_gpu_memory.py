"""The CUDA allocator's per-step peaks (collector/memory.py): each step reads its own peak allocated
and reserved bytes and allocation retries, then resets them. Skips where no GPU is present (CI)."""

from __future__ import annotations

import gc

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU on this machine")
MIB = 2**20


def test_a_step_reads_the_allocator_s_own_peak_and_the_next_step_starts_afresh() -> None:
    from bubblescope.collector.aggregate import step_aggregate
    from bubblescope.collector.memory import CudaPeak, MemoryProbe, memory_limit_bytes
    from bubblescope.collector.recorder import Recorder, StepRecord

    records: list[StepRecord] = []
    recorder = Recorder(records.append, lambda _n: None, 100)
    probe = MemoryProbe()
    probe.gpu = CudaPeak()
    recorder.memory = probe
    gc.collect()  # tensors of earlier tests in this process are freed; what stays live is the baseline
    baseline = torch.cuda.memory_allocated()
    recorder.begin_step()
    block = torch.empty(512 * MIB, dtype=torch.uint8, device="cuda")
    del block
    recorder.end_step()
    recorder.begin_step()
    small = torch.empty(MIB, dtype=torch.uint8, device="cuda")
    recorder.end_step()
    big, quiet = (record.memory for record in records)
    assert big is not None and quiet is not None
    _rss, allocated, reserved, retries = big
    assert allocated is not None and reserved is not None and retries is not None
    assert allocated >= baseline + 512 * MIB and reserved >= allocated and retries >= 0
    # reset after the first step: the block was freed, so the second step's peak is the baseline and its 1 MiB
    assert quiet[1] is not None and quiet[1] < baseline + 64 * MIB, (quiet, baseline)
    fields = step_aggregate(records[0])
    assert fields["gpu_peak_allocated_bytes"] == allocated and fields["gpu_peak_reserved_bytes"] == reserved
    limit = memory_limit_bytes(on_gpu=True)
    assert limit == torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    del small
