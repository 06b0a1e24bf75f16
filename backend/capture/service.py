"""Capture-on-request: "ship the full spans of the next K steps", on every rank alike.

Ranks learn of a request only from the answer to their next ingest batch, so the service picks
a ``from_step`` that no rank has shipped yet when it learns, and every rank captures the same
step numbers. The rule::

    from_step = S + 1 + 3 * B

- ``S``: the highest step of the run ingested so far (any rank); -1 when none.
- ``B``: the most steps any rank put in one of its last ``RECENT_BATCHES`` batches. A rank ships
  one batch per flush interval, so ``B`` is "steps per flush interval", measured (it already
  folds in the rank's steps/s, its flush interval and its batch-size cut-offs, which the service
  does not otherwise know).

Why three intervals: when the request is stored, a rank may have one batch under way that the
service has not stored yet (up to ``B`` steps past ``S``) and that misses the request; the answer
to its next batch (``B`` further steps) carries it. Every step after ``S + 2B`` is therefore
still unshipped, on every rank, when that rank learns of the request. The third interval is for
the steps a rank runs while that answer is on its way: the collector decides at each step's
start whether to record it in full detail, so a captured step must not have started yet when
its rank learns of the request (an answer taking up to one flush interval is covered; a step
that started earlier travels as its aggregate only). A rank that is behind
(a straggler) simply reaches the range later. A rank that is further ahead than this (its
batches were spooled while the service was down) captures what remains of the range.
"""

from __future__ import annotations

import math
from datetime import timedelta

from sqlalchemy.orm import Session

from bubblescope.backend.capture import queries
from bubblescope.backend.capture.schemas import MAX_PROFILE_UPLOADS, CaptureRequestIn, ProfileRequestIn
from bubblescope.backend.db.models import CaptureRequest
from bubblescope.backend.db.timestamps import as_utc
from bubblescope.backend.errors import Invalid, NotFound, TooMany
from bubblescope.backend.fields import STEP_MAX
from bubblescope.backend.settings import ServiceSettings
from bubblescope.backend.store import runs as run_queries, steps as step_queries
from bubblescope.backend.store.captures import CaptureOut, pending_captures

HOUR = timedelta(hours=1)


def choose_from_step(last_step: int | None, steps_per_batch: int) -> int:
    """The rule of this module's docstring; ``last_step`` None when nothing was ingested yet."""
    highest = -1 if last_step is None else last_step
    return highest + 1 + 3 * max(0, steps_per_batch)


def request_capture(
    session: Session,
    key: str,
    body: CaptureRequestIn | ProfileRequestIn,
    settings: ServiceSettings,
    kind: str = "spans",
) -> tuple[CaptureOut, bool]:
    """Store a capture request for run ``key`` (404 when unknown) with ``from_step`` by the rule;
    ``(request, True)`` when it is new.

    Bounded per run, since each one makes every rank of a running job ship full detail (or profile): a request
    made while another of its ``kind`` has not begun on any rank is that one (``(request, False)``, nothing
    stored); beyond ``settings.captures_per_hour`` requests of either kind in the last hour, 429 with
    ``Retry-After``."""
    run = run_queries.lock_run(session, key)  # one request at a time per run
    if run is None:
        raise NotFound("run_key", f"no run with key {key!r}")
    uploads = upload_ranks(body, run.world_size) if isinstance(body, ProfileRequestIn) else None
    newest = step_queries.newest_step(session, run.id)
    shipped = -1 if newest is None else newest
    waiting = [
        request
        for request in pending_captures(session, run.id, shipped)
        if request.from_step > shipped and request.kind == kind
    ]
    if waiting:
        return waiting[-1], False
    now = run_queries.database_now(session)
    count, oldest = queries.requests_since(session, run.id, now - HOUR)
    if count >= settings.captures_per_hour and oldest is not None:
        wait_s = math.ceil((as_utc(oldest) + HOUR - as_utc(now)).total_seconds())
        raise TooMany(
            "run_key",
            f"run {key!r} had {count} capture requests in the last hour, the limit (serve --captures-per-hour); "
            f"retry in {wait_s} s",
            wait_s,
        )
    first = choose_from_step(newest, queries.steps_per_batch(session, run.id))
    if first + body.steps - 1 > STEP_MAX:
        raise Invalid("steps", f"steps {first}-{first + body.steps - 1} would pass the largest step, {STEP_MAX}")
    request = CaptureRequest(run_id=run.id, from_step=first, steps=body.steps, kind=kind, upload_ranks=uploads)
    session.add(request)
    session.flush()
    return CaptureOut(request.id, request.steps, request.from_step, kind, uploads), True


def upload_ranks(body: ProfileRequestIn, world_size: int) -> list[int]:
    """The ranks of a profile that upload their traces: those asked for (each in the run: 422 naming
    ``upload_ranks`` otherwise), else the first ``MAX_PROFILE_UPLOADS``."""
    if body.upload_ranks is None:
        return list(range(min(world_size, MAX_PROFILE_UPLOADS)))
    outside = sorted(rank for rank in set(body.upload_ranks) if rank >= world_size)
    if outside:
        raise Invalid("upload_ranks", f"ranks {outside} are not in this run of {world_size} ranks")
    return sorted(set(body.upload_ranks))
