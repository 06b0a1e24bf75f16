"""The recorder's bounded step buffer, as the hottest wrappers use it (append while there is
room, else ``Recorder.add``): full buffers drop and count, paused ones drop silently."""

from __future__ import annotations

from bubblescope.collector.pipelining import _timed
from bubblescope.collector.recorder import Recorder, StepRecord


def make_recorder(capacity: int) -> tuple[Recorder, list[StepRecord], list[int]]:
    records: list[StepRecord] = []
    dropped: list[int] = []
    return Recorder(records.append, dropped.append, capacity), records, dropped


def test_a_full_step_buffer_drops_and_counts_the_spans_past_its_bound() -> None:
    recorder, records, dropped = make_recorder(3)
    forward = _timed(lambda chunk_id: chunk_id * 2, recorder, 1, "forward")
    recorder.begin_step()
    assert [forward(chunk) for chunk in range(5)] == [0, 2, 4, 6, 8]
    assert recorder.add("optimizer", 1, 2) == -1
    recorder.end_step()
    (record,) = records
    assert [(row[1], row[4], row[5]) for row in record.spans] == [
        ("forward", 1, 0),
        ("forward", 1, 1),
        ("forward", 1, 2),
    ]
    assert sum(dropped) == 3
    assert all(row[2] <= row[3] for row in record.spans) and record.start_ns <= record.spans[0][2]


def test_a_paused_recorder_keeps_nothing_and_counts_no_drop() -> None:
    recorder, records, dropped = make_recorder(100)
    backward = _timed(lambda chunk_id, full_backward=True: chunk_id, recorder, 0, "backward")
    with recorder.paused():
        assert backward(0) == 0 and recorder.add("forward", 1, 2) == -1
    with recorder.step():
        backward(1, full_backward=False)
        backward(2)
    assert dropped == [] and [(row[0], row[1], row[5]) for row in records[0].spans] == [
        (0, "backward_input", 1),
        (0, "backward", 2),
    ]


def test_the_buffer_is_handed_over_at_each_step_end_and_a_late_continuation_is_ignored() -> None:
    recorder, records, _dropped = make_recorder(100)
    with recorder.step():
        index = recorder.add("send", 10, 20, 0, 0, 1, 64, "pp", "fwd")
        first_buffer = recorder.spans
        recorder.repeat_at(index, first_buffer, 30, 40)
    with recorder.step():
        recorder.repeat_at(index, first_buffer, 50, 60)  # that step was handed over already
    assert [len(record.spans) for record in records] == [2, 0]
    assert records[0].spans[1][1:4] == ("send", 30, 40) and records[0].spans[1][7] == 0
    assert [record.step for record in records] == [0, 1]
