"""The dashboard's pages and assets; plotly.js comes from the installed plotly package (offline)."""

from __future__ import annotations

from pathlib import Path

import plotly
from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

import bubblescope.frontend as frontend_package

FRONTEND_DIR = Path(frontend_package.__file__).parent
PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"

router = APIRouter(include_in_schema=False)


@router.get("/")
def runs_page() -> FileResponse:
    return FileResponse(FRONTEND_DIR / "index.html")


@router.get("/runs/{run_key}")
def run_page(run_key: str) -> FileResponse:
    return FileResponse(FRONTEND_DIR / "run.html")


@router.get("/vendor/plotly.min.js")
def plotly_js() -> FileResponse:
    return FileResponse(PLOTLY_JS, media_type="text/javascript", headers={"Cache-Control": "max-age=86400"})


def mount_frontend(app: FastAPI) -> None:
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=FRONTEND_DIR), name="static")
