"""Ingest over HTTP into a real server on SQLite and PostgreSQL: idempotency and bad input."""

from __future__ import annotations

import functools
import gzip
from typing import Any

import pytest

from bubblescope.backend.settings import ServiceSettings
from tests.support import LiveServer, assert_names, count_rows, ingest_batch, post_gzip, register

batch = ingest_batch


def test_batch_is_stored_and_retry_is_stored_once(server: LiveServer) -> None:
    with server.client() as client:
        key = register(client)
        first = post_gzip(client, batch(key, seq=0, spans=7))
        assert first.status_code == 202 and first.json() == {
            "stored_spans": 7,
            "stored_steps": 1,
            "duplicate": False,
            "captures": [],
            # 2 ranks sending the default batches a second at most: the collector's 1 s stands
            "flush_interval_s": 2 / ServiceSettings().ingest_batches_per_s,
        }
        retry = post_gzip(client, batch(key, seq=0, spans=7))
        assert retry.status_code == 202 and retry.json()["duplicate"] is True
        plain = client.post("/api/v1/ingest", json=batch(key, seq=1, spans=3, rank=1))  # uncompressed works too
        assert plain.status_code == 202, plain.text
    assert count_rows(server.db_url, "spans", key) == 10
    assert count_rows(server.db_url, "ingested_batches", key) == 2


def bad_inputs(key: str) -> list[tuple[str, Any, int, list[Any], str]]:
    """(case, body, status, loc prefix, words in msg); body bytes are sent raw."""
    wrong_type = batch(key, seq=10)
    wrong_type["spans"]["start_ns"][2] = "soon"
    negative = batch(key, seq=11)
    negative["spans"]["start_ns"][1] = -5
    reversed_times = batch(key, seq=12)
    reversed_times["spans"]["end_ns"][3] = reversed_times["spans"]["start_ns"][3] - 1
    ragged = batch(key, seq=13)
    ragged["spans"]["kind"] = ragged["spans"]["kind"][:-1]
    bad_kind = batch(key, seq=14)
    bad_kind["spans"]["kind"][0] = "lunch"
    bad_rank = batch(key, seq=15, rank=9)
    unknown = batch("no-such-run", seq=16)
    step_reversed = batch(key, seq=17)
    step_reversed["steps"][0]["end_ns"] = 0
    repeated_step = batch(key, seq=18)
    repeated_step["steps"].append(dict(repeated_step["steps"][0]))
    return [
        ("malformed json", b'{"run_key": "x", "rank": 0,', 400, ["body"], "malformed JSON"),
        ("wrong type", wrong_type, 422, ["body", "spans", "start_ns", 2], "integer"),
        ("negative time", negative, 422, ["body", "spans", "start_ns", 1], "greater than or equal to 0"),
        ("reversed time", reversed_times, 422, ["body", "spans", "end_ns", 3], "before start_ns"),
        ("ragged columns", ragged, 422, ["body", "spans", "kind"], "entries"),
        ("unknown kind", bad_kind, 422, ["body", "spans", "kind", 0], "Input should be"),
        ("rank out of range", bad_rank, 422, ["body", "rank"], "world_size"),
        ("unknown run", unknown, 404, ["body", "run_key"], "unknown run"),
        ("reversed step window", step_reversed, 422, ["body", "steps", 0, "end_ns"], "before start_ns"),
        ("step twice in a batch", repeated_step, 422, ["body", "steps", 1, "step"], "more than once"),
    ]


@pytest.mark.parametrize("case", range(10), ids=[c[0] for c in bad_inputs("k")])
def test_bad_input_is_rejected_naming_the_field_and_nothing_is_stored(server: LiveServer, case: int) -> None:
    with server.client() as client:
        key = register(client)
        name, body, status, loc, words = bad_inputs(key)[case]
        if isinstance(body, bytes):
            response = client.post("/api/v1/ingest", content=body, headers={"Content-Type": "application/json"})
        else:
            response = post_gzip(client, body)
        assert_names(response, status, loc, words)
    assert count_rows(server.db_url, "spans", key) == 0, name
    assert count_rows(server.db_url, "steps", key) == 0, name
    assert count_rows(server.db_url, "ingested_batches", key) == 0, name


