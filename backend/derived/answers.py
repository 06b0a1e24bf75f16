"""Cached reads of a run's derived views (one step's detail, the analysis, the stragglers).

Each answer is valid for one ``runs.revision`` (bumped by every write to the run), so its ETag is
(this deployment, the request's path and query, the run, its revision): a poll that sends
``If-None-Match`` while nothing was written gets a 304 at the cost of one indexed lookup, and a
second reader (another page, another tab) of an unchanged run gets the stored bytes. The store is per
process and small (``ANSWERS_KEPT``, least recently used first out); several processes behind one
database each keep their own and answer the same ETags, since the tag depends on no process state.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Final

from fastapi import Request, Response
from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.orm import Session

from bubblescope import __version__
from bubblescope.backend.db.models import Run
from bubblescope.backend.settings import ServiceSettings
from bubblescope.backend.store.touch import RunToucher

ANSWERS_KEPT: Final = 64
ANSWER_HEADER: Final = "X-Bubblescope-Answer"  # "stored" (asked before, or warmed) or "computed" now
CACHE_CONTROL: Final = "no-cache"  # a browser may keep the answer, but asks (If-None-Match) before using it


class AnswerStore:
    """The newest answers by ETag, least recently used first out; safe across threads."""

    def __init__(self, size: int = ANSWERS_KEPT) -> None:
        self.size = size
        self._answers: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, tag: str) -> bytes | None:
        with self._lock:
            body = self._answers.get(tag)
            if body is not None:
                self._answers.move_to_end(tag)
            return body

    def put(self, tag: str, body: bytes) -> None:
        with self._lock:
            self._answers[tag] = body
            self._answers.move_to_end(tag)
            while len(self._answers) > self.size:
                self._answers.popitem(last=False)


def entity_tag(
    settings: ServiceSettings, path: str, query: Iterable[tuple[str, str]], run_id: int, revision: int
) -> str:
    """The ETag of the answer to ``path?query`` for a run at a revision, under these settings (a restart
    with other settings may answer differently)."""
    asked = "&".join(sorted(f"{k}={v}" for k, v in query))
    text = f"{__version__}|{settings!r}|{path}?{asked}|{run_id}|{revision}"
    return '"' + hashlib.sha256(text.encode()).hexdigest()[:32] + '"'


def _matches(request: Request, tag: str) -> bool:
    asked = request.headers.get("if-none-match", "")
    return any(part.strip().removeprefix("W/") == tag for part in asked.split(",")) or asked.strip() == "*"


def cached_answer(request: Request, session: Session, run_key: str, compute: Callable[[], BaseModel]) -> Response:
    """The JSON answer of ``compute`` for run ``run_key``, revalidated and stored per run revision.
    An unknown run: ``compute`` raises its 404 as it would uncached."""
    toucher: RunToucher = request.app.state.run_toucher
    toucher.settle(run_key)  # the revision counts this process's newest batches
    found = session.execute(select(Run.id, Run.revision).where(Run.key == run_key)).one_or_none()
    if found is None:
        return Response(compute().model_dump_json(), media_type="application/json")
    query = request.query_params.multi_items()
    tag = entity_tag(request.app.state.settings, request.url.path, query, found.id, found.revision)
    headers = {"ETag": tag, "Cache-Control": CACHE_CONTROL}
    if _matches(request, tag):
        return Response(status_code=304, headers=headers)
    store: AnswerStore = request.app.state.answers
    body = store.get(tag)
    headers[ANSWER_HEADER] = "stored" if body is not None else "computed"
    if body is None:
        body = compute().model_dump_json().encode()
        store.put(tag, body)
    return Response(body, media_type="application/json", headers=headers)
