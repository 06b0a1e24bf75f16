"""Faults the demo job can inject into a rank (or several), to see the alerts an on-call engineer would get.

``--inject raise`` (an uncaught exception), ``kill`` (SIGKILL, as the out-of-memory killer does),
``hang-pipeline`` (stuck before its pipeline step: its peers wait in a P2P recv),
``hang-collective`` (stuck before the gradient-norm all-reduce: the others wait in it), ``slow``
(every step from then on longer by ``--inject-seconds``, inside its data loading: a straggler).
Only in a worker's first attempt (``TORCHELASTIC_RESTART_COUNT`` 0), so a job launched with
``torchrun --max-restarts 1`` recovers, and the alert resolves.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from dataclasses import dataclass

INJECTIONS = ("raise", "kill", "hang-pipeline", "hang-collective", "slow")
FOREVER_S = 24 * 3600.0


def add_fault_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--inject", choices=INJECTIONS, default=None, help="a fault in one rank (docs/alerts.md)")
    parser.add_argument(
        "--inject-rank",
        type=_ranks,
        default=None,
        metavar="RANK[,RANK...]",
        help="the faulty rank, or several comma-separated (default: the last)",
    )
    parser.add_argument("--inject-step", type=int, default=5, help="the step it starts at (default: %(default)s)")
    parser.add_argument(
        "--inject-seconds",
        type=float,
        default=None,
        help="a hang's length (default: a day) or a slow rank's extra seconds per step (default: 0.2)",
    )


def _ranks(text: str) -> tuple[int, ...]:
    try:
        ranks = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a rank or a comma-separated list of ranks") from None
    if any(rank < 0 for rank in ranks):
        raise argparse.ArgumentTypeError(f"{text!r}: ranks are 0 or more")
    return ranks


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int
    seconds: float

    @classmethod
    def for_rank(cls, args: argparse.Namespace, rank: int, world: int) -> Fault | None:
        """This rank's fault, or None (none asked, another rank's, or a restarted attempt)."""
        targets = args.inject_rank if args.inject_rank is not None else (world - 1,)
        if args.inject is None or rank not in targets or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
            return None
        default = 0.2 if args.inject == "slow" else FOREVER_S
        return cls(args.inject, args.inject_step, args.inject_seconds if args.inject_seconds is not None else default)

    def announce(self) -> None:
        """One line on stderr with the fault's wall-clock time (benches measure detection from it)."""
        print(f"bubblescope-demo: injected {self.kind} at step {self.step} at {time.time():.3f}", file=sys.stderr)
        sys.stderr.flush()

    def in_data_loading(self, step: int) -> None:
        if self.kind == "slow" and step >= self.step:
            if step == self.step:
                self.announce()
            time.sleep(self.seconds)

    def before_pipeline(self, step: int) -> None:
        if step != self.step or self.kind not in ("raise", "kill", "hang-pipeline"):
            return
        self.announce()
        if self.kind == "raise":
            raise RuntimeError(f"injected failure at step {step}")
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.kind == "hang-pipeline":
            time.sleep(self.seconds)

    def before_collective(self, step: int) -> None:
        if self.kind == "hang-collective" and step == self.step:
            self.announce()
            time.sleep(self.seconds)
