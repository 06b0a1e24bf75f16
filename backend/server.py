"""Running the service: resolve the database, migrate an embedded SQLite file, start uvicorn."""

from __future__ import annotations

import dataclasses
import threading
import time

import uvicorn
from fastapi import FastAPI
from sqlalchemy.exc import DBAPIError

from bubblescope.backend.app import create_app
from bubblescope.backend.db import migrate
from bubblescope.backend.db.prepare import DatabaseNotReady, shown_url
from bubblescope.backend.errors import first_line
from bubblescope.backend.settings import ServiceSettings


def ready_app(url: str, settings: ServiceSettings | None = None) -> FastAPI:
    """The service's app on ``url``; ``DatabaseNotReady`` with a one-line reason when the database cannot be
    reached or its schema is not current."""
    try:
        return create_app(url, settings)
    except migrate.SchemaOutOfDate as error:
        raise DatabaseNotReady(str(error)) from None
    except DBAPIError as error:
        raise DatabaseNotReady(f"cannot reach the database {shown_url(url)}: {first_line(error)}") from None


def build_server(url: str, host: str, port: int, settings: ServiceSettings | None = None) -> uvicorn.Server:
    """The service on ``host:port``; the Host allowlist defaults by ``host`` (``ServiceSettings.hosts_for``)."""
    settings = settings or ServiceSettings()
    external_url = settings.external_url or f"http://{'[' + host + ']' if ':' in host else host}:{port}"
    settings = dataclasses.replace(settings, allowed_hosts=settings.hosts_for(host), external_url=external_url)
    app = ready_app(url, settings)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
    return uvicorn.Server(config)


def start_in_thread(server: uvicorn.Server, timeout_s: float = 20.0) -> threading.Thread:
    """Run the server on a daemon thread and wait until it accepts connections."""
    thread = threading.Thread(target=server.run, name="bubblescope-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started and time.monotonic() < deadline and thread.is_alive():
        time.sleep(0.05)
    if not server.started:
        raise RuntimeError("the bubblescope service did not start")
    return thread
