"""The watchdog's reading of what the training thread is blocked in (``Recorder.waiting``)."""

from __future__ import annotations

from bubblescope.collector.recorder import waiting_op


def test_waiting_op_reads_both_forms_and_never_raises() -> None:
    assert waiting_op(None) is None
    blocking = waiting_op(("all_reduce", "grad_norm", "dp", None, 8, 0))
    assert blocking is not None and blocking["kind"] == "all_reduce" and blocking["group"] == "dp"
    pending_recv = (None, [(0, 1, 3, "fwd", 16)], [], [], 0)  # the pipelining integration's entry
    assert waiting_op(("p2p", pending_recv, 5)) == {
        "kind": "recv",
        "name": "fwd",
        "group": "pp",
        "peer": 3,
        "bytes": 16,
        "since_ns": 5,
    }
    send_row = (0, "send", 1, 2, 0, 0, 7, 32, "pp", "bwd")
    assert waiting_op(("p2p", (None, [], [0], [send_row], 1), 9)) == {
        "kind": "send",
        "name": "bwd",
        "group": "pp",
        "peer": 7,
        "bytes": 32,
        "since_ns": 9,
    }
    assert waiting_op(("p2p", "torn", 5)) is None