@functools.cache
def gzip_bomb() -> bytes:
    """300 MiB of spaces, gzipped to ~300 KiB (1.7 s of compression: made once per session)."""
    return gzip.compress(b" " * (300 * 1024 * 1024), compresslevel=9)


def test_oversize_and_broken_gzip_payloads_are_rejected(server: LiveServer) -> None:
    with server.client() as client:
        key = register(client)
        huge = b"x" * (ServiceSettings().max_body_bytes + 1)
        json_type = {"Content-Type": "application/json"}
        assert_names(client.post("/api/v1/ingest", content=huge, headers=json_type), 413, ["body"], "exceeds the limit")
        bomb = gzip_bomb()  # expands past the JSON limit
        response = client.post("/api/v1/ingest", content=bomb, headers={**json_type, "Content-Encoding": "gzip"})
        assert_names(response, 413, ["body"], "decompressed payload exceeds")
        broken = client.post("/api/v1/ingest", content=b"not gzip", headers={**json_type, "Content-Encoding": "gzip"})
        assert_names(broken, 400, ["body"], "not valid gzip")
    assert count_rows(server.db_url, "ingested_batches", key) == 0


def test_registration_errors_name_the_field(server: LiveServer) -> None:
    with server.client() as client:
        bad_world = client.put("/api/v1/runs/reg-bad", json={"name": "x", "world_size": 0})
        assert_names(bad_world, 422, ["body", "world_size"], "greater than or equal to 1")
        no_run = client.put("/api/v1/runs/reg-missing/ranks/0", json={"host": "h", "pid": 1})
        assert_names(no_run, 404, ["path", "run_key"], "no run")
        key = register(client, world_size=2)
        beyond = client.put(f"/api/v1/runs/{key}/ranks/2", json={"host": "h", "pid": 1})
        assert_names(beyond, 422, ["path", "rank"], "world_size")
        extra = client.put(f"/api/v1/runs/{key}/ranks/0", json={"host": "h", "pid": 1, "colour": "red"})
        assert_names(extra, 422, ["body", "colour"], "Extra inputs")
        assert client.get("/api/v1/runs/nope").status_code == 404
        worded = client.put(
            f"/api/v1/runs/{key}", json={"name": "x", "world_size": 2, "config": {"num_microbatches": "eight"}}
        )
        assert_names(worded, 422, ["body", "config", "num_microbatches"], "integer")
        no_stages = client.put(
            f"/api/v1/runs/{key}", json={"name": "x", "world_size": 2, "config": {"virtual_stages": 0}}
        )
        assert_names(no_stages, 422, ["body", "config", "virtual_stages"], "greater than or equal to 1")
        split = client.put(
            f"/api/v1/runs/{key}", json={"name": "x", "world_size": 2, "config": {"layers_per_stage": [2, "x"]}}
        )
        assert_names(split, 422, ["body", "config", "layers_per_stage"], "integer")
        assert client.get(f"/api/v1/runs/{key}").json()["config"] == {"schedule": "ScheduleGPipe"}  # nothing written


def test_run_config_merges_across_registrations(server: LiveServer) -> None:
    with server.client() as client:
        key = register(client)
        again = client.put(
            f"/api/v1/runs/{key}",
            json={"name": "ingest-test", "world_size": 2, "config": {"num_stages": 2, "model": {"layers": 8}}},
        )
        assert again.status_code == 200
        config = client.get(f"/api/v1/runs/{key}").json()["config"]
    assert config == {"schedule": "ScheduleGPipe", "num_stages": 2, "model": {"layers": 8}}  # other keys kept as sent


def test_openapi_docs_describe_the_api(server: LiveServer) -> None:
    with server.client() as client:
        assert client.get("/docs").status_code == 200
        spec = client.get("/openapi.json").json()
    assert {"/api/v1/ingest", "/api/v1/runs", "/api/v1/runs/{run_key}/steps/{step}"} <= set(spec["paths"])
    ref = spec["paths"]["/api/v1/ingest"]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert "spans" in spec["components"]["schemas"][ref.rsplit("/", 1)[-1]]["properties"]
