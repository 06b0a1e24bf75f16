"""Schemathesis over the OpenAPI document of a real ``bubblescope serve`` (uvicorn on a free loopback
port), on SQLite with ``--auth`` and without, and on PostgreSQL without: no answer is a 5xx, and the server does what
its document says.

Checks (``CHECKS``): every check schemathesis has that applies to one request at a time.

- ``not_a_server_error``: no 5xx. A 503 counts: one client sending one request at a time must not
  find the database busy or away.
- ``status_code_conformance``, ``content_type_conformance``, ``response_schema_conformance``,
  ``response_headers_conformance``: the status is one the document declares for the operation, and
  the body (2xx models, the one error shape of backend/openapi.py) and headers (``Retry-After``)
  are what it says for that status.
- ``negative_data_rejection``: a request the document calls invalid gets a 4xx.
- ``positive_data_acceptance``: a request the document calls valid is not refused with 400 or 422, save on the
  operations of ``openapi.RULES_BEYOND_THE_SCHEMA``, each with the rule JSON Schema cannot state (between
  fields, or against what is stored), which the operation's description says in words; their answer names it.
- ``missing_required_header``, ``unsupported_method`` and ``allow_header_conformance``: a method the path
  does not answer is a 405 whose ``Allow`` lists every method it does.
- ``ignored_auth`` (with ``--auth``): every guarded operation refuses a request without the token.

Left out: ``use_after_free`` and ``ensure_resource_availability`` (they need schemathesis's stateful links: a
DELETE is aimed at a run that is not there, so ``FUZZ_RUN`` stays) and ``object_level_authorization`` (tokens
bound to runs: tests/auth/test_access_matrix.py).

Bounded and reproducible: a fixed seed with derandomized Hypothesis, ``MAX_EXAMPLES`` per operation
in the fuzzing phase on SQLite without ``--auth`` (schemathesis' examples and coverage phases add their own, fixed,
cases), no deadline, no example database, the health checks a slow machine trips suppressed. With ``--auth`` and on
PostgreSQL the same operations run again with ``MAX_EXAMPLES_AGAIN``: what differs there (every guarded operation's
401, the database's own limits on the coverage phase's boundary values) does not need the whole search again: 138 and
110 s of a 56-minute suite at 150 examples, 63 and 53 s at 50 (SQLite alone: 102 s). ``test-output/fuzz-<database>[-auth].txt`` counts the answers per
operation and status; a 5xx prints the server log's traceback with the failure (and schemathesis a curl line).

Schema-valid bodies mostly name runs that do not exist, so a run (``FUZZ_RUN``: two ranks, four
steps of spans) is stored first, and two cases in three are aimed at it: its key, a rank and a step
in the path, and for ingest, plan and what-if a body built to be valid beyond what the schema says
(equal-length span columns, ordered times, known presets and schedules). Negative cases are left as
generated.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import (
    allow_header_conformance,
    content_type_conformance,
    ignored_auth,
    missing_required_header,
    negative_data_rejection,
    not_a_server_error,
    positive_data_acceptance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
)
from schemathesis.config import SchemathesisConfig

from bubblescope import wire
from bubblescope.analysis.planner import GPU_CATALOG, MODEL_PRESETS
from bubblescope.analysis.schedules import NAMES as SCHEDULES
from bubblescope.backend.auth.scopes import Scope
from bubblescope.backend.openapi import RULES_BEYOND_THE_SCHEMA
from tests.auth.support import bearer, make_token
from tests.dashboard.synthetic import BASE_NS, ingest_steps, register_run
from tests.support import LiveServer, migrated_database, start_server

FUZZ_RUN = "fuzz-run"
RANKS = 2
SEEDED_STEPS = 4
MAX_EXAMPLES = 150
MAX_EXAMPLES_AGAIN = 50  # SQLite with --auth and PostgreSQL: the same operations again, for what differs there
SEED = 20240611
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
    positive_data_acceptance,
    missing_required_header,
    unsupported_method,
    allow_header_conformance,
    ignored_auth,
]
CONFIG = {
    "seed": SEED,
    "suppress-health-check": ["too_slow", "filter_too_much", "data_too_large", "large_base_example"],
    "request-timeout": 60,
    "generation": {"max-examples": MAX_EXAMPLES, "deterministic": True, "database": "none"},
    # a refusal of what the document calls invalid: 413 too (a body past the limits is refused before it is read)
    "checks": {
        "negative_data_rejection": {"expected-statuses": ["400", "401", "403", "404", "405", "413", "415", "422"]}
    },
}


@dataclass(frozen=True)
class FuzzTarget:
    server: LiveServer
    backend: str
    token: str | None  # the admin token a service with --auth is called with


@pytest.fixture(
    scope="module",
    params=[
        ("sqlite", False),
        ("sqlite", True),
        # PostgreSQL without --auth: the database's own answers. Its guarded paths are tests/auth/test_access_matrix.py's
        # on PostgreSQL too (every route, every token kind); fuzzing them there again took 103 s of a 38-minute suite
        pytest.param(("postgres", False), marks=pytest.mark.postgres),
    ],
    ids=lambda p: f"{p[0]}{'-auth' if p[1] else ''}",
)
def fuzz_target(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzTarget]:
    backend, auth = request.param
    # a database of its own: the fuzzer's runs stay out of other tests' lists
    with migrated_database(backend, tmp_path_factory.mktemp("fuzz-db")) as db_url:
        token = make_token(db_url, Scope.ADMIN) if auth else None
        # ignored_auth sends a bad token with every case, from this one address: the throttle of token guessing
        # (tests/auth/test_token_guessing.py) is raised past what the fuzzer sends, so the 401s are checked
        extra = ["--auth", "--unknown-tokens-per-minute", "1000000"] if auth else []
        live = start_server(db_url, tmp_path_factory.mktemp("fuzz-server"), extra_args=extra)
        try:
            headers = bearer(token) if token else {}
            with live.client() as client:
                client.headers.update(headers)
                register_run(client, FUZZ_RUN, stages=RANKS, microbatches=4, name="fuzz")
                ingest_steps(client, FUZZ_RUN, RANKS, 4, range(SEEDED_STEPS))
            yield FuzzTarget(live, backend + ("-auth" if auth else ""), token)
        finally:
            live.stop()


@pytest.fixture(scope="module")
def answers(fuzz_target: FuzzTarget, output_dir: Path) -> Iterator[Counter[tuple[str, str, int]]]:
    """How many answers of each status each operation gave, written to test-output/ at the end."""
    counts: Counter[tuple[str, str, int]] = Counter()
    yield counts
    backend = fuzz_target.backend
    lines = [f"{count:6d}  {status}  {method} {path}" for (method, path, status), count in sorted(counts.items())]
    (output_dir / f"fuzz-{backend}.txt").write_text("\n".join([f"{sum(counts.values())} requests", *lines]) + "\n")


@pytest.fixture(scope="module")
def api_schema(fuzz_target: FuzzTarget) -> Any:
    url = fuzz_target.server.url
    headers = bearer(fuzz_target.token) if fuzz_target.token else {}
    examples = MAX_EXAMPLES if fuzz_target.backend == "sqlite" else MAX_EXAMPLES_AGAIN
    generation = {**CONFIG["generation"], "max-examples": examples}
    config = SchemathesisConfig.from_dict({**CONFIG, "generation": generation, "base-url": url, "headers": headers})
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json", config=config, timeout=30, headers=headers)
    schema.hook(before_generate_case)
    return schema.include(path_regex=f"^{wire.API_PREFIX}/")


# Valid beyond the schema, aimed at FUZZ_RUN
def _span_columns(count: int) -> st.SearchStrategy[dict[str, Any]]:
    span = st.tuples(
        st.integers(0, SEEDED_STEPS + 2),
        st.sampled_from(sorted(wire.SPAN_KINDS)),
        st.integers(0, 10**9),
        st.integers(0, 10**7),
        st.none() | st.integers(0, RANKS),
        st.none() | st.integers(0, 8),
        st.none() | st.integers(0, RANKS),
        st.none() | st.integers(0, 1 << 30),
    )

    def columns(rows: list[tuple[Any, ...]]) -> dict[str, Any]:
        return {
            "step": [row[0] for row in rows],
            "kind": [row[1] for row in rows],
            "start_ns": [BASE_NS + row[2] for row in rows],
            "end_ns": [BASE_NS + row[2] + row[3] for row in rows],
            "stage": [row[4] for row in rows],
            "microbatch": [row[5] for row in rows],
            "peer": [row[6] for row in rows],
            "bytes": [row[7] for row in rows],
        }

    return st.lists(span, min_size=count, max_size=count).map(columns)


def _step_aggregate(step: int) -> st.SearchStrategy[dict[str, Any]]:
    nanos = st.integers(0, 10**9)
    return st.fixed_dictionaries(
        {
            "step": st.just(step),
            "start_ns": st.just(BASE_NS + step * 10**9),
            "end_ns": st.just(BASE_NS + step * 10**9 + 10**8),
            "compute_ns": nanos,
            "comm_ns": nanos,
            "exposed_comm_ns": nanos,
            "idle_ns": nanos,
            "span_count": st.integers(0, 100),
        }
    )


INGEST = st.fixed_dictionaries(
    {
        "run_key": st.just(FUZZ_RUN),
        "rank": st.integers(0, RANKS - 1),
        "seq": st.integers(0, 10**6),
        "steps": st.sets(st.integers(0, SEEDED_STEPS + 2), max_size=3).flatmap(
            lambda steps: st.tuples(*(_step_aggregate(step) for step in sorted(steps))).map(list)
        ),
        "spans": st.integers(0, 12).flatmap(_span_columns),
    }
)
PLAN_CONFIG = st.fixed_dictionaries(
    {},
    optional={
        "tp": st.sampled_from([1, 2, 4, 8]),
        "pp": st.sampled_from([1, 2, 4, 8]),
        "mbs": st.integers(1, 4),
        "schedule": st.sampled_from(SCHEDULES),
        "zero": st.integers(0, 3),
        "recompute": st.sampled_from(["none", "selective", "full"]),
    },
)
PLAN = st.fixed_dictionaries(
    {
        "model": st.sampled_from(sorted(MODEL_PRESETS)),
        "cluster": st.tuples(st.sampled_from(sorted(GPU_CATALOG)), st.sampled_from([1, 8, 64, 512])).map(
            lambda pair: f"{pair[0]}-x{pair[1]}"
        ),
        "global_batch": st.sampled_from([1, 8, 64, 512, 4096]),
    },
    optional={"config": PLAN_CONFIG, "fixed": PLAN_CONFIG, "top": st.integers(1, 20)},
)
WHAT_IF = st.fixed_dictionaries(
    {},
    optional={
        "schedule": st.sampled_from(SCHEDULES),
        "microbatches": st.integers(1, 16),
        "microbatch_scale": st.floats(0.1, 4),
        "stages_per_rank": st.integers(1, 3),
        "layers_per_stage": st.lists(st.integers(1, 8), min_size=1, max_size=6),
        "slowest_rank_to_median": st.booleans(),
        "overlap_communication": st.booleans(),
        "from_step": st.integers(0, SEEDED_STEPS),
        "to_step": st.integers(0, SEEDED_STEPS + 1),
    },
)
BODIES = {
    ("POST", f"{wire.API_PREFIX}/ingest"): INGEST,
    ("POST", f"{wire.API_PREFIX}/plan"): PLAN,
    ("POST", f"{wire.API_PREFIX}/runs/{{run_key}}/whatif"): WHAT_IF,
}
PATH_PARAMETERS = {
    "run_key": st.just(FUZZ_RUN),
    "rank": st.integers(0, RANKS),  # RANKS itself: one past the run's ranks
    "step": st.integers(0, SEEDED_STEPS),
    "name_or_prefix": st.sampled_from(["fuzz-token", "bs_0000000"]),
    "profile_id": st.integers(1, 5),  # no profile of FUZZ_RUN: each one a 404 naming it
}
DELETE_PATH_PARAMETERS = {**PATH_PARAMETERS, "run_key": st.just(f"{FUZZ_RUN}-absent")}  # FUZZ_RUN must stay


def before_generate_case(context: Any, strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """One case in three as generated, two aimed at FUZZ_RUN (a negative case stays as generated)."""
    aimed = strategy.flatmap(_aimed)
    return st.one_of(strategy, aimed, aimed)


def _aimed(case: Any) -> st.SearchStrategy[Any]:
    if case.meta is not None and case.meta.generation.mode == GenerationMode.NEGATIVE:
        return st.just(case)
    parameters = DELETE_PATH_PARAMETERS if case.method.upper() == "DELETE" else PATH_PARAMETERS
    path = st.fixed_dictionaries({name: parameters[name] for name in case.path_parameters})
    body = BODIES.get((case.method.upper(), case.path))

    def aim(parts: tuple[dict[str, Any], Any]) -> Any:
        path_parameters, new_body = parts
        if path_parameters:
            case.path_parameters = {**case.path_parameters, **path_parameters}
        if new_body is not None:
            case.body = new_body
        return case

    return st.tuples(path, body if body is not None else st.none()).map(aim)


def _server_log_since(server: LiveServer, offset: int) -> str:
    with open(server.log_path, "rb") as log:
        log.seek(offset)
        return log.read().decode(errors="replace")


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
def test_no_server_error_and_answers_as_documented(
    case: Any, fuzz_target: FuzzTarget, answers: Counter[tuple[str, str, int]]
) -> None:
    server = fuzz_target.server
    offset = server.log_path.stat().st_size
    response = case.call()
    answers[case.method.upper(), case.path, response.status_code] += 1
    if response.status_code >= 500:  # the traceback, printed with the failure
        httpx.get(f"{server.url}{wire.API_PREFIX}/health", timeout=10)  # the log is written by then
        print(f"server log for {case.method} {case.formatted_path} -> {response.status_code}:")
        print(_server_log_since(server, offset))
    beyond = (case.method.upper(), case.path) in RULES_BEYOND_THE_SCHEMA
    case.validate_response(response, checks=[c for c in CHECKS if not (beyond and c is positive_data_acceptance)])


def test_every_rule_beyond_the_schema_names_an_operation_of_the_document(api_schema: Any) -> None:
    operations = {(op.method.upper(), op.path) for op in (result.ok() for result in api_schema.get_all_operations())}
    assert set(RULES_BEYOND_THE_SCHEMA) <= operations, set(RULES_BEYOND_THE_SCHEMA) - operations
