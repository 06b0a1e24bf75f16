"""Capture-on-request: step ranges the service asked this rank to ship in full.

The service answers every ingest batch with its pending capture requests::

    {"stored_spans": ..., "captures": [{"id": 3, "from_step": 120, "steps": 20}, ...]}

The shipper learns them from there and ships full spans for steps in
``[from_step, from_step + steps)`` on top of the every-N sampling. A request of ``"kind": "profile"``
(``POST /runs/{key}/profile``) asks instead for torch.profiler over those steps (``profile_ranges``, which
``profiling.OnDemandProfiler`` reads). Anything malformed in the answer is ignored: a bad reply can cost a
capture, never the job.
"""

from __future__ import annotations

from typing import Any, NamedTuple, TypeGuard

MAX_WINDOWS = 64
MAX_UPLOAD_RANKS = 64  # a profile's ranks that upload, as read from an answer (the service asks at most 8)
_MAX_STEP = 2**62


class ProfileWindow(NamedTuple):
    """A profile request: steps [first, end); the ranks that upload their traces; its id, which the upload names."""

    first: int
    end: int
    request_id: int
    upload_ranks: frozenset[int]


def _ranks(value: Any) -> frozenset[int]:
    if not isinstance(value, list):
        return frozenset()
    return frozenset(rank for rank in value[:MAX_UPLOAD_RANKS] if _is_count(rank, 0, _MAX_STEP))


def _is_count(value: Any, low: int, high: int) -> TypeGuard[int]:
    return type(value) is int and low <= value <= high  # bool is not a count


class CaptureWindows:
    """The ranges to capture, pruned once this rank has shipped past them (so it stays small).

    Changed on the shipper thread only; ``covers`` is also asked on the training thread (at each
    step's start), so it reads ``ranges``, an immutable snapshot replaced after each change.
    """

    def __init__(self) -> None:
        self._windows: dict[int, tuple[int, int]] = {}  # request id -> [first, end)
        self._profiles: dict[int, ProfileWindow] = {}  # request id -> profile request
        self._shipped_through = -1
        self.ranges: tuple[tuple[int, int], ...] = ()
        self.profile_ranges: tuple[ProfileWindow, ...] = ()

    def learn(self, document: dict[str, Any]) -> None:
        """Take the capture requests from an ingest acknowledgement; ignore whatever is malformed."""
        captures = document.get("captures")
        if not isinstance(captures, list):
            return
        for item in captures[:MAX_WINDOWS]:
            if not isinstance(item, dict):
                continue
            request_id, first, steps = item.get("id"), item.get("from_step"), item.get("steps")
            if not (
                _is_count(request_id, 0, _MAX_STEP)
                and _is_count(first, 0, _MAX_STEP)
                and _is_count(steps, 1, _MAX_STEP)
            ):
                continue
            if first + steps - 1 <= self._shipped_through:  # a rank already past it captures nothing
                continue
            if item.get("kind") == "profile":
                self._profiles[request_id] = ProfileWindow(
                    first, first + steps, request_id, _ranks(item.get("upload_ranks"))
                )
            else:
                self._windows[request_id] = (first, first + steps)
        for windows in (self._windows, self._profiles):  # both end at [1]
            while len(windows) > MAX_WINDOWS:
                del windows[min(windows, key=lambda key: windows[key][1])]
        self.ranges = tuple(self._windows.values())
        self.profile_ranges = tuple(self._profiles.values())

    def covers(self, step: int) -> bool:
        for first, end in self.ranges:  # noqa: SIM110 (a step-start check: a loop costs less than any())
            if first <= step < end:
                return True
        return False

    def shipped_through(self, step: int) -> None:
        """Every step up to ``step`` has been shipped: forget the windows that lie behind it."""
        self._shipped_through = max(self._shipped_through, step)
        for windows in (self._windows, self._profiles):  # both end at [1]
            for request_id in [key for key, window in windows.items() if window[1] <= step + 1]:
                del windows[request_id]
        self.ranges = tuple(self._windows.values())
        self.profile_ranges = tuple(self._profiles.values())

    def __len__(self) -> int:
        return len(self._windows)
