"""Running the service: resolve the database, migrate an embedded SQLite file, start uvicorn."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import uvicorn
from platformdirs import user_data_dir
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from bubblescope.backend.app import create_app
from bubblescope.backend.db import migrate
from bubblescope.backend.db.engine import is_sqlite, normalise_url
from bubblescope.backend.errors import first_line
from bubblescope.backend.settings import ServiceSettings


def default_db_url() -> str:
    return normalise_url(str(Path(user_data_dir("bubblescope")) / "bubblescope.db"))


class DatabaseNotReady(RuntimeError):
    """The database cannot be opened or reached, or its schema is not current: a one-line reason."""


def _shown(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


def prepare_database(db: str | None) -> str:
    """The normalised URL; an SQLite file is created or upgraded here, a server database is not."""
    url = normalise_url(db) if db else default_db_url()
    if is_sqlite(url):
        try:
            migrate.upgrade(url)
        except (DBAPIError, OSError) as error:
            raise DatabaseNotReady(f"cannot open the database {_shown(url)}: {first_line(error)}") from None
    return url


def build_server(url: str, host: str, port: int, settings: ServiceSettings | None = None) -> uvicorn.Server:
    """The service on ``host:port``; the Host allowlist defaults by ``host`` (``ServiceSettings.hosts_for``)."""
    settings = settings or ServiceSettings()
    try:
        external_url = settings.external_url or f"http://{'[' + host + ']' if ':' in host else host}:{port}"
        settings = dataclasses.replace(settings, allowed_hosts=settings.hosts_for(host), external_url=external_url)
        app = create_app(url, settings)
    except migrate.SchemaOutOfDate as error:
        raise DatabaseNotReady(str(error)) from None
    except DBAPIError as error:
        raise DatabaseNotReady(f"cannot reach the database {_shown(url)}: {first_line(error)}") from None
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
