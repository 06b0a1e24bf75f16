"""What other sites may do: the Host allowlist, and CORS refusals in the API's error shape.

A request whose ``Host`` header is not listed gets 400, in the API's error shape.

A page on another site can make a browser send requests to a service on the user's loopback or LAN
through a DNS name it controls (DNS rebinding); the browser then sends that name as ``Host``.
Answering only the names the service is known by defeats it. ``ServiceSettings.hosts_for`` gives
the default: the loopback names when serving on a loopback address.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send


def host_name(header: str) -> str:
    """``example.org:8765`` → ``example.org``; ``[::1]:8765`` → ``::1``."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class HostAllowlist:
    def __init__(self, app: ASGIApp, allowed: tuple[str, ...]) -> None:
        self.app = app
        self.allowed = {name.lower() for name in allowed}
        self.wildcard_suffixes = tuple(name[1:] for name in self.allowed if name.startswith("*."))

    def _allows(self, name: str) -> bool:
        return name in self.allowed or any(name.endswith(suffix) for suffix in self.wildcard_suffixes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        header = Headers(scope=scope).get("host", "")
        name = host_name(header)
        if self._allows(name):
            await self.app(scope, receive, send)
            return
        allowed = ", ".join(sorted(self.allowed))
        response = JSONResponse(
            status_code=400,
            content={
                "detail": [
                    {
                        "loc": ["header", "host"],
                        "msg": f"host {header!r} is not served here (allowed: {allowed}; see serve --allowed-host)",
                        "type": "host_not_allowed",
                    }
                ]
            },
        )
        await response(scope, receive, send)


class JsonErrorCors(CORSMiddleware):
    """Starlette's CORS (``serve --cors-origin``), whose refused preflight answers in the API's error
    shape instead of plain text."""

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code < 400:
            return response
        reason = bytes(response.body).decode(errors="replace")
        return JSONResponse(
            status_code=response.status_code,
            content={"detail": [{"loc": ["header", "origin"], "msg": reason, "type": "cors_refused"}]},
            headers={key: value for key, value in response.headers.items() if key.lower().startswith("vary")},
        )
