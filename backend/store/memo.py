"""What several requests derive from one run at once, computed once per (run, revision, what) in a
process: a step's aligned spans and per-rank breakdowns, the straggler report (``backend.derived``).

The run page asks for the newest step with spans and for the analysis at the same moment, and both
start from that step's spans: at 1,024 ranks, ~100k of them and about a second of Python each. The
memo holds the newest few results and makes a second request for the same key wait for the first
one's instead of computing it again (a single flight). A revision is bumped by every write to the
run, so an entry never outlives the data it was computed from.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Final, Generic, TypeVar

from sqlalchemy.orm import Session

from bubblescope.backend.db.models import Run

ENTRIES: Final = 2  # per memo; a 1,024-rank step holds ~40 MB of spans in Python; 16,384 ranks, 16 times that

Value = TypeVar("Value")


class SingleFlightMemo(Generic[Value]):
    """The newest ``size`` values by key; concurrent askers of one key share one computation."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, Future[Value]] = OrderedDict()

    def get(self, key: Hashable, compute: Callable[[], Value]) -> Value:
        with self._lock:
            found = self._entries.get(key)
            owner = found is None
            if found is None:
                found = self._entries[key] = Future()
                while len(self._entries) > self.size:
                    self._entries.popitem(last=False)
            else:
                self._entries.move_to_end(key)
        if owner:
            try:
                found.set_result(compute())
            except BaseException as error:  # noqa: BLE001 (every asker, this one too, gets it from result())
                found.set_exception(error)
                with self._lock:
                    if self._entries.get(key) is found:
                        del self._entries[key]
        return found.result()


def run_memo_key(session: Session, run: Run, *what: Hashable) -> tuple[Hashable, ...]:
    """The database (engines of several test apps live in one process), the run as of its revision,
    and what of it (a step, a step range)."""
    return (id(session.get_bind()), run.id, run.key, run.created_at, run.revision, *what)
