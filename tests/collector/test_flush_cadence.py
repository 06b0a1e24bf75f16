"""A big run's collectors flush less often: the service answers each ingest with the interval for the
run's size (world_size / --ingest-batches-per-s, at most 60 s), and the shipper adopts it, never going
below its own configured interval nor taking a nonsensical answer."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bubblescope.collector.config import CollectorConfig
from bubblescope.collector.recorder import StepRecord
from bubblescope.collector.shipper import Shipper, adopted_interval
from bubblescope.collector.spool import Spool
from tests.support import LiveServer, count_rows, migrated_database, register, start_server, wait_until


@pytest.fixture(scope="module")
def slow_cadence_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with migrated_database("sqlite", tmp_path_factory.mktemp("db")) as url:
        live = start_server(url, tmp_path_factory.mktemp("server"), extra_args=["--ingest-batches-per-s", "0.5"])
        yield live
        live.stop()


def record(step: int) -> StepRecord:
    return StepRecord(step, 0, 1000, [(step, "forward", 10, 500, 0, 0, None, None, None, None)])


def test_the_shipper_adopts_the_interval_the_service_gives_for_the_runs_size(
    slow_cadence_server: LiveServer, tmp_path: Path
) -> None:
    with slow_cadence_server.client() as client:
        key = register(client, world_size=2)  # 2 ranks / 0.5 batches a second: every 4 s
    config = CollectorConfig(run_name="cadence", run_key=key, url=slow_cadence_server.url, flush_interval_s=0.2)
    shipper = Shipper(config, rank=0, spool=Spool(tmp_path / "rank0", config.spool_max_bytes))
    shipper.start()
    try:
        shipper.submit(record(0))
        batches = lambda: count_rows(slow_cadence_server.db_url, "ingested_batches", key)
        wait_until(lambda: batches() == 1, 10, "the first batch")
        # the batch is stored before the service answers and the shipper reads the answer: wait for that too
        wait_until(lambda: shipper._interval == 4.0, 10, "the interval the service gave")
        for step in range(1, 8):  # 1.4 s of steps: at 0.2 s they would have gone in 7 flushes
            shipper.submit(record(step))
            time.sleep(0.2)
        assert batches() == 1
        wait_until(lambda: batches() == 2, 10, "the next flush, 4 s after the first")
    finally:
        shipper.stop(timeout_s=5.0)


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ({"flush_interval_s": 8.0}, 8.0),
        ({"flush_interval_s": 0.5}, 2.0),  # never below the configured interval
        ({"flush_interval_s": 1e9}, 60.0),  # capped
        ({"flush_interval_s": math.nan}, 2.0),
        ({"flush_interval_s": True}, 2.0),
        ({"flush_interval_s": "8"}, 2.0),
        ({}, 2.0),  # an older service says nothing
        ([], 2.0),
    ],
)
def test_a_nonsensical_answer_leaves_the_configured_interval(answer: object, expected: float) -> None:
    assert adopted_interval(2.0, answer) == expected
