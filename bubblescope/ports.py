"""Ports to serve on, checked before anything is printed: ``serve`` and ``demo`` say in one line that a port is
taken instead of failing in uvicorn after the URL was announced (stdlib only)."""

from __future__ import annotations

import socket


def can_listen(host: str, port: int) -> bool:
    """Whether a server could listen on ``host:port`` now. The probe allows address reuse as uvicorn does, so a
    port whose old connections linger in TIME_WAIT counts as free."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1", preferred: int = 0) -> int:
    """``preferred`` when a server could listen there, else any free port."""
    if preferred and can_listen(host, preferred):
        return preferred
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def taken_message(command: str, host: str, port: int) -> str:
    return (
        f"bubblescope {command}: port {port} on {host} is taken (another service listens there): choose one with --port"
    )
