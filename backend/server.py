"""Running the service: resolve the database, migrate an embedded SQLite file, start uvicorn."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from typing import Any, cast

import uvicorn
from fastapi import FastAPI
from sqlalchemy.exc import DBAPIError
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from bubblescope.backend.app import create_app
from bubblescope.backend.db import migrate
from bubblescope.backend.db.prepare import DatabaseNotReady, shown_url
from bubblescope.backend.errors import first_line
from bubblescope.backend.header_deadline import HeaderDeadline
from bubblescope.backend.settings import PEER_KEY, ServiceSettings


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
    config = uvicorn.Config(
        PeerAddress(app),
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        proxy_headers=False,
        http=HeaderDeadline.with_timeout(settings.header_timeout_s),  # uvicorn's h11, with a header timeout
    )
    return uvicorn.Server(config)


class PeerAddress:
    """The app as uvicorn serves it: X-Forwarded-For handled as uvicorn would (``FORWARDED_ALLOW_IPS``, default
    127.0.0.1), after keeping the address the connection came from (``PEER_KEY`` in the ASGI scope): what
    ``--trusted-proxy`` is checked against (a forwarded address is the client's word). Reads of other attributes
    (``state``) reach the app."""

    def __init__(self, app: FastAPI) -> None:
        self.fastapi_app = app
        forwarded = os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1")
        # (uvicorn's and Starlette's ASGI type hints differ; both are ASGI 3)
        self.forwarding = cast(ASGIApp, ProxyHeadersMiddleware(cast(Any, app), trusted_hosts=forwarded))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fastapi_app, name)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            client = scope.get("client")
            scope[PEER_KEY] = client[0] if client else None
        await self.forwarding(scope, receive, send)


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
