"""POST /api/v1/runs/{key}/traces on a real uvicorn server: the reference traces uploaded one rank a request
become one imported run; a bad or oversized file is refused naming the body, and nothing is stored."""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Iterator
from pathlib import Path

from tests.support import FILE_BODY, LiveServer, migrated_database, run_rows, start_server
from tests.traces.support import job_files
from tests.traces.written import trace


def test_ranks_uploaded_one_by_one_make_one_imported_run(sqlite_server: LiveServer) -> None:
    with sqlite_server.client() as client:
        for path in job_files("hta_trace_filter_2rank"):
            query = {"name": "sampled", "file": path.name}
            answer = client.post(
                "/api/v1/runs/uploaded-128/traces", params=query, headers=FILE_BODY, content=path.read_bytes()
            )
            assert answer.status_code == 201, answer.text
            assert answer.json()["steps"] == [551, 552] and answer.json()["spans"] > 100
        run = client.get("/api/v1/runs/uploaded-128").json()
    source = run["config"]["imported_from"]
    assert run["name"] == "sampled" and run["world_size"] == 128 and run["state"] == "finished", run
    assert source["ranks"] == [0, 1] and source["files"] == {
        "0": "sampled_rank-0.json.gz",
        "1": "sampled_rank-1.json.gz",
    }, source
    assert [s["step"] for s in run["steps"]] == [551, 552] and all(s["ranks_reported"] == 2 for s in run["steps"])


