"""Answers a run page will ask for, computed before anyone asks, once the run has gone quiet.

The on-call engineer opens the page of a run that failed, hung or finished: its data no longer changes.
Every ``WARM_EVERY_S`` the leader looks at the runs heard from in the last ``RECENT`` whose revision has
not moved since its last look, and stores the step the page opens on (the run answer's ``default_step``),
their default analysis and stragglers (as the page asks for them) under the ETags a request would get
(``derived.answers``), so the first visit reads stored answers.
A run still receiving batches is left alone: its revision moves, and the page computes what it shows.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Final

from fastapi import FastAPI
from pydantic import BaseModel
from sqlalchemy.orm import Session, sessionmaker

from bubblescope import wire
from bubblescope.backend.analysis.service import run_analysis
from bubblescope.backend.background import PeriodicTask
from bubblescope.backend.db.engine import transaction
from bubblescope.backend.derived.answers import AnswerStore, entity_tag
from bubblescope.backend.errors import DomainError
from bubblescope.backend.runs.service import run_detail, step_detail
from bubblescope.backend.settings import ServiceSettings
from bubblescope.backend.store import runs as run_queries
from bubblescope.backend.stragglers.service import straggler_view

WARM_TASK: Final = "warm-views"
WARM_EVERY_S: Final = 5.0
RECENT: Final = timedelta(hours=6)
PAGE_STRAGGLER_QUERY: Final = (
    ("phases", "compute"),
    ("compact", "true"),
)  # frontend/api.js asks the stragglers for this
PAGE_BREAKDOWN_ROWS: Final = 1024  # frontend/api.js' BREAKDOWN_ROWS: a step's breakdown_limit
PAGE_RANK_ROWS: Final = 1024  # frontend/api.js' RANK_ROWS: the run's ranks_limit


class ViewWarmer:
    def __init__(self, session_factory: sessionmaker[Session], settings: ServiceSettings, store: AnswerStore) -> None:
        self.session_factory = session_factory
        self.settings = settings
        self.store = store
        self.seen: dict[int, int] = {}  # run id -> revision at the last look
        self.warmed: dict[int, int] = {}  # run id -> revision warmed

    def run_round(self) -> None:
        with transaction(self.session_factory) as session:
            now = run_queries.database_now(session)
            runs = [(r.id, r.key, r.revision) for r in run_queries.runs_heard_since(session, now - RECENT)]
        quiet = [(i, k, rev) for i, k, rev in runs if self.seen.get(i) == rev and self.warmed.get(i) != rev]
        self.seen = {i: rev for i, _, rev in runs}
        for run_id, key, revision in quiet:
            self._warm(run_id, key, revision)
            self.warmed[run_id] = revision
        self.warmed = {i: rev for i, rev in self.warmed.items() if i in self.seen}

    def _warm(self, run_id: int, key: str, revision: int) -> None:
        base = f"{wire.API_PREFIX}/runs/{key}"
        try:
            with transaction(self.session_factory) as session:
                step = run_detail(session, key, self.settings.silent_after_s, PAGE_RANK_ROWS).default_step
        except DomainError:
            return  # deleted since the look
        views: list[tuple[str, tuple[tuple[str, str], ...], Callable[[Session], BaseModel]]] = [
            (f"{base}/analysis", (), lambda s: run_analysis(s, key, None, None)),
            (
                f"{base}/stragglers",
                PAGE_STRAGGLER_QUERY,
                lambda s: straggler_view(s, key, None, None, ("compute",), compact=True),
            ),
        ]
        if step is not None:
            limit = (("breakdown_limit", str(PAGE_BREAKDOWN_ROWS)),)
            views.insert(
                0, (f"{base}/steps/{step}", limit, lambda s: step_detail(s, key, step, None, PAGE_BREAKDOWN_ROWS))
            )
        for path, query, compute in views:
            tag = entity_tag(self.settings, path, query, run_id, revision)
            if self.store.get(tag) is not None:
                continue
            try:
                with transaction(self.session_factory) as session:
                    body = compute(session).model_dump_json().encode()
            except DomainError:
                continue  # nothing to analyse yet (no step with spans): the page says so itself
            self.store.put(tag, body)


def install_view_warmer(app: FastAPI) -> None:
    warmer = ViewWarmer(app.state.session_factory, app.state.settings, app.state.answers)
    app.state.background.add(PeriodicTask(WARM_TASK, WARM_EVERY_S, warmer.run_round))
