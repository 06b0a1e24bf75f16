"""POST /api/v1/runs/{key}/traces on a real uvicorn server: the reference traces uploaded one rank a request
become one imported run; a bad or oversized file is refused naming the body, and nothing is stored."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from tests.support import LiveServer, migrated_database, start_server
from tests.traces.support import job_files
from tests.traces.written import trace


def test_ranks_uploaded_one_by_one_make_one_imported_run(sqlite_server: LiveServer) -> None:
    with sqlite_server.client() as client:
        for path in job_files("hta_trace_filter_2rank"):
            query = {"name": "sampled", "file": path.name}
            answer = client.post("/api/v1/runs/uploaded-128/traces", params=query, content=path.read_bytes())
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
            answer = client.post("/api/v1/runs/refused-upload/traces", content=body)
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
                answer = client.post("/api/v1/runs/too-big/traces", content=path.read_bytes())
                assert answer.status_code == 413 and "--max-trace-bytes" in answer.text, answer.text
                assert client.get("/api/v1/runs/too-big").status_code == 404
        finally:
            live.stop()


def test_a_file_name_that_is_not_a_plain_name_is_refused(sqlite_server: LiveServer) -> None:
    with sqlite_server.client() as client:
        for name in ("..", ".", "../x.json", "a/b.json", ".hidden"):
            answer = client.post("/api/v1/runs/named/traces", params={"file": name}, content=b"{}")
            assert answer.status_code == 422 and answer.json()["detail"][0]["loc"] == ["query", "file"], (
                name,
                answer.text,
            )