def test_a_bad_trace_is_refused_naming_the_body_and_nothing_is_stored(sqlite_server: LiveServer) -> None:
    whole = gzip.compress(json.dumps(trace()).encode())
    cases = {
        "truncated gzip": (whole[: len(whole) // 2], "cannot be read to its end"),
        "empty": (b"", "no trace"),
        "not a trace": (b'{"hello": 1}', "no traceEvents"),
        "no rank": (json.dumps(trace(rank=None)).encode(), "no rank"),
    }
    with sqlite_server.client() as client:
        for what, (body, said) in cases.items():
            answer = client.post("/api/v1/runs/refused-upload/traces", headers=FILE_BODY, content=body)
            assert answer.status_code == 422, (what, answer.text)
            (error,) = answer.json()["detail"]
            assert error["loc"] == ["body"] and said in error["msg"] and "/tmp" not in error["msg"], (what, error)
            assert client.get("/api/v1/runs/refused-upload").status_code == 404, what


def test_a_trace_over_the_limit_gets_413(tmp_path: Path) -> None:
    with migrated_database("sqlite", tmp_path) as url:
        live = start_server(url, tmp_path, extra_args=["--max-trace-bytes", "4096"])
        try:
            (path,) = job_files("nccl_data_rank0_of2_a100")
            with live.client() as client:
                answer = client.post("/api/v1/runs/too-big/traces", headers=FILE_BODY, content=path.read_bytes())
                assert answer.status_code == 413 and "--max-trace-bytes" in answer.text, answer.text
                assert client.get("/api/v1/runs/too-big").status_code == 404
        finally:
            live.stop()


def test_a_file_name_that_is_not_a_plain_name_is_refused(sqlite_server: LiveServer) -> None:
    with sqlite_server.client() as client:
        for name in ("..", ".", "../x.json", "a/b.json", ".hidden"):
            answer = client.post("/api/v1/runs/named/traces", params={"file": name}, headers=FILE_BODY, content=b"{}")
            assert answer.status_code == 422 and answer.json()["detail"][0]["loc"] == ["query", "file"], (
                name,
                answer.text,
            )


def test_a_trace_cannot_take_over_a_collected_run_or_replace_an_imported_rank(sqlite_server: LiveServer) -> None:
    first, second = job_files("hta_trace_filter_2rank")
    other = job_files("nccl_data_rank0_of2_a100")[0]  # also rank 0, another file
    with sqlite_server.client() as client:
        client.put("/api/v1/runs/collected-here", json={"name": "live", "world_size": 2}).raise_for_status()
        client.put("/api/v1/runs/collected-here/ranks/0", json={"host": "h", "pid": 1}).raise_for_status()
        taken = client.post("/api/v1/runs/collected-here/traces", headers=FILE_BODY, content=first.read_bytes())
        assert taken.status_code == 409 and "was collected" in taken.text, taken.text
        assert "imported_from" not in client.get("/api/v1/runs/collected-here").json()["config"]
        assert (
            client.post("/api/v1/runs/twice/traces", headers=FILE_BODY, content=first.read_bytes()).status_code == 201
        )
        again = client.post(
            "/api/v1/runs/twice/traces", headers=FILE_BODY, content=first.read_bytes()
        )  # the same file: nothing new
        assert again.status_code == 201, again.text
        replaced = client.post("/api/v1/runs/twice/traces", headers=FILE_BODY, content=other.read_bytes())
        assert replaced.status_code == 409 and "rank 0" in replaced.text, replaced.text
        assert (
            client.post("/api/v1/runs/twice/traces", headers=FILE_BODY, content=second.read_bytes()).status_code == 201
        )
        run = client.get("/api/v1/runs/twice").json()
    assert run["config"]["imported_from"]["ranks"] == [0, 1] and run["state"] == "finished", run
    spans = run_rows(
        sqlite_server.db_url, "twice", "SELECT rank, count(*) FROM spans WHERE run_id = {run} GROUP BY rank"
    )
    counts = dict(spans)
    assert counts[0] == counts_of(first) and counts[1] == counts_of(second), counts


def counts_of(path: Path) -> int:
    from bubblescope.trace_import import convert

    return sum(len(batch["spans"]["step"]) for batch in convert(path, "x").batches)


def test_a_corrupt_gzip_is_a_422_not_a_500(sqlite_server: LiveServer) -> None:
    whole = bytearray(gzip.compress(json.dumps(trace()).encode()))
    with sqlite_server.client() as client:
        for offset in range(12, len(whole) - 8, max(1, (len(whole) - 20) // 25)):
            broken = bytearray(whole)
            broken[offset] ^= 0xFF
            answer = client.post("/api/v1/runs/flipped/traces", headers=FILE_BODY, content=bytes(broken))
            assert answer.status_code in (201, 422), (offset, answer.text)
            if answer.status_code == 201:
                client.delete("/api/v1/runs/flipped")


def test_uploads_past_the_one_in_work_and_its_queue_are_told_to_retry(sqlite_server: LiveServer) -> None:
    """A conversion takes a core: one upload is worked on and TRACE_QUEUE wait; the next gets 503 with
    Retry-After at once, and the held ones complete once their bodies arrive."""
    import threading

    import httpx

    from bubblescope.backend.trace_upload import TRACE_QUEUE

    document = json.dumps(trace()).encode()
    release = threading.Event()

    def slow_body() -> Iterator[bytes]:
        yield document[:1]
        release.wait(30)
        yield document[1:]

    answers: dict[int, int] = {}

    def upload(index: int) -> None:
        with httpx.Client(base_url=sqlite_server.url, timeout=60) as client:
            answer = client.post(
                f"/api/v1/runs/held-{index}/traces",
                params={"file": "rank0.json"},
                headers=FILE_BODY,
                content=slow_body(),
            )
            answers[index] = answer.status_code

    held = [threading.Thread(target=upload, args=(index,)) for index in range(1 + TRACE_QUEUE)]
    for thread in held:
        thread.start()
    try:
        time.sleep(3)  # each held upload has sent its headers and its first byte: admitted, in work or waiting
        with sqlite_server.client() as client:
            refused = client.post(
                "/api/v1/runs/one-more/traces", params={"file": "rank0.json"}, headers=FILE_BODY, content=document
            )
        assert refused.status_code == 503, refused.text
        assert refused.headers["Retry-After"] and "file uploads" in refused.json()["detail"][0]["msg"]
    finally:
        release.set()
        for thread in held:
            thread.join(60)
    assert answers == dict.fromkeys(range(1 + TRACE_QUEUE), 201), answers
