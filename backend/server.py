"""Running the service: resolve the database, migrate an embedded SQLite file, start uvicorn."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import uvicorn
from platformdirs import user_data_dir

from bubblescope.backend.app import create_app
from bubblescope.backend.db import migrate
from bubblescope.backend.db.engine import is_sqlite, normalise_url
from bubblescope.backend.runs.state import DEFAULT_SILENT_AFTER_S


def default_db_url() -> str:
    return normalise_url(str(Path(user_data_dir("bubblescope")) / "bubblescope.db"))


def prepare_database(db: str | None) -> str:
    """The normalised URL; an SQLite file is created or upgraded here, a server database is not."""
    url = normalise_url(db) if db else default_db_url()
    if is_sqlite(url):
        migrate.upgrade(url)
    return url


def build_server(url: str, host: str, port: int, silent_after_s: float = DEFAULT_SILENT_AFTER_S) -> uvicorn.Server:
    app = create_app(url, silent_after_s)
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
