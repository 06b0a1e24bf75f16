"""The FastAPI app factory."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.middleware.gzip import GZipMiddleware

from bubblescope import __version__, wire
from bubblescope.backend.analysis.router import router as analysis_router
from bubblescope.backend.capture.router import router as capture_router
from bubblescope.backend.db.engine import build_engine, build_session_factory
from bubblescope.backend.db.migrate import require_current
from bubblescope.backend.errors import install_error_handlers
from bubblescope.backend.ingest.router import router as ingest_router
from bubblescope.backend.plan.router import router as plan_router
from bubblescope.backend.runs.router import router as runs_router
from bubblescope.backend.runs.state import DEFAULT_SILENT_AFTER_S
from bubblescope.backend.stragglers.router import router as stragglers_router
from bubblescope.backend.web.routes import mount_frontend
from bubblescope.backend.web.span_kinds import router as span_kinds_router

FEATURE_ROUTERS = (
    ingest_router,
    runs_router,
    capture_router,
    analysis_router,
    stragglers_router,
    plan_router,
    span_kinds_router,
)


def create_app(db_url: str, silent_after_s: float = DEFAULT_SILENT_AFTER_S) -> FastAPI:
    """Build the service on ``db_url``; refuses a database whose schema is not at head.

    ``silent_after_s``: a run not ended and not heard from for this long is shown as silent."""
    engine = build_engine(db_url)
    require_current(engine, db_url)
    app = FastAPI(
        title="Bubblescope",
        version=__version__,
        description="Where every GPU's time goes in distributed PyTorch training, and what to change.",
        docs_url=None,  # /docs is served with local assets (web.routes)
        redoc_url=None,
    )
    app.state.engine = engine
    app.state.silent_after_s = silent_after_s
    app.state.session_factory = build_session_factory(engine)
    install_error_handlers(app)
    app.add_middleware(GZipMiddleware, minimum_size=4096)
    for router in FEATURE_ROUTERS:
        app.include_router(router)

    @app.get(f"{wire.API_PREFIX}/health", tags=["meta"])
    def health() -> dict[str, str]:
        return {"status": "ok", "version": __version__}

    mount_frontend(app)
    return app
