"""Clock-offset rounds between every rank and rank 0, safe when some rank never takes part.

A round is a store handshake, then timed ping-pongs over the default process group
(``clock.ping_rank0`` / ``clock.answer_pings``). The handshake uses the job's c10d store with
timeouts, so a rank whose collector is disabled or never initialised costs the others at most
one timeout, once: rank 0 stops waiting for a rank that missed a round (and only checks, without
waiting, in later rounds), and a rank whose rank 0 never answered stops trying.

Rounds run at start (``round_id`` 0) and then every ``every_steps`` steps, between steps, on
every rank at the same step number, so the ranks meet without further coordination.
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

from bubblescope.collector.clock import ClockOffset, answer_pings, ping_rank0

log = logging.getLogger("bubblescope.collector")

START_ROUNDS = 16
PERIODIC_ROUNDS = 8


class ClockSync:
    def __init__(self, dist: Any, run_key: str, first_timeout_s: float = 10.0, later_timeout_s: float = 2.0) -> None:
        self._dist = dist
        self._store = dist.distributed_c10d._get_default_store()
        self._prefix = f"bubblescope/{run_key}/clock"
        self._first_timeout = datetime.timedelta(seconds=first_timeout_s)
        self._later_timeout = datetime.timedelta(seconds=later_timeout_s)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self._absent: set[int] = set()  # ranks (or rank 0, seen from a rank) that missed a round
        self.rounds_done = 0

    @property
    def active(self) -> bool:
        return self.world > 1 and not (self.rank != 0 and 0 in self._absent)

    def run_round(self, round_id: int) -> ClockOffset | None:
        """One round; this rank's offset to rank 0, or None when it could not take part."""
        if self.world == 1:
            return ClockOffset(0, 0)
        if not self.active:
            return None
        pings = START_ROUNDS if round_id == 0 else PERIODIC_ROUNDS
        timeout = self._first_timeout if round_id == 0 else self._later_timeout
        key = f"{self._prefix}/{round_id}"
        if self.rank == 0:
            for peer in range(1, self.world):
                if self._peer_ready(f"{key}/ready/{peer}", peer, timeout):
                    self._store.set(f"{key}/go/{peer}", "1")
                    answer_pings(self._dist, peer, pings)
            self.rounds_done += 1
            return ClockOffset(0, 0)
        self._store.set(f"{key}/ready/{self.rank}", "1")
        try:
            self._store.wait([f"{key}/go/{self.rank}"], timeout)
        except Exception:  # noqa: BLE001 - rank 0 never answered: stop trying
            self._absent.add(0)
            log.warning("bubblescope: rank 0 did not join clock round %d; keeping the last offset", round_id)
            return None
        self.rounds_done += 1
        return ping_rank0(self._dist, pings)

    def _peer_ready(self, key: str, peer: int, timeout: datetime.timedelta) -> bool:
        if peer in self._absent:
            if self._store.check([key]):
                self._absent.discard(peer)
                return True
            return False
        try:
            self._store.wait([key], timeout)
            return True
        except Exception:  # noqa: BLE001
            self._absent.add(peer)
            log.warning("bubblescope: rank %d did not join clock round (collector not initialised?)", peer)
            return False
