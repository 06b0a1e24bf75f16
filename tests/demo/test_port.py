"""``bubblescope demo`` keeps its documented port after a restart: a port whose old connections
linger in TIME_WAIT is one a server can listen on again, so the probe must not skip it."""

from __future__ import annotations

import socket

from bubblescope.demo import free_port


def port_left_in_time_wait() -> int:
    """A port whose listener accepted a connection and closed it first (as a stopped server
    does), leaving that connection in TIME_WAIT on the port."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = int(listener.getsockname()[1])
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _address = listener.accept()
        accepted.close()  # the server side closes first: TIME_WAIT stays with it
        client.recv(1)
        client.close()
    return port


def test_a_port_in_time_wait_is_still_the_preferred_port() -> None:
    port = port_left_in_time_wait()
    with socket.socket() as plain:  # what the old probe did: this bind fails in TIME_WAIT
        try:
            plain.bind(("127.0.0.1", port))
            lingering = False
        except OSError:
            lingering = True
    assert lingering, "no TIME_WAIT connection was left on the port: the test shows nothing"
    assert free_port("127.0.0.1", preferred=port) == port


def test_a_port_with_a_listener_is_not_free() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        taken = int(listener.getsockname()[1])
        chosen = free_port("127.0.0.1", preferred=taken)
    assert chosen != taken and chosen > 0
