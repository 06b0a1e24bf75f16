"""The shipper's inbox: a step costs the training thread an append, and wakes the shipper thread
only when a batch's worth of spans waits; otherwise the shipper flushes on its own clock, whether
steps come or not; full inbox drops and counts. A real Shipper, spooling to a real directory."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

from bubblescope.collector.config import CollectorConfig
from bubblescope.collector.recorder import StepRecord
from bubblescope.collector.shipper import Shipper
from bubblescope.collector.spool import Spool
from bubblescope.collector.transport import Message
from bubblescope.wire import MAX_BATCH_STEPS, encode_batch

LIMITS = ("max_batch_spans", "queue_steps", "max_attempts")  # the shipper's own, not user settings


def shipper_for(tmp_path: Path, **settings: float) -> Shipper:
    limits = {name: int(settings.pop(name)) for name in LIMITS if name in settings}
    config = CollectorConfig(run_name="inbox", run_key="inbox-run", spool_dir=tmp_path, **settings)  # type: ignore[arg-type]
    return Shipper(config, rank=0, spool=Spool(tmp_path / "rank0", config.spool_max_bytes), **limits)


def record(step: int, spans: int) -> StepRecord:
    rows = [(step, "forward", 10 * i, 10 * i + 5, 0, i, None, None, None, None) for i in range(spans)]
    return StepRecord(step, 0, 10 * spans, rows)


def spooled_steps(shipper: Shipper) -> list[int]:
    return [
        step["step"]
        for _, message in shipper.spool.pending()
        for step in json.loads(gzip.decompress(message.body))["steps"]
    ]


def test_steps_never_wake_the_shipper_for_time_it_flushes_on_its_own_clock(tmp_path: Path) -> None:
    shipper = shipper_for(tmp_path, flush_interval_s=0.3)
    for step in range(5):
        shipper.submit(record(step, 3))
    time.sleep(0.35)  # past the due time
    shipper.submit(record(5, 3))
    assert not shipper._wake.is_set()  # a step's end never sets it for time (thread not started: no race)
    shipper.start()
    try:
        deadline = time.monotonic() + 2.0  # no further submit: the shipper's own clock flushes
        while len(spooled_steps(shipper)) < 6 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert spooled_steps(shipper) == list(range(6))
    finally:
        shipper.stop(timeout_s=2.0)


def test_a_batch_worth_of_spans_wakes_the_shipper_before_the_interval(tmp_path: Path) -> None:
    shipper = shipper_for(tmp_path, flush_interval_s=60.0, max_batch_spans=10)
    shipper.submit(record(0, 4))
    shipper.submit(record(1, 4))
    assert not shipper._wake.is_set()
    shipper.submit(record(2, 4))  # 12 spans waiting >= 10
    assert shipper._wake.is_set()


def test_a_full_inbox_drops_steps_and_counts_their_spans(tmp_path: Path) -> None:
    shipper = shipper_for(tmp_path, queue_steps=3)
    for step in range(5):
        shipper.submit(record(step, 4))
    assert len(shipper._inbox) == 3 and shipper.dropped_spans == 8


def test_steps_are_flushed_when_the_loop_stops_submitting_and_all_arrive_in_order(tmp_path: Path) -> None:
    shipper = shipper_for(tmp_path, flush_interval_s=0.1)
    shipper.start()
    try:
        for step in range(3):
            shipper.submit(record(step, 2))
        deadline = time.monotonic() + 2.0  # no further submit: the wait's timeout must flush them
        while not spooled_steps(shipper) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert spooled_steps(shipper) == [0, 1, 2]
        for step in range(3, 60):  # >= 0.3 s: at least two flushes fall due meanwhile
            shipper.submit(record(step, 2))
            time.sleep(0.005)
    finally:
        shipper.stop(timeout_s=2.0)
    assert spooled_steps(shipper) == list(range(60))
    assert len(list(shipper.spool.pending())) >= 3  # flushed per interval, not in one batch at stop


def test_a_full_inbox_still_takes_the_ranks_end_after_the_steps_it_holds(tmp_path: Path) -> None:
    shipper = shipper_for(tmp_path, queue_steps=3, flush_interval_s=60.0)
    for step in range(5):  # two of them dropped: the inbox is full
        shipper.submit(record(step, 2))
    registration = Message("PUT", "/api/v1/runs/inbox-run/ranks/0", encode_batch({"host": "h", "pid": 1}))
    end = Message("PUT", "/api/v1/runs/inbox-run/ranks/0/end", encode_batch({"outcome": "finished"}))
    shipper.submit_message(registration)  # an ordinary registration is dropped past a full inbox
    shipper.submit_message(end, past_a_full_inbox=True)
    shipper.start()
    shipper.stop(timeout_s=2.0)
    spooled = [message for _, message in shipper.spool.pending()]
    assert [m.path for m in spooled] == ["/api/v1/ingest", "/api/v1/runs/inbox-run/ranks/0/end"]  # steps, then end
    assert [s["step"] for s in json.loads(gzip.decompress(spooled[0].body))["steps"]] == [0, 1, 2]
    assert shipper.dropped_spans == 4


def test_a_batch_never_holds_more_steps_than_the_service_takes(tmp_path: Path) -> None:
    """Fast steps with few spans under a long flush interval: the shipper cuts a batch at
    wire.MAX_BATCH_STEPS, which the service's --max-batch-steps refuses past by default (a 413 would
    drop the batch, aggregates included)."""
    steps = MAX_BATCH_STEPS + 5
    shipper = shipper_for(tmp_path, flush_interval_s=3600.0, queue_steps=steps + 10)
    for step in range(steps):
        shipper.submit(record(step, 0))
    shipper.start()
    shipper.stop(timeout_s=30.0)
    sizes = [len(json.loads(gzip.decompress(message.body))["steps"]) for _, message in shipper.spool.pending()]
    assert sum(sizes) == steps and max(sizes) <= MAX_BATCH_STEPS, sizes


def test_a_restarted_process_never_reuses_its_predecessors_seqs(tmp_path: Path) -> None:
    """A worker restarted under the same run key (torchrun --max-restarts) starts its batch seqs past
    every seq its predecessor could have sent by then, so the service does not drop them as retries."""
    first = shipper_for(tmp_path / "first")
    sent_by_first = [first._batch([], {})["seq"] for _ in range(1000)]
    time.sleep(0.002)  # a restart takes seconds; 2 ms is enough for the clock to move past 1,000 batches
    restarted = shipper_for(tmp_path / "restarted")
    sent_by_restarted = [restarted._batch([], {})["seq"] for _ in range(3)]
    assert sent_by_first == list(range(sent_by_first[0], sent_by_first[0] + 1000))
    assert min(sent_by_restarted) > max(sent_by_first)
