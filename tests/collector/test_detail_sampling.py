"""Steps recorded in full detail only when they travel in full.

A real 2-rank 1F1B job (``torch.multiprocessing``, gloo, CPU) records into a real Recorder whose
detail policy says "every 3rd step". On those steps the pipelining integration's tagging getters
are in place and every P2P span carries its stage, micro-batch and direction; on the others the
getters are the stage's own methods and the P2P spans are there with their kind, peer, bytes and
times (all the step's aggregate needs) but untagged. And the shipper never ships a step recorded
without detail in full, even one a capture window covers.
"""

from __future__ import annotations

import gzip
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from bubblescope.collector import pipelining
from bubblescope.collector.recorder import Recorder, StepRecord
from tests.collector.test_shipper_inbox import shipper_for, spooled_steps
from tests.support import free_port

STEPS = 7
MICROBATCHES = 4
DETAILED_EVERY = 3
P2P_KINDS = ("send", "recv")


def _rank_main(rank: int, world: int, port: int, out_dir: str) -> None:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        records: list[StepRecord] = []
        recorder = Recorder(records.append, lambda _n: None, 10_000, lambda step: step % DETAILED_EVERY == 0)
        torch.manual_seed(rank)
        stage = PipelineStage(nn.Linear(16, 16), stage_index=rank, num_stages=world, device=torch.device("cpu"))
        schedule = Schedule1F1B(stage, n_microbatches=MICROBATCHES, loss_fn=nn.functional.mse_loss)
        pipelining.instrument_schedule(schedule, recorder)
        getter = "get_fwd_send_ops" if rank == 0 else "get_bwd_send_ops"  # a wrapped getter of each rank
        tagging_in_place = []
        for _ in range(STEPS):
            inputs, targets = torch.randn(8, 16), torch.randn(8, 16)
            with recorder.step():
                tagging_in_place.append(getter in vars(stage))
                schedule.step(inputs) if rank == 0 else schedule.step(target=targets)
        pipelining.detach()
        document = {
            "tagging_in_place": tagging_in_place,
            "records": [
                {
                    "step": r.step,
                    "detailed": r.detailed,
                    "spans": [[row[1], row[4], row[5], row[6], row[7], row[9]] for row in r.spans],
                }
                for r in records
            ],
        }
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(document))
    finally:
        dist.destroy_process_group()


def run_job(tmp_path: Path) -> dict[int, dict[str, Any]]:
    mp.spawn(_rank_main, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    return {rank: json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)}


def p2p_spans(record: dict[str, Any]) -> list[list[Any]]:
    return [span for span in record["spans"] if span[0] in P2P_KINDS]


@pytest.mark.slow  # a 2-rank pipeline job (torch.multiprocessing, gloo)
def test_only_steps_that_travel_in_full_tag_their_p2p_spans_and_the_others_still_time_them(tmp_path: Path) -> None:
    expected = [step % DETAILED_EVERY == 0 for step in range(STEPS)]
    for rank, document in run_job(tmp_path).items():
        assert document["tagging_in_place"] == expected, rank
        records = document["records"]
        assert [r["detailed"] for r in records] == expected, rank
        peer = 1 - rank
        for record in records:
            p2p = p2p_spans(record)
            # kind, stage, micro-batch, peer, bytes, direction (a blocked send's continuation: 0 bytes)
            assert p2p and all(span[3] == peer and span[4] >= 0 for span in p2p), (rank, record["step"])
            if record["detailed"]:
                assert all(
                    span[1] == rank and span[2] in range(MICROBATCHES) and span[5] in ("fwd", "bwd") for span in p2p
                ), (rank, record["step"], p2p)
            else:
                assert all(span[1] is None and span[2] is None and span[5] is None for span in p2p), p2p
            computed = sorted(
                (span[0], span[1], span[2]) for span in record["spans"] if span[0] != "recv" and span[0] != "send"
            )
            assert computed == sorted(
                (kind, rank, mb) for kind in ("forward", "backward") for mb in range(MICROBATCHES)
            ), (rank, record["step"])
        # After step 0 (shape inference exchanges), every step has the same transfers, tagged or not
        # (continuations of blocked sends come and go with the timing).
        shapes = {tuple(sorted(Counter((s[0], s[3], s[4]) for s in p2p_spans(r) if s[4]).items())) for r in records[1:]}
        assert len(shapes) == 1, (rank, shapes)
        received = Counter(span[5] for span in p2p_spans(records[DETAILED_EVERY]) if span[0] == "recv")
        assert received == Counter({"bwd" if rank == 0 else "fwd": MICROBATCHES}), received


def test_a_step_recorded_without_detail_never_travels_in_full(tmp_path: Path) -> None:
    shipper = shipper_for(tmp_path, full_spans_every=2, flush_interval_s=60.0)
    rows = [(step, "recv", 10, 20, None, None, 1, 64, "pp", None) for step in range(4)]
    for step in range(4):
        # step 2 is due in full but was recorded lean (a capture learned after it started)
        shipper.submit(StepRecord(step, 0, 30, [rows[step]], detailed=step != 2))
    shipper.start()
    shipper.stop(timeout_s=2.0)
    (batch,) = [json.loads(gzip.decompress(message.body)) for _, message in shipper.spool.pending()]
    assert spooled_steps(shipper) == [0, 1, 2, 3]
    assert [step["comm_ns"] for step in batch["steps"]] == [10, 10, 10, 10]
    assert batch["spans"]["step"] == [0]


def test_listeners_hear_the_detail_decision_only_when_it_changes_and_without_them_every_step_is_complete() -> None:
    records: list[StepRecord] = []
    decisions: list[bool] = []
    recorder = Recorder(records.append, lambda _n: None, 100, lambda step: step in (0, 3, 4))
    for _ in range(2):
        with recorder.step():
            pass
    assert [r.detailed for r in records] == [True, True]  # no listener: nothing is recorded differently
    recorder.add_detail_listener(decisions.append)
    assert decisions == [True]  # told the current state at once
    for _ in range(4):
        with recorder.step():
            pass
    assert decisions == [True, False, True, False]  # steps 2 (lean), 3-4 (detailed), 5 (lean)
    assert [r.detailed for r in records] == [True, True, False, True, True, False]
