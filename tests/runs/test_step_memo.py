"""The step memo: concurrent askers of one key share one computation; a failure reaches every asker
and is not kept; the newest entries stay, the oldest go."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from bubblescope.backend.store.memo import SingleFlightMemo


def test_concurrent_askers_of_one_key_share_one_computation() -> None:
    memo: SingleFlightMemo[int] = SingleFlightMemo(2)
    started, release = threading.Event(), threading.Event()
    calls: list[str] = []

    def slow() -> int:
        calls.append("computed")
        started.set()
        assert release.wait(10)
        return 42

    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(memo.get, "step 10", slow)
        assert started.wait(10)
        others = [pool.submit(memo.get, "step 10", slow) for _ in range(3)]
        release.set()
        assert [f.result(10) for f in (first, *others)] == [42] * 4
    assert calls == ["computed"]


def test_a_failure_reaches_every_asker_and_the_next_ask_computes_again() -> None:
    memo: SingleFlightMemo[int] = SingleFlightMemo(2)

    def broken() -> int:
        raise RuntimeError("database gone")

    with pytest.raises(RuntimeError, match="database gone"):
        memo.get("k", broken)
    assert memo.get("k", lambda: 7) == 7


def test_the_oldest_entry_is_dropped_past_the_size() -> None:
    memo: SingleFlightMemo[str] = SingleFlightMemo(2)
    memo.get("a", lambda: "a1")
    memo.get("b", lambda: "b1")
    memo.get("a", lambda: "a2")  # a is now the newest
    memo.get("c", lambda: "c1")  # b goes
    assert memo.get("a", lambda: "a3") == "a1"
    assert memo.get("b", lambda: "b2") == "b2"
