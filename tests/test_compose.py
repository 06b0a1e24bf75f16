"""docker-compose.yml cannot run here (no Docker engine); parse it and check its wiring."""

from __future__ import annotations

import yaml

from tests.support import REPO


def test_compose_runs_migrations_before_the_api_on_postgres() -> None:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    services = compose["services"]
    assert set(services) == {"db", "migrate", "api"}
    assert services["db"]["image"].startswith("postgres:15")
    assert "bubblescope db upgrade" in services["migrate"]["command"]
    assert services["migrate"]["depends_on"]["db"]["condition"] == "service_healthy"
    api = services["api"]
    assert api["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert "bubblescope serve" in api["command"] and "postgresql+psycopg://" in api["command"]
    assert "8765:8765" in api["ports"] and "--port 8765" in api["command"]
    user = services["db"]["environment"]["POSTGRES_USER"]
    assert f"{user}:" in api["command"] and "pgdata" in compose["volumes"]
