"""The OpenAPI document a real server serves is whole: every ``$ref`` resolves (the bodies the
endpoints read themselves included, see backend/openapi.py), every POST/PUT documents its body, and
every error status is documented with the one error shape."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from pydantic import BaseModel

from bubblescope.backend.body import json_body_doc
from bubblescope.backend.openapi import add_schemas, install_openapi
from tests.support import LiveServer

ERROR_RESPONSE = {"$ref": "#/components/schemas/ErrorResponse"}


@pytest.fixture(scope="module")
def document(sqlite_server: LiveServer) -> dict[str, Any]:
    response = httpx.get(f"{sqlite_server.url}/openapi.json", timeout=30)
    assert response.status_code == 200, response.text
    return dict(response.json())


def refs(value: Any, where: str = "#") -> Iterator[tuple[str, str]]:
    """Every ``$ref`` in ``value`` with the JSON pointer of the object holding it."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "$ref" and isinstance(item, str):
                yield where, item
            else:
                yield from refs(item, f"{where}/{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from refs(item, f"{where}/{index}")


def resolve(document: dict[str, Any], ref: str) -> Any:
    """The value a local ``$ref`` (a JSON pointer from the document's root) names; KeyError if none."""
    if not ref.startswith("#/"):
        raise KeyError(f"{ref} is not a local reference")
    value: Any = document
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        value = value[int(part)] if isinstance(value, list) else value[part]
    return value


def dangling(document: dict[str, Any]) -> list[str]:
    found = []
    for where, ref in refs(document):
        try:
            resolve(document, ref)
        except (KeyError, IndexError, ValueError):
            found.append(f"{where}: {ref}")
    return found


def operations(document: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method in ("get", "put", "post", "delete", "patch"):
                yield method, path, operation


def test_every_ref_resolves(document: dict[str, Any]) -> None:
    assert list(refs(document)), "the document should use references"
    assert dangling(document) == []


def test_every_post_and_put_documents_its_json_body(document: dict[str, Any]) -> None:
    writes = [(method, path, op) for method, path, op in operations(document) if method in ("post", "put")]
    assert len(writes) >= 7  # ingest, run, rank, rank end, capture, what-if, plan
    files = [
        (method, path, op)
        for method, path, op in writes
        if path.endswith(("/traces", "/flight-recorder", "/profiles/{profile_id}"))
    ]
    assert len(files) == 3  # a profiler trace's (imported, of a profile) and a Flight Recorder dump's: files
    for method, path, operation in files:
        body = operation.get("requestBody")
        assert body and body.get("required") is True, f"{method} {path}: {body}"
        assert "gzip" in body["description"] or "pickle" in body["description"], f"{method} {path}: {body}"
        [content] = body["content"].values()
        assert content["schema"] == {"type": "string", "format": "binary"}
        for status in ("400", "413", "422"):
            assert operation["responses"][status]["content"]["application/json"]["schema"] == ERROR_RESPONSE
    for method, path, operation in [write for write in writes if write not in files]:
        body = operation.get("requestBody")
        assert body and body.get("required") is True, f"{method} {path}: no required body"
        schema = body["content"]["application/json"]["schema"]
        assert set(schema) == {"$ref"}, f"{method} {path}: body schema is inline: {schema}"
        model = resolve(document, schema["$ref"])
        assert model.get("type") == "object" and model.get("properties"), f"{method} {path}: {model}"
        assert "Content-Encoding: gzip" in body["description"], f"{method} {path}: gzip not documented"
        for status in ("400", "413", "415", "422"):
            assert operation["responses"][status]["content"]["application/json"]["schema"] == ERROR_RESPONSE


def test_nested_body_models_are_components(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    ingest = resolve(document, "#/components/schemas/IngestBatchIn")
    assert ingest["properties"]["spans"] == {"$ref": "#/components/schemas/SpanColumns"}
    assert ingest["properties"]["rank"]["maximum"] == 2**31 - 1  # an int, not FastAPI's float
    for name in ("SpanColumns", "StepAggregateIn", "RunConfig", "ClusterIn", "ConfigIn", "GpuIn", "ModelIn"):
        assert name in schemas, name
    assert "$defs" not in str(document)


def test_every_error_status_has_the_error_shape(document: dict[str, Any]) -> None:
    shape = resolve(document, "#/components/schemas/ErrorResponse")
    assert shape["required"] == ["detail"]
    for method, path, operation in operations(document):
        for status, response in operation["responses"].items():
            if int(status) >= 400:
                schema = response["content"]["application/json"]["schema"]
                assert schema == ERROR_RESPONSE, f"{method} {path} {status}: {schema}"
        if "{run_key}" in path:
            assert "404" in operation["responses"], f"{method} {path}"


def test_an_error_answer_has_the_documented_shape(sqlite_server: LiveServer, document: dict[str, Any]) -> None:
    item = resolve(document, "#/components/schemas/ErrorDetail")
    with sqlite_server.client() as client:
        answers = [
            client.get("/api/v1/runs/no-such-run"),  # 404
            client.put("/api/v1/runs/x", content=b"{", headers={"Content-Type": "application/json"}),  # 400
            client.put("/api/v1/runs/x", json={"name": "", "world_size": 0}),  # 422
        ]
    for answer in answers:
        assert answer.status_code in (400, 404, 422), answer.text
        assert list(answer.json()) == ["detail"]
        for detail in answer.json()["detail"]:
            assert set(item["required"]) <= set(detail) <= set(item["properties"]), detail


# The hook on small apps of its own.
class Inner(BaseModel):
    value: int


class OpenApiProbeBody(BaseModel):
    inner: Inner
    more: list[Inner] = []


def test_a_body_model_and_its_nested_models_become_components() -> None:
    app = FastAPI()

    @app.post("/things", openapi_extra=json_body_doc(OpenApiProbeBody))
    async def post_thing(request: Request) -> None:
        return None

    install_openapi(app)
    document = app.openapi()
    assert app.openapi() is document  # cached
    assert dangling(document) == []
    body = document["paths"]["/things"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/OpenApiProbeBody"}
    assert resolve(document, "#/components/schemas/OpenApiProbeBody")["properties"]["inner"] == {
        "$ref": "#/components/schemas/Inner"
    }


def test_a_schema_name_used_twice_is_refused_not_hidden() -> None:
    components: dict[str, Any] = {"Inner": {"type": "string"}}
    with pytest.raises(RuntimeError, match="two different schemas named Inner"):
        add_schemas(components, [OpenApiProbeBody])

    class OpenApiProbeBody2(BaseModel):
        pass

    OpenApiProbeBody2.__name__ = "OpenApiProbeBody"
    with pytest.raises(TypeError, match="two body models are named OpenApiProbeBody"):
        json_body_doc(OpenApiProbeBody2)


def test_an_error_status_a_route_declares_gets_the_error_shape_and_retry_after() -> None:
    app = FastAPI()

    @app.get("/busy", responses={429: {"description": "too many"}})
    def busy() -> dict[str, str]:
        return {}

    install_openapi(app)
    declared = app.openapi()["paths"]["/busy"]["get"]["responses"]["429"]
    assert declared["description"] == "too many"
    assert declared["content"]["application/json"]["schema"] == ERROR_RESPONSE
    assert declared["headers"]["Retry-After"]["required"] is True


def test_without_auth_the_document_asks_for_no_credential(document: dict[str, Any]) -> None:
    """The probe's finding: bearer security was advertised by a service that asks for none (schemathesis's
    ignored_auth then fails every operation). With --auth the document says what each needs
    (tests/auth/test_openapi_access.py)."""
    assert "securitySchemes" not in document.get("components", {})
    for method, path, operation in operations(document):
        assert "security" not in operation, (method, path)
        if not path.endswith("/session"):  # signing in checks the token it is given, auth or not
            assert "401" not in operation["responses"], (method, path)


def test_rules_beyond_the_schema_are_in_the_operations_descriptions(document: dict[str, Any]) -> None:
    """What JSON Schema cannot state is said in words on the operation (the fuzz test exempts those operations
    from positive_data_acceptance, and nothing else)."""
    from bubblescope.backend.openapi import RULES_BEYOND_THE_SCHEMA

    for (method, path), rule in RULES_BEYOND_THE_SCHEMA.items():
        assert rule in document["paths"][path][method.lower()]["description"], (method, path)
