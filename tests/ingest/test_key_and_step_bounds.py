"""Run keys that are path segments (``.``, ``..``) and steps past what a browser's numbers hold (2^53 − 1) are
refused with 422 naming the field, before anything is stored; a capture cannot be asked past the last step.
Real server, SQLite."""

from __future__ import annotations

import pytest

from bubblescope.backend.fields import STEP_MAX
from tests.support import LiveServer, assert_names, ingest_batch, post_gzip, register


@pytest.mark.parametrize("encoded", ["%2E", "%2E%2E", "..."])
def test_a_run_key_of_dots_alone_is_refused(sqlite_server: LiveServer, encoded: str) -> None:
    with sqlite_server.client() as client:
        refused = client.put(f"/api/v1/runs/{encoded}", json={"name": "dots", "world_size": 1})
        assert_names(refused, 422, ["path", "run_key"], "")
        assert client.put("/api/v1/runs/a.b..c", json={"name": "dots", "world_size": 1}).status_code == 200


def test_a_step_past_what_a_browser_holds_is_refused(sqlite_server: LiveServer) -> None:
    with sqlite_server.client() as client:
        key = register(client, world_size=1)
        client.put(f"/api/v1/runs/{key}/ranks/0", json={"host": "h", "pid": 1}).raise_for_status()
        past = ingest_batch(key, step=0)
        past["steps"][0]["step"] = STEP_MAX + 1
        assert_names(post_gzip(client, past), 422, ["body", "steps", 0, "step"], "")
        spans = ingest_batch(key, seq=1)
        spans["spans"]["step"][0] = STEP_MAX + 1
        assert_names(post_gzip(client, spans), 422, ["body", "spans", "step", 0], "")
        assert client.get(f"/api/v1/runs/{key}").json()["step_count"] == 0  # nothing of either was stored
        assert_names(client.get(f"/api/v1/runs/{key}/steps/{STEP_MAX + 1}"), 422, ["path", "step"], "")

        last = ingest_batch(key, seq=2)
        last["steps"][0]["step"] = STEP_MAX
        last["spans"]["step"] = [STEP_MAX] * len(last["spans"]["step"])
        assert post_gzip(client, last).status_code == 202  # the largest is stored, and a browser reads it back
        assert client.get(f"/api/v1/runs/{key}/steps/{STEP_MAX}").status_code == 200
        whatif = client.post(f"/api/v1/runs/{key}/whatif", json={"to_step": 2**64})  # a 500 on SQLite before
        assert_names(whatif, 422, ["body", "to_step"], "")
        capture = client.post(f"/api/v1/runs/{key}/capture", json={"steps": 2})
        assert_names(capture, 422, ["body", "steps"], "would pass the largest step")
