"""The dashboard's pages and assets, and the API docs page. Third-party assets come from installed
packages, so every page works offline: plotly.js from plotly, Swagger UI from swagger-ui-py."""

from __future__ import annotations

import gzip
import importlib.util
from functools import lru_cache
from pathlib import Path

import plotly
from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

import bubblescope.frontend as frontend_package
from bubblescope.backend.errors import ApiError, wants_page

FRONTEND_DIR = Path(frontend_package.__file__).parent


def _package_dir(name: str) -> Path:
    """An installed package's folder, found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    return Path(next(iter(spec.submodule_search_locations)))


SWAGGER_UI_DIR = _package_dir("swagger_ui") / "static"
VENDOR_FILES = {  # name under /vendor -> (file, media type)
    "plotly.min.js": (Path(plotly.__file__).parent / "package_data" / "plotly.min.js", "text/javascript"),
    "swagger-ui-bundle.js": (SWAGGER_UI_DIR / "swagger-ui-bundle.js", "text/javascript"),
    "swagger-ui.css": (SWAGGER_UI_DIR / "swagger-ui.css", "text/css"),
}

router = APIRouter(include_in_schema=False)


@router.get("/")
def runs_page() -> FileResponse:
    return FileResponse(FRONTEND_DIR / "index.html")


@router.get("/runs")
def runs_alias(request: Request) -> Response:
    """``/runs`` as people type it: a browser gets the run list; an API client the path it meant."""
    if wants_page(request):
        return RedirectResponse("/", status_code=307)
    raise ApiError(404, ("path",), "no such path: /runs; the run list is GET /api/v1/runs", "not_found")


@router.get("/runs/{run_key}")
def run_page(run_key: str) -> FileResponse:
    return FileResponse(FRONTEND_DIR / "run.html")


@router.get("/compare")
def compare_page() -> FileResponse:
    """Two runs side by side (?a=KEY&b=KEY): before and after a fix."""
    return FileResponse(FRONTEND_DIR / "compare.html")


@router.get("/signin")
def signin_page() -> FileResponse:
    """Where the dashboard sends a browser the API answered 401 (serve --auth; docs/access.md)."""
    return FileResponse(FRONTEND_DIR / "signin.html")


NEEDS_SCRIPT_PAGE = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Bubblescope: sign in</title>
<link rel="stylesheet" href="/static/style.css"></head><body><main><h1>Sign in</h1><div class="card signin">
<p>The dashboard needs JavaScript: nothing was stored. Turn it on and <a href="/signin">sign in</a> again.</p>
</div></main></body></html>"""


@router.post("/signin", status_code=400, response_class=HTMLResponse)
def signin_without_script() -> HTMLResponse:
    """The sign-in form posted by a browser without JavaScript (or before the page's script loaded): the token
    is not read, not stored and not echoed; the form posts rather than gets so that it never lands in an address."""
    return HTMLResponse(NEEDS_SCRIPT_PAGE, status_code=400)


@router.get("/vendor/{name}")
def vendor_file(name: str, request: Request) -> Response:
    """Compressed once per process, not per request: the gzip middleware spent 170 ms of the event
    loop on plotly.min.js at every page visit, while the page's API requests waited."""
    if name not in VENDOR_FILES:
        raise ApiError(404, ("path", "name"), f"no vendored file {name!r}", "not_found")
    path, media_type = VENDOR_FILES[name]
    headers = {"Cache-Control": "max-age=86400", "Vary": "Accept-Encoding"}
    if "gzip" in request.headers.get("accept-encoding", ""):
        headers["Content-Encoding"] = "gzip"  # the middleware passes an encoded answer through
        return Response(_gzipped(path), media_type=media_type, headers=headers)
    return FileResponse(path, media_type=media_type, headers=headers)


@lru_cache(maxsize=len(VENDOR_FILES))
def _gzipped(path: Path) -> bytes:
    return gzip.compress(path.read_bytes(), compresslevel=9, mtime=0)


@router.get("/docs")
def api_docs() -> HTMLResponse:
    """Swagger UI over ``/openapi.json``, served from this service (FastAPI's own loads a CDN)."""
    return get_swagger_ui_html(
        openapi_url="/openapi.json",
        title="Bubblescope API",
        swagger_js_url="/vendor/swagger-ui-bundle.js",
        swagger_css_url="/vendor/swagger-ui.css",
        swagger_favicon_url="data:,",
    )


def mount_frontend(app: FastAPI) -> None:
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=FRONTEND_DIR), name="static")
