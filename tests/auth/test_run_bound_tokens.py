"""Tokens bound to runs (docs/access.md): one team's ingest token cannot register, overwrite, write to or end
another team's run, and a read token bound to a team's runs sees those alone. Real server, SQLite."""

from __future__ import annotations

import uuid

import httpx

from bubblescope.backend.auth.scopes import Scope
from tests.auth.support import Tokens, bearer, make_token
from tests.support import LiveServer, assert_names, ingest_batch


def _put_run(client: httpx.Client, key: str, token: str) -> httpx.Response:
    return client.put(f"/api/v1/runs/{key}", json={"name": key, "world_size": 2}, headers=bearer(token))


def test_another_teams_ingest_token_cannot_touch_a_run(auth_server: LiveServer, auth_db: str, tokens: Tokens) -> None:
    """The probe's finding: with team B's ingest token, renaming team A's run, overwriting its rank and ending it
    failed were all 200. Now each is 403 naming the run key, and team A's run is as team A left it."""
    team = uuid.uuid4().hex[:6]
    team_a = make_token(auth_db, Scope.INGEST, runs=[f"a{team}-*"])
    team_b = make_token(auth_db, Scope.INGEST, runs=[f"b{team}-*"])
    run_a = f"a{team}-train"
    admin = bearer(tokens.valid[Scope.ADMIN])
    with auth_server.client() as client:
        assert _put_run(client, run_a, team_a).status_code == 200
        rank = {"host": "node-a", "pid": 1}
        assert client.put(f"/api/v1/runs/{run_a}/ranks/0", json=rank, headers=bearer(team_a)).status_code == 200
        assert client.post("/api/v1/ingest", json=ingest_batch(run_a), headers=bearer(team_a)).status_code == 202

        renamed = client.put(f"/api/v1/runs/{run_a}", json={"name": "pwned", "world_size": 1}, headers=bearer(team_b))
        assert_names(renamed, 403, ["path", "run_key"], f"'{run_a}' is not one of them")
        overwritten = client.put(f"/api/v1/runs/{run_a}/ranks/0", json={**rank, "host": "evil"}, headers=bearer(team_b))
        assert overwritten.status_code == 403
        ended = client.put(
            f"/api/v1/runs/{run_a}/ranks/0/end", json={"outcome": "failed", "error": "x"}, headers=bearer(team_b)
        )
        assert ended.status_code == 403
        written = client.post("/api/v1/ingest", json=ingest_batch(run_a, seq=1, step=1), headers=bearer(team_b))
        assert_names(written, 403, ["body", "run_key"], f"'{run_a}' is not one of them")

        run = client.get(f"/api/v1/runs/{run_a}", headers=admin).json()
        assert run["name"] == run_a and run["world_size"] == 2 and run["state"] != "failed"
        assert [r["host"] for r in run["ranks"] if r["rank"] == 0] == ["node-a"]
        assert run["step_count"] == 1  # team B's batch was not stored
        # team B still writes its own runs
        assert _put_run(client, f"b{team}-train", team_b).status_code == 200


def test_a_read_token_bound_to_a_teams_runs_sees_those_alone(
    auth_server: LiveServer, auth_db: str, tokens: Tokens
) -> None:
    team = uuid.uuid4().hex[:6]
    ingest = tokens.valid[Scope.INGEST]  # an unbound token: every run, as every token made before binding was
    mine, theirs = f"r{team}-1", f"s{team}-1"
    reader = make_token(auth_db, Scope.READ, runs=[f"r{team}-*"])
    with auth_server.client() as client:
        for key in (mine, theirs):
            assert _put_run(client, key, ingest).status_code == 200
        listed = client.get("/api/v1/runs", params={"limit": 500}, headers=bearer(reader))
        assert listed.status_code == 200
        assert [run["key"] for run in listed.json()] == [mine]
        everyone = client.get("/api/v1/runs", params={"limit": 500}, headers=bearer(tokens.valid[Scope.READ]))
        assert {mine, theirs} <= {run["key"] for run in everyone.json()}

        assert client.get(f"/api/v1/runs/{mine}", headers=bearer(reader)).status_code == 200
        assert_names(client.get(f"/api/v1/runs/{theirs}", headers=bearer(reader)), 403, ["path", "run_key"], theirs)
        alerts = client.get("/api/v1/alerts", params={"run": theirs}, headers=bearer(reader))
        assert_names(alerts, 403, ["query", "run"], theirs)
        assert client.get("/api/v1/alerts", headers=bearer(reader)).status_code == 200
        assert_names(client.get("/metrics", headers=bearer(reader)), 403, ["header", "Authorization"], "every run")
        # a session opened with it is bound the same way
        session = client.post("/api/v1/session", json={"token": reader})
        assert session.status_code == 200
        cookie = {"bubblescope_session": session.cookies["bubblescope_session"]}
        assert httpx.get(f"{auth_server.url}/api/v1/runs/{theirs}", cookies=cookie).status_code == 403


def test_binding_is_refused_cleanly_where_it_cannot_hold(auth_server: LiveServer, tokens: Tokens) -> None:
    admin = bearer(tokens.valid[Scope.ADMIN])
    with auth_server.client() as client:

        def create(body: dict[str, object]) -> httpx.Response:
            return client.post("/api/v1/tokens", json={"name": f"t-{uuid.uuid4().hex[:6]}", **body}, headers=admin)

        assert_names(create({"scope": "admin", "runs": ["a-*"]}), 422, ["body", "runs"], "admin token")
        assert_names(create({"scope": "ingest", "runs": []}), 422, ["body", "runs"], "")
        assert_names(create({"scope": "ingest", "runs": ["a*b"]}), 422, ["body", "runs", 0], "")
        assert_names(create({"scope": "ingest", "runs": ["*"]}), 422, ["body", "runs", 0], "")
        made = create({"scope": "ingest", "runs": ["team-z-*", "nightly"]})
        assert made.status_code == 201, made.text
        assert made.json()["runs"] == ["team-z-*", "nightly"]
        listed = {t["name"]: t["runs"] for t in client.get("/api/v1/tokens", headers=admin).json()}
        assert listed[made.json()["name"]] == ["team-z-*", "nightly"]
        assert None in listed.values()  # the unbound ones say so
