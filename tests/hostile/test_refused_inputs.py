"""Hostile inputs that once got a 500 (or were stored and broke a read) are refused with a 4xx naming
the field, and nothing of the refused request is stored, on SQLite and PostgreSQL.

Bodies are sent as JSON text written by ``json.dumps`` (ASCII, escapes kept), so a NUL character
or a lone surrogate travels the way a client's JSON encoder writes it: ``"\\u0000"``, ``"\\ud800"``.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bubblescope.analysis.pipeline_profile import MAX_LAYERS
from bubblescope.analysis.schedules import MAX_ACTIONS
from bubblescope.backend.db import migrate
from bubblescope.backend.fields import COUNT_MAX, INT32_MAX, INT64_MAX, OFFSET_NS_MAX
from bubblescope.backend.settings import ServiceSettings
from tests.support import LiveServer, assert_names, count_rows, free_port, ingest_batch, run_rows, wait_until

BASE_NS = 1_700_000_000_000_000_000
RUN_TABLES = ("spans", "steps", "ingested_batches", "ranks")


JSON_HEADERS = {"Content-Type": "application/json"}


def send(client: httpx.Client, method: str, url: str, document: Any) -> httpx.Response:
    """``document`` as ``json.dumps`` writes it (escapes, not raw characters)."""
    return client.request(method, url, content=json.dumps(document), headers=JSON_HEADERS)


def new_run(client: httpx.Client, world_size: int = 2, config: dict[str, Any] | None = None) -> str:
    key = f"hostile-{uuid.uuid4().hex[:10]}"
    body = {"name": "hostile", "world_size": world_size, "config": config or {"schedule": "GPipe"}}
    response = send(client, "PUT", f"/api/v1/runs/{key}", body)
    assert response.status_code == 200, response.text
    return key


def run_view(client: httpx.Client, key: str) -> dict[str, Any]:
    response = client.get(f"/api/v1/runs/{key}")
    assert response.status_code == 200, response.text
    detail: dict[str, Any] = response.json()
    return detail


def assert_nothing_stored(server: LiveServer, key: str, tables: tuple[str, ...] = RUN_TABLES) -> None:
    assert {table: count_rows(server.db_url, table, key) for table in tables} == dict.fromkeys(tables, 0)


def rank_body(**changes: Any) -> dict[str, Any]:
    return {"host": "node-1", "pid": 4242, "stage": 0, **changes}


def batch(key: str, spans: int = 6, seq: int = 0, rank: int = 0, step: int = 0) -> dict[str, Any]:
    return ingest_batch(key, seq=seq, spans=spans, rank=rank, step=step, named=True)


# --- integers beyond their columns ------------------------------------------------------------

RANK_INTEGERS = [
    pytest.param("pid", 2**63, id="pid-2^63"),
    pytest.param("clock_offset_ns", 2**63, id="clock_offset-2^63"),
    pytest.param("clock_offset_ns", -(2**63), id="clock_offset-minus-2^63"),
    pytest.param("clock_uncertainty_ns", 2**64, id="clock_uncertainty-2^64"),
    pytest.param("stage", 2**40, id="stage-2^40"),
    pytest.param("memory_limit_bytes", 2**63, id="memory_limit-2^63"),
]


@pytest.mark.parametrize(
    "sizes,field,words",
    [
        pytest.param({"stage_layers": [2]}, "stage_layers", "one count per stage", id="layers-without-stages"),
        pytest.param({"stages": [0, 2], "stage_layers": [2]}, "stage_layers", "got 1", id="layers-too-few"),
        pytest.param({"stages": [0], "stage_params": [1, 2]}, "stage_params", "got 2", id="params-too-many"),
        pytest.param({"stages": [0], "stage_layers": [0]}, "stage_layers", "", id="zero-layers"),
    ],
)
def test_stage_sizes_that_do_not_line_up_with_the_stages_are_refused(
    server: LiveServer, sizes: dict[str, Any], field: str, words: str
) -> None:
    with server.client() as client:
        key = new_run(client)
        response = send(client, "PUT", f"/api/v1/runs/{key}/ranks/0", rank_body(**sizes))
        assert_names(response, 422, ["body", field], words)
    assert_nothing_stored(server, key)


@pytest.mark.parametrize("field,value", RANK_INTEGERS)
def test_rank_integer_beyond_its_column_is_refused(server: LiveServer, field: str, value: int) -> None:
    with server.client() as client:
        key = new_run(client)
        response = send(client, "PUT", f"/api/v1/runs/{key}/ranks/0", rank_body(**{field: value}))
        assert_names(response, 422, ["body", field], "")
    assert_nothing_stored(server, key)


def test_rank_integers_at_their_bounds_are_stored(server: LiveServer) -> None:
    """The other side of the bounds above: the largest values that fit are kept exactly."""
    with server.client() as client:
        key = new_run(client)
        body = rank_body(pid=INT64_MAX, stage=INT32_MAX, clock_offset_ns=-OFFSET_NS_MAX)
        body["clock_uncertainty_ns"] = OFFSET_NS_MAX
        response = send(client, "PUT", f"/api/v1/runs/{key}/ranks/0", body)
        assert response.status_code == 200, response.text
        rank = run_view(client, key)["ranks"][0]
    assert (rank["pid"], rank["stage"], rank["clock_offset_ns"], rank["clock_uncertainty_ns"]) == (
        INT64_MAX,
        INT32_MAX,
        -OFFSET_NS_MAX,
        OFFSET_NS_MAX,
    )


def _step_field(name: str, value: int) -> Any:
    def change(document: dict[str, Any]) -> list[Any]:
        document["steps"][0][name] = value
        return ["body", "steps", 0, name]

    return change


def _span_stage(document: dict[str, Any]) -> list[Any]:
    document["spans"]["stage"][4] = 2**40
    return ["body", "spans", "stage", 4]


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(_step_field("span_count", 2**40), id="step-span_count-2^40"),
        pytest.param(_step_field("clock_offset_ns", 2**63), id="step-clock_offset-2^63"),
        pytest.param(_step_field("step", COUNT_MAX + 1), id="step-number-past-2^62"),
        pytest.param(_span_stage, id="span-stage-2^40"),
    ],
)
def test_ingest_integer_beyond_its_column_is_refused(server: LiveServer, change: Any) -> None:
    with server.client() as client:
        key = new_run(client)
        document = batch(key)
        loc = change(document)
        assert_names(send(client, "POST", "/api/v1/ingest", document), 422, loc, "")
    assert_nothing_stored(server, key)


def test_path_and_query_integers_beyond_64_bits_are_refused(server: LiveServer) -> None:
    with server.client() as client:
        key = new_run(client)
        assert_names(client.get(f"/api/v1/runs/{key}/steps/{2**63}"), 422, ["path", "step"], "")
        assert_names(client.get("/api/v1/runs", params={"offset": 2**63}), 422, ["query", "offset"], "")
        assert_names(client.get("/api/v1/runs", params={"limit": 2**63}), 422, ["query", "limit"], "")
        big_rank = send(client, "PUT", f"/api/v1/runs/{key}/ranks/{2**40}", rank_body())
        assert_names(big_rank, 422, ["path", "rank"], "")
    assert_nothing_stored(server, key)


def test_rank_end_times_in_range_are_stored_and_past_the_bounds_refused(server: LiveServer) -> None:
    with server.client() as client:
        key = new_run(client)
        assert send(client, "PUT", f"/api/v1/runs/{key}/ranks/0", rank_body()).status_code == 200
        end_url = f"/api/v1/runs/{key}/ranks/0/end"
        past = [
            ({"end_ns": COUNT_MAX + 1}, "end_ns"),
            ({"end_ns": 2**64}, "end_ns"),
            ({"end_ns": 5, "clock_offset_ns": -OFFSET_NS_MAX - 1}, "clock_offset_ns"),
            ({"end_ns": 5, "clock_offset_ns": OFFSET_NS_MAX + 1}, "clock_offset_ns"),
        ]
        for fields, name in past:
            assert_names(send(client, "PUT", end_url, {"outcome": "finished", **fields}), 422, ["body", name], "")
        assert run_view(client, key)["ranks"][0]["outcome"] is None  # none of them was stored
        # the extremes that fit: end_ns - clock_offset_ns = 2^62 + 2^61, still a 64-bit integer
        extreme = {"outcome": "finished", "end_ns": COUNT_MAX, "clock_offset_ns": -OFFSET_NS_MAX}
        response = send(client, "PUT", end_url, extreme)
        assert response.status_code == 200, response.text
        assert response.json()["outcome"] == "finished"
    stored = run_rows(server.db_url, key, "SELECT end_ns FROM ranks WHERE run_id = {run}")
    assert [row[0] for row in stored] == [2**62 + 2**61]


def test_config_integer_beyond_its_column_is_refused_and_the_run_unchanged(server: LiveServer) -> None:
    with server.client() as client:
        key = new_run(client, config={"schedule": "1F1B", "num_stages": 2, "num_microbatches": 4})
        before = run_view(client, key)
        body = {"name": "changed", "world_size": 4, "config": {"num_microbatches": 2**40}}
        assert_names(send(client, "PUT", f"/api/v1/runs/{key}", body), 422, ["body", "config", "num_microbatches"], "")
        after = run_view(client, key)
    assert (after["name"], after["world_size"], after["config"]) == (before["name"], 2, before["config"])


# --- an in-range pipeline shape too big to replay --------------------------------------------


def pipeline_batch(key: str, rank: int) -> dict[str, Any]:
    """Three steps of two micro-batches' forward and backward on ``rank``'s stage."""
    spans: dict[str, list[Any]] = {name: [] for name in ("step", "kind", "start_ns", "end_ns", "stage", "microbatch")}
    steps = []
    for step in range(3):
        origin = BASE_NS + step * 10_000_000
        for microbatch in range(2):
            for index, kind in enumerate(("forward", "backward")):
                start = origin + rank * 100_000 + microbatch * 1_000_000 + index * 400_000
                for name, value in zip(spans, (step, kind, start, start + 300_000, rank, microbatch)):
                    spans[name].append(value)
        steps.append(
            {
                "step": step,
                "start_ns": origin,
                "end_ns": origin + 5_000_000,
                "compute_ns": 1_200_000,
                "comm_ns": 0,
                "exposed_comm_ns": 0,
                "idle_ns": 3_800_000,
                "span_count": 4,
            }
        )
    return {"run_key": key, "rank": rank, "seq": 0, "steps": steps, "spans": spans}


def pipeline_run(client: httpx.Client, microbatches: int) -> str:
    key = new_run(client, config={"schedule": "1F1B", "num_stages": 2, "num_microbatches": microbatches})
    for rank in range(2):
        assert send(client, "PUT", f"/api/v1/runs/{key}/ranks/{rank}", rank_body(stage=rank)).status_code == 200
        assert send(client, "POST", "/api/v1/ingest", pipeline_batch(key, rank)).status_code == 202
    return key


def assert_replay_refused_promptly(client: httpx.Client, key: str, limit_s: float) -> None:
    """A 422 naming num_microbatches, or the analysis without a pipeline replay saying why; in time."""
    started = time.monotonic()
    response = client.get(f"/api/v1/runs/{key}/analysis", timeout=limit_s)
    elapsed = time.monotonic() - started
    assert elapsed < limit_s, elapsed
    if response.status_code == 422:
        detail = response.json()["detail"]
        assert any("num_microbatches" in item["loc"] for item in detail), detail
        return
    assert response.status_code == 200, response.text
    analysis = response.json()
    assert analysis["pipeline"] is None and "num_microbatches" in analysis["pipeline_unavailable"], analysis


def test_a_shape_of_billions_of_actions_is_not_replayed(server: LiveServer) -> None:
    with server.client() as client:
        key = pipeline_run(client, INT32_MAX)  # 2 stages x 2^31 micro-batches: 1.3e10 actions
        assert_replay_refused_promptly(client, key, limit_s=10)
        whatif = send(client, "POST", f"/api/v1/runs/{key}/whatif", {})
        assert_names(whatif, 422, ["path", "run_key"], "num_microbatches")


MEMORY_CAP = 2 << 30  # bytes of address space for a server that may be asked for too much


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))


@pytest.fixture()
def own_server(tmp_path: Path) -> Iterator[LiveServer]:
    """A server of its own, its memory capped: a slow analysis must not hold up the shared server,
    and a huge allocation must fail in that process, not exhaust the machine's memory."""
    url = f"sqlite:///{tmp_path / 'own.db'}"
    migrate.upgrade(url)
    port = free_port()
    log_path = tmp_path / "own-server.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "bubblescope.cli", "serve", "--db", url, "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_cap_memory,
        )
    live = LiveServer(f"http://127.0.0.1:{port}", url, process, log_path)

    def answers() -> bool:
        assert process.poll() is None, log_path.read_text()
        try:
            return httpx.get(f"{live.url}/api/v1/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(answers, 30, "the memory-capped server", interval_s=0.1)
        yield live
    finally:
        process.kill()  # not terminate: uvicorn would wait for an analysis in progress
        process.wait(10)


HANG_S = 120
"""A hang guard, not a timing target (bench/ has those): minutes-long analyses were the bug."""


def timed_get(client: httpx.Client, url: str, limit_s: float) -> httpx.Response:
    try:
        return client.get(url, timeout=limit_s)
    except httpx.ReadTimeout:
        pytest.fail(f"GET {url} took over {limit_s} s")


def test_the_largest_shape_the_replay_accepts_is_analysed_promptly(own_server: LiveServer) -> None:
    """MAX_ACTIONS is the bound that keeps an analysis short, so the largest shape under it must be
    answered in seconds too (a replay, or a refusal naming num_microbatches), not after minutes."""
    microbatches = MAX_ACTIONS // (3 * 2)  # 1F1B on 2 stages: 3 actions per micro-batch and stage
    with own_server.client() as client:
        key = pipeline_run(client, microbatches)
        response = timed_get(client, f"/api/v1/runs/{key}/analysis", limit_s=HANG_S)
    assert response.status_code in (200, 422), response.text


@pytest.mark.parametrize(
    "layers",
    [
        pytest.param([INT32_MAX, INT32_MAX], id="per-stage-list"),
        pytest.param(INT32_MAX, id="one-count"),
        pytest.param([MAX_LAYERS // 2, MAX_LAYERS // 2], id="at-the-analysis-limit"),
        pytest.param([MAX_LAYERS, MAX_LAYERS], id="past-the-analysis-limit-in-all"),
    ],
)
def test_a_huge_layer_count_is_refused_or_analysed_without_expanding_it(own_server: LiveServer, layers: Any) -> None:
    """``layers_per_stage`` of 2^31 - 1 fits its column; the analysis must not build a list per layer,
    and at its own limit (1,024 layers in all) it splits them without a cubic programme."""
    with own_server.client() as client:
        config = {"schedule": "1F1B", "num_stages": 2, "num_microbatches": 4, "layers_per_stage": layers}
        key = f"hostile-{uuid.uuid4().hex[:10]}"
        registered = send(client, "PUT", f"/api/v1/runs/{key}", {"name": "layers", "world_size": 2, "config": config})
        if registered.status_code != 200:  # refused at registration: fine, if it says where
            assert_names(registered, registered.status_code, ["body", "config", "layers_per_stage"], "")
            assert 400 <= registered.status_code < 500
            return
        for rank in range(2):
            assert send(client, "PUT", f"/api/v1/runs/{key}/ranks/{rank}", rank_body(stage=rank)).status_code == 200
            assert send(client, "POST", "/api/v1/ingest", pipeline_batch(key, rank)).status_code == 202
        for url in (f"/api/v1/runs/{key}/analysis", f"/api/v1/runs/{key}/steps/1"):
            try:
                response = timed_get(client, url, limit_s=HANG_S)
            except httpx.TransportError as error:  # the capped server could not answer at all
                pytest.fail(f"GET {url}: {error!r}")
            assert response.status_code == 200 or 400 <= response.status_code < 500, response.text


def test_a_huge_cluster_is_planned_promptly_or_refused(own_server: LiveServer) -> None:
    """A cluster of 2^31 - 8 GPUs (whole 8-GPU nodes) is a valid integer; the planner's search must
    not take minutes over it (a refusal naming cluster.gpus is as good)."""
    body = {"model": "gpt-1.7b", "cluster": {"gpu": "A100-80GB", "gpus": INT32_MAX - 7}, "global_batch": 64}
    with own_server.client() as client:
        try:
            response = client.post("/api/v1/plan", content=json.dumps(body), timeout=HANG_S, headers=JSON_HEADERS)
        except httpx.ReadTimeout:
            pytest.fail(f"POST /api/v1/plan with 2^31 - 8 GPUs took over {HANG_S} s")
    assert response.status_code == 200 or 400 <= response.status_code < 500, response.text


# --- text no database column can hold -----------------------------------------------------------

NUL = "\u0000"
LONE = "\ud800"
EMOJI = "\ud83d\ude00"  # a surrogate pair: U+1F600, one character once decoded


def test_nul_in_the_run_name_is_refused(server: LiveServer) -> None:
    with server.client() as client:
        key = new_run(client)
        before = run_view(client, key)
        body = {"name": f"bad{NUL}name", "world_size": 2, "config": {"schedule": "1F1B"}}
        assert_names(send(client, "PUT", f"/api/v1/runs/{key}", body), 422, ["body", "name"], "NUL")
        fresh = f"hostile-{uuid.uuid4().hex[:10]}"
        assert_names(send(client, "PUT", f"/api/v1/runs/{fresh}", body), 422, ["body", "name"], "NUL")
        after = run_view(client, key)
        assert client.get(f"/api/v1/runs/{fresh}").status_code == 404
    assert (after["name"], after["config"]) == (before["name"], before["config"])


@pytest.mark.parametrize("path,name", [("/api/v1/alerts", "run"), ("/api/v1/runs", "q"), ("/api/v1/runs", "state")])
def test_nul_in_a_query_value_is_refused_on_either_database(server: LiveServer, path: str, name: str) -> None:
    """Found by the API fuzz on PostgreSQL, which cannot compare text holding NUL: ``?run=`` was a 500."""
    with server.client() as client:
        assert_names(client.get(path, params={name: f"a{NUL}b"}), 422, ["query", name], "NUL")


def test_nul_in_a_rank_host_is_refused(server: LiveServer) -> None:
    with server.client() as client:
        key = new_run(client)
        response = send(client, "PUT", f"/api/v1/runs/{key}/ranks/0", rank_body(host=f"node{NUL}1"))
        assert_names(response, 422, ["body", "host"], "NUL")
    assert_nothing_stored(server, key)


def test_nul_in_a_rank_end_error_is_refused(server: LiveServer) -> None:
    with server.client() as client:
        key = new_run(client)
        assert send(client, "PUT", f"/api/v1/runs/{key}/ranks/0", rank_body()).status_code == 200
        end = {"outcome": "failed", "error": f"RuntimeError: boom{NUL}"}
        assert_names(send(client, "PUT", f"/api/v1/runs/{key}/ranks/0/end", end), 422, ["body", "error"], "NUL")
        view = run_view(client, key)
    assert (view["ranks"][0]["outcome"], view["state"]) == (None, "running")


@pytest.mark.parametrize("bad", [pytest.param(NUL, id="nul"), pytest.param(LONE, id="lone-surrogate")])
def test_bad_text_in_one_span_name_refuses_the_whole_batch(server: LiveServer, bad: str) -> None:
    with server.client() as client:
        key = new_run(client)
        document = batch(key, spans=40)
        document["spans"]["name"][27] = f"layer{bad}27"
        words = "NUL" if bad == NUL else "unpaired surrogate"
        assert_names(send(client, "POST", "/api/v1/ingest", document), 422, ["body", "spans", "name", 27], words)
    assert_nothing_stored(server, key)


@pytest.mark.parametrize(
    "config,loc,words",
    [
        pytest.param({f"bad{NUL}key": 1}, ["body", "config", f"bad{NUL}key"], "NUL", id="nul-in-key"),
        pytest.param({"note": f"bad{NUL}value"}, ["body", "config", "note"], "NUL", id="nul-in-value"),
        pytest.param({"note": f"bad{LONE}value"}, ["body", "config", "note"], "unpaired", id="lone-surrogate-value"),
        pytest.param({"deep": {"er": [f"x{NUL}"]}}, ["body", "config", "deep", "er", 0], "NUL", id="nul-nested"),
    ],
)
def test_bad_text_in_the_config_is_refused(
    server: LiveServer, config: dict[str, Any], loc: list[Any], words: str
) -> None:
    with server.client() as client:
        key = new_run(client)
        before = run_view(client, key)
        body = {"name": "changed", "world_size": 2, "config": config}
        assert_names(send(client, "PUT", f"/api/v1/runs/{key}", body), 422, loc, words)
        after = run_view(client, key)
    assert (after["name"], after["config"]) == (before["name"], before["config"])


def test_a_surrogate_pair_is_text_and_read_back_intact(server: LiveServer) -> None:
    emoji = "\U0001f600"
    with server.client() as client:
        key = new_run(client, config={"schedule": "1F1B", "note": f"fast {EMOJI}"})
        assert send(client, "PUT", f"/api/v1/runs/{key}/ranks/0", rank_body(host=f"node-{EMOJI}")).status_code == 200
        document = batch(key, spans=3)
        document["spans"]["name"][1] = f"layer {EMOJI}"
        ingested = send(client, "POST", "/api/v1/ingest", document)
        assert ingested.status_code == 202, ingested.text
        view = run_view(client, key)
        step = client.get(f"/api/v1/runs/{key}/steps/0").json()
    assert view["config"]["note"] == f"fast {emoji}"
    assert view["ranks"][0]["host"] == f"node-{emoji}"
    assert [span["name"] for span in step["spans"]] == ["layer.0", f"layer {emoji}", "layer.2"]
    assert count_rows(server.db_url, "spans", key) == 3


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_a_number_json_cannot_carry_is_refused(server: LiveServer, number: str) -> None:
    """Python's parser takes NaN, Infinity and an overflowing 1e400 (as inf); standard JSON has no
    such numbers, so PostgreSQL's json column refuses them and an answer cannot carry them."""
    with server.client() as client:
        key = new_run(client)
        before = run_view(client, key)
        for run_key in (key, f"hostile-{uuid.uuid4().hex[:10]}"):
            raw = '{"name": "changed", "world_size": 2, "config": {"learning_rate": NUMBER}}'.replace("NUMBER", number)
            response = client.put(f"/api/v1/runs/{run_key}", content=raw, headers=JSON_HEADERS)
            assert 400 <= response.status_code < 500, response.text
            detail = response.json()["detail"]
            assert detail[0]["loc"][:1] == ["body"], detail
        after = run_view(client, key)
        assert client.get(f"/api/v1/runs/{run_key}").status_code == 404
    assert (after["name"], after["config"]) == (before["name"], before["config"])


# --- a config that grows past its caps ---------------------------------------------------------


def test_a_config_merged_past_the_key_limit_is_refused_and_the_first_kept(server: LiveServer) -> None:
    limit = ServiceSettings().max_config_keys
    first = {f"first_{index}": index for index in range(200)}
    second = {f"second_{index}": index for index in range(100)}
    assert len(first) <= limit < len(first) + len(second) and len(second) <= limit
    with server.client() as client:
        key = f"hostile-{uuid.uuid4().hex[:10]}"
        registered = send(client, "PUT", f"/api/v1/runs/{key}", {"name": "one", "world_size": 2, "config": first})
        assert registered.status_code == 200, registered.text
        merged = {"name": "two", "world_size": 4, "config": second}
        assert_names(send(client, "PUT", f"/api/v1/runs/{key}", merged), 413, ["body", "config"], "keys")
        view = run_view(client, key)
    assert (view["name"], view["world_size"], view["config"]) == ("one", 2, first)


def test_a_config_nested_too_deep_is_refused_naming_the_path(server: LiveServer) -> None:
    nested: dict[str, Any] = {"leaf": 1}
    for _ in range(10):
        nested = {"level": nested}
    with server.client() as client:
        key = new_run(client)
        before = run_view(client, key)
        body = {"name": "changed", "world_size": 2, "config": {"deep": nested}}
        response = send(client, "PUT", f"/api/v1/runs/{key}", body)
        assert_names(response, 422, ["body", "config", "deep", "level"], "nested deeper")
        after = run_view(client, key)
    assert after["config"] == before["config"]


def test_a_config_past_the_byte_limit_is_refused(server: LiveServer) -> None:
    with server.client() as client:
        key = new_run(client)
        before = run_view(client, key)
        body = {"name": "changed", "world_size": 2, "config": {"notes": "x" * 100_000}}
        assert_names(send(client, "PUT", f"/api/v1/runs/{key}", body), 413, ["body", "config"], "bytes")
        # the limit is on the merged config: two halves that fit alone do not fit together
        half = ServiceSettings().max_config_bytes // 2 + 100
        assert send(client, "PUT", f"/api/v1/runs/{key}", {**body, "config": {"a": "x" * half}}).status_code == 200
        response = send(client, "PUT", f"/api/v1/runs/{key}", {**body, "config": {"b": "y" * half}})
        assert_names(response, 413, ["body", "config"], "merged")
        after = run_view(client, key)
    assert set(after["config"]) == {*before["config"], "a"}


# --- world size -------------------------------------------------------------------------------


def test_the_latest_world_size_wins_and_a_shrunk_run_can_finish(server: LiveServer) -> None:
    with server.client() as client:
        key = new_run(client, world_size=8)
        for rank in (0, 1, 5):
            assert send(client, "PUT", f"/api/v1/runs/{key}/ranks/{rank}", rank_body()).status_code == 200
        assert new_run_again(client, key, world_size=2)["world_size"] == 2
        assert run_view(client, key)["world_size"] == 2
        # a rank outside the shrunk world is refused on its next registration or batch
        assert_names(send(client, "PUT", f"/api/v1/runs/{key}/ranks/5", rank_body()), 422, ["path", "rank"], "")
        assert_names(send(client, "POST", "/api/v1/ingest", batch(key, rank=5)), 422, ["body", "rank"], "")
        for rank in (0, 1):
            ended = send(client, "PUT", f"/api/v1/runs/{key}/ranks/{rank}/end", {"outcome": "finished"})
            assert ended.status_code == 200, ended.text
        view = run_view(client, key)
    assert (view["state"], view["state_detail"]) == ("finished", "all 2 ranks finished")


def new_run_again(client: httpx.Client, key: str, world_size: int) -> dict[str, Any]:
    response = send(client, "PUT", f"/api/v1/runs/{key}", {"name": "hostile", "world_size": world_size})
    assert response.status_code == 200, response.text
    summary: dict[str, Any] = response.json()
    return summary


# --- integers must be JSON integers (strict), so the bounds above hold ---------------------------


def _registration(value: Any) -> tuple[str, dict[str, Any], list[Any]]:
    return "run", {"name": "changed", "world_size": value}, ["body", "world_size"]


def _config(value: Any) -> tuple[str, dict[str, Any], list[Any]]:
    return (
        "run",
        {"name": "changed", "world_size": 2, "config": {"num_microbatches": value}},
        [
            "body",
            "config",
            "num_microbatches",
        ],
    )


def _rank(value: Any) -> tuple[str, dict[str, Any], list[Any]]:
    return "rank", rank_body(pid=value), ["body", "pid"]


def _end(value: Any) -> tuple[str, dict[str, Any], list[Any]]:
    return "end", {"outcome": "finished", "end_ns": value}, ["body", "end_ns"]


def _seq(value: Any) -> tuple[str, dict[str, Any], list[Any]]:
    return "ingest", {"seq": value}, ["body", "seq"]


def _span_stage_as(value: Any) -> tuple[str, dict[str, Any], list[Any]]:
    return "ingest", {"spans.stage.2": value}, ["body", "spans", "stage", 2]


def _aggregate(value: Any) -> tuple[str, dict[str, Any], list[Any]]:
    return "ingest", {"steps.0.span_count": value}, ["body", "steps", 0, "span_count"]


def _capture(value: Any) -> tuple[str, dict[str, Any], list[Any]]:
    return "capture", {"steps": value}, ["body", "steps"]


STRICT_CASES = [
    pytest.param(make, value, id=f"{make.__name__.strip('_')}-{label}")
    for make in (_registration, _config, _rank, _end, _seq, _span_stage_as, _aggregate, _capture)
    for value, label in (("8", "string"), (True, "bool"), (8.5, "fraction"), ("9223372036854775808", "huge-string"))
]


def test_an_integer_written_with_a_zero_fraction_is_the_integer(server: LiveServer) -> None:
    """JSON Schema (and so the OpenAPI document) counts 8.0 as an integer: the service takes it as 8, the
    fraction 8.5 it refuses (above). Schemathesis's positive_data_acceptance found the disagreement."""
    with server.client() as client:
        key = new_run(client)
        registered = send(client, "PUT", f"/api/v1/runs/{key}", {"name": "zero fraction", "world_size": 4.0})
        assert registered.status_code == 200, registered.text
        assert run_view(client, key)["world_size"] == 4 and isinstance(run_view(client, key)["world_size"], int)


@pytest.mark.parametrize("make,value", STRICT_CASES)
def test_integers_sent_as_strings_or_booleans_are_refused(server: LiveServer, make: Any, value: Any) -> None:
    with server.client() as client:
        key = new_run(client)
        before = run_view(client, key)
        target, fields, loc = make(value)
        if target in ("end", "capture"):
            assert send(client, "PUT", f"/api/v1/runs/{key}/ranks/0", rank_body()).status_code == 200
        if target == "run":
            response = send(client, "PUT", f"/api/v1/runs/{key}", fields)
        elif target == "rank":
            response = send(client, "PUT", f"/api/v1/runs/{key}/ranks/1", fields)
        elif target == "end":
            response = send(client, "PUT", f"/api/v1/runs/{key}/ranks/0/end", fields)
        elif target == "capture":
            response = send(client, "POST", f"/api/v1/runs/{key}/capture", fields)
        else:
            document = batch(key)
            for path, new in fields.items():
                *parents, last = path.split(".")
                holder: Any = document
                for part in parents:
                    holder = holder[int(part)] if part.isdigit() else holder[part]
                holder[int(last) if last.isdigit() else last] = new
            response = send(client, "POST", "/api/v1/ingest", document)
        assert_names(response, 422, loc, "")
        after = run_view(client, key)
    assert (after["name"], after["world_size"], after["config"]) == (before["name"], 2, before["config"])
    assert [rank["outcome"] for rank in after["ranks"]] == [None] * len(after["ranks"])
    tables = ("spans", "steps", "ingested_batches", "capture_requests")
    assert_nothing_stored(server, key, tables)
    assert count_rows(server.db_url, "ranks", key) == (1 if target in ("end", "capture") else 0)
