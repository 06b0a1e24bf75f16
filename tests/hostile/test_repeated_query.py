"""A query parameter that takes one value, given twice, is refused naming it; one that takes a list
(``state``) may repeat. Before, FastAPI answered for the last value silently."""

from __future__ import annotations

import pytest

from tests.support import LiveServer, assert_names, register


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("/api/v1/runs?name=a&name=b", "name"),
        ("/api/v1/runs?limit=5&limit=500", "limit"),
        ("/api/v1/alerts?limit=1&limit=2", "limit"),
    ],
)
def test_a_repeated_single_valued_parameter_is_a_422_naming_it(server: LiveServer, path: str, name: str) -> None:
    with server.client() as client:
        assert_names(client.get(path), 422, ["query", name], "given 2 times; it takes one value")


def test_a_list_parameter_may_repeat(server: LiveServer) -> None:
    with server.client() as client:
        key = register(client)
        answer = client.get("/api/v1/runs", params=[("state", "running"), ("state", "failed"), ("name", key)])
        assert answer.status_code == 200, answer.text
        assert client.get(f"/api/v1/runs/{key}/stragglers?phases=compute&phases=idle").status_code in (200, 404)
