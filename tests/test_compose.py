"""docker-compose.yml cannot run here (no Docker engine): parse it, check its wiring, and run what its
services run natively (the migrate service's commands, the api's ``serve`` with its own options)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from bubblescope.backend.settings import from_options
from bubblescope.cli import build_parser
from tests.deploy.files import COMPOSE, MissingVariable, compose, compose_raw, env_example, interpolate, variables_used
from tests.support import REPO, free_port, wait_until

TOKEN_VARIABLES = {
    "admin": "BUBBLESCOPE_ADMIN_TOKEN",
    "ingest": "BUBBLESCOPE_INGEST_TOKEN",
    "read": "BUBBLESCOPE_READ_TOKEN",
}
REQUIRED = {"BUBBLESCOPE_DB_PASSWORD", *TOKEN_VARIABLES.values()}
# Values of the kind docs/deployment.md says to generate (bs_ + 43 URL-safe characters).
ENV = {
    "BUBBLESCOPE_DB_PASSWORD": "bs_pw-0123456789abcdefghijklmnopqrstuvwxyzABC",
    "BUBBLESCOPE_ADMIN_TOKEN": "bs_admin-0123456789abcdefghijklmnopqrstuvwxyzAB",
    "BUBBLESCOPE_INGEST_TOKEN": "bs_ingest-0123456789abcdefghijklmnopqrstuvwxyzA",
    "BUBBLESCOPE_READ_TOKEN": "bs_read-0123456789abcdefghijklmnopqrstuvwxyzABC",
}
OFFICIAL_IMAGES = ("postgres:", "prom/prometheus:", "prom/alertmanager:")


def command_words(service: dict[str, Any]) -> list[str]:
    """The service's command as Compose hands it to the entrypoint (a string is split like a shell's)."""
    command = service.get("command", [])
    return shlex.split(command) if isinstance(command, str) else list(command)


def services() -> dict[str, Any]:
    resolved: dict[str, Any] = compose(ENV)["services"]
    return resolved


def test_compose_runs_migrations_then_the_api_on_postgres() -> None:
    stack = compose(ENV)
    parts = stack["services"]
    assert set(parts) == {"db", "migrate", "api", "prometheus", "alertmanager"}
    assert parts["db"]["image"].startswith("postgres:15")
    assert parts["migrate"]["depends_on"]["db"]["condition"] == "service_healthy"
    api = parts["api"]
    assert api["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    words = command_words(api)
    assert words[:1] == ["serve"] and words[words.index("--port") + 1] == "8765"
    assert "8765:8765" in api["ports"]
    assert "--db" not in words  # the URL holds the password: the environment carries it, not the command line
    db_url = api["environment"]["BUBBLESCOPE_DB"]
    user, password = parts["db"]["environment"]["POSTGRES_USER"], parts["db"]["environment"]["POSTGRES_PASSWORD"]
    assert db_url == f"postgresql+psycopg://{user}:{password}@db:5432/{parts['db']['environment']['POSTGRES_DB']}"
    assert parts["migrate"]["environment"]["BUBBLESCOPE_DB"] == db_url
    assert {"pgdata", "prometheus-data", "alertmanager-data"} <= set(stack["volumes"])
    # The readiness probe needs no token, and answers on the port serve listens on.
    assert "/api/v1/ready" in " ".join(api["healthcheck"]["test"]) and ":8765/" in " ".join(api["healthcheck"]["test"])


def test_every_service_runs_the_built_image_or_an_official_one() -> None:
    for name, service in services().items():
        if "build" in service:
            assert service["build"] in (".", {"context": "."}), name
            assert service["image"].startswith("bubblescope:"), name
        else:
            image = service["image"]
            assert image.startswith(OFFICIAL_IMAGES), f"{name}: {image}"
            assert ":" in image and not image.endswith(":latest"), f"{name}: pin a version ({image})"
    assert "build" in services()["api"] and "build" in services()["migrate"]
    assert (REPO / "Dockerfile").is_file()


def test_nothing_is_installed_at_start_nor_from_a_mount() -> None:
    """The old compose ran ``pip install /app[server]`` in every container from a read-only mount of the
    tree, which cannot take the build's bubblescope.egg-info. The package is the image's now."""
    text = COMPOSE.read_text()
    for name, service in services().items():
        started = " ".join([*command_words(service), *(service.get("entrypoint") or [])])
        assert not re.search(r"\b(pip|pip3|uv|poetry|setup\.py|apt-get|apk)\b", started), f"{name}: {started}"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith((".", "/")):  # a bind mount: only the deploy configs, read-only
                assert source.startswith("./deploy/") and (REPO / source).is_file(), f"{name}: {volume}"
                assert volume.endswith(":ro"), f"{name}: {volume}"
        assert "working_dir" not in service, name
    assert "/app" not in text and "pip install" not in text


def test_the_api_is_served_with_auth_and_pushes_to_alertmanager() -> None:
    words = command_words(services()["api"])
    args = build_parser().parse_args(words)  # the real command line: every option exists and parses
    assert args.host == "0.0.0.0" and args.auth and not args.insecure
    assert args.alertmanager_urls == ["http://alertmanager:9093"]
    assert args.external_url == "http://localhost:8765"  # the default when BUBBLESCOPE_EXTERNAL_URL is unset
    settings = from_options(args)
    assert settings.auth and settings.alertmanager_urls == ("http://alertmanager:9093",)
    custom = compose({**ENV, "BUBBLESCOPE_EXTERNAL_URL": "https://bubblescope.example.org"})
    assert build_parser().parse_args(command_words(custom["services"]["api"])).external_url == (
        "https://bubblescope.example.org"
    )


def test_secrets_come_from_variables_that_must_be_set() -> None:
    used = variables_used()
    assert {name for name, op in used.items() if op == ":?"} == REQUIRED
    with pytest.raises(MissingVariable) as missing:
        compose({name: value for name, value in ENV.items() if name != "BUBBLESCOPE_READ_TOKEN"})
    assert missing.value.name == "BUBBLESCOPE_READ_TOKEN"
    with pytest.raises(MissingVariable):
        compose({**ENV, "BUBBLESCOPE_ADMIN_TOKEN": ""})  # set but empty is refused too
    # Nothing secret is written in the file: each value that holds one is a variable.
    raw = compose_raw()["services"]
    assert raw["db"]["environment"]["POSTGRES_PASSWORD"].startswith("${BUBBLESCOPE_DB_PASSWORD:?")
    for variable in TOKEN_VARIABLES.values():
        assert raw["migrate"]["environment"][variable].startswith(f"${{{variable}:?")
    # .env.example names every variable the file reads, with no value for a secret.
    example = env_example()
    assert set(used) <= set(example) | {"BUBBLESCOPE_IMAGE_TAG"}, set(used) - set(example)
    assert all(example[name] == "" for name in REQUIRED)
    gitignored = (REPO / ".gitignore").read_text().splitlines()
    assert ".env" in gitignored


def test_migrate_stores_an_admin_an_ingest_and_a_read_token_from_variables() -> None:
    migrate_service = services()["migrate"]
    assert migrate_service["entrypoint"] == ["/bin/sh", "-c"]
    (script,) = command_words(migrate_service)
    steps = [shlex.split(step) for step in script.split("&&")]
    assert steps[0][:3] == ["bubblescope", "db", "upgrade"]
    created = {}
    for step in steps[1:]:
        assert step[:3] == ["bubblescope", "token", "create"], step
        options = dict(zip(step[3::2], step[4::2]))
        assert "--db" not in options  # $BUBBLESCOPE_DB expanded there would put the password in ps's listing
        created[options["--scope"]] = options["--value-env"]
    assert created == TOKEN_VARIABLES
    assert set(TOKEN_VARIABLES.values()) | {"BUBBLESCOPE_DB"} <= set(migrate_service["environment"])


def test_prometheus_scrapes_with_the_read_token_and_its_configs_are_mounted() -> None:
    stack = compose(ENV)
    prometheus = stack["services"]["prometheus"]
    mounts = {v.split(":")[1]: REPO / v.split(":")[0] for v in prometheus["volumes"] if v.startswith("./")}
    config_path = next(arg.split("=", 1)[1] for arg in prometheus["command"] if arg.startswith("--config.file="))
    config = yaml.safe_load(mounts[config_path].read_text())
    for rule_file in config["rule_files"]:  # relative to the config's folder, in the container as here
        assert str(Path(config_path).parent / rule_file) in mounts, rule_file
    (job,) = [job for job in config["scrape_configs"] if job["job_name"] == "bubblescope"]
    assert job["static_configs"][0]["targets"] == ["api:8765"]
    secret_file = job["authorization"]["credentials_file"]
    secret = Path(secret_file).name
    assert secret_file == f"/run/secrets/{secret}" and secret in prometheus["secrets"]
    assert stack["secrets"][secret] == {"environment": "BUBBLESCOPE_READ_TOKEN"}
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["alertmanager:9093"]
    assert "--enable-feature=expand-external-labels" in prometheus["command"]
    assert config["global"]["external_labels"]["bubblescope_url"] == "${BUBBLESCOPE_EXTERNAL_URL}"
    assert "BUBBLESCOPE_EXTERNAL_URL" in prometheus["environment"]
    alertmanager = stack["services"]["alertmanager"]
    am_mounts = {v.split(":")[1]: REPO / v.split(":")[0] for v in alertmanager["volumes"] if v.startswith("./")}
    am_config = next(arg.split("=", 1)[1] for arg in alertmanager["command"] if arg.startswith("--config.file="))
    assert am_mounts[am_config].is_file()


def test_only_the_api_is_published_beyond_the_host() -> None:
    for name, service in services().items():
        for port in service.get("ports", []):
            if name == "api":
                assert port == "8765:8765"
            else:
                assert port.startswith("127.0.0.1:"), f"{name}: {port} has no authentication of its own"
    assert "ports" not in services()["db"]


@pytest.mark.slow  # about 20 s: eight command-line runs (1.5 s each to import the server) and a server
def test_migrate_then_api_natively_with_tokens(tmp_path: Path) -> None:
    """The migrate service's script as its shell runs it (twice: it runs at every ``up``), on SQLite in
    place of PostgreSQL, then the api's ``serve`` command: /metrics wants the read token."""
    database = f"sqlite:///{tmp_path / 'bubblescope.db'}"
    migrate_service = services()["migrate"]
    bin_dir = Path(shutil.which("bubblescope") or Path(sys.executable).parent / "bubblescope").parent
    env = {
        **os.environ,
        **migrate_service["environment"],
        "BUBBLESCOPE_DB": database,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
    }
    (script,) = command_words(migrate_service)
    for attempt in (1, 2):
        done = subprocess.run(
            [*migrate_service["entrypoint"], script], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, f"attempt {attempt}: {done.stdout}\n{done.stderr}"
    with sqlite3.connect(tmp_path / "bubblescope.db") as connection:
        stored = dict(connection.execute("SELECT name, scope FROM api_tokens WHERE revoked_at IS NULL").fetchall())
    assert sorted(stored.values()) == ["admin", "ingest", "read"], stored

    words = command_words(services()["api"])
    port = free_port()
    words[words.index("--port") + 1] = str(port)
    log = open(tmp_path / "api.log", "wb")  # noqa: SIM115 (the server writes it until it stops)
    server = subprocess.Popen([str(bin_dir / "bubblescope"), *words], stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            assert server.poll() is None, (tmp_path / "api.log").read_text()[-3000:]
            try:
                return httpx.get(f"{url}/api/v1/ready", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(ready, 60, "the api to be ready", interval_s=0.2)
        assert httpx.get(f"{url}/metrics", timeout=10).status_code == 401
        bearer = {"Authorization": f"Bearer {ENV['BUBBLESCOPE_INGEST_TOKEN']}"}
        assert httpx.get(f"{url}/metrics", headers=bearer, timeout=10).status_code == 403
        bearer = {"Authorization": f"Bearer {ENV['BUBBLESCOPE_READ_TOKEN']}"}
        scraped = httpx.get(f"{url}/metrics", headers=bearer, timeout=10)
        assert scraped.status_code == 200 and "bubblescope_ingest_batches_total" in scraped.text
    finally:
        server.terminate()
        server.wait(30)
        log.close()


def test_no_password_is_on_any_command_line() -> None:
    """The probe's finding: compose passed the database password inside serve's --db, so `docker inspect` and
    `ps` showed it. Every command (and entrypoint) of every service is free of every secret of .env."""
    secrets = [value for name, value in ENV.items() if "PASSWORD" in name or "TOKEN" in name]
    assert secrets
    for name, service in services().items():
        words = " ".join(command_words(service) + list(service.get("entrypoint", [])))
        for secret in secrets:
            assert secret not in words, f"{name}'s command line holds a secret"


def test_interpolation_follows_compose() -> None:
    env = {"SET": "x", "EMPTY": ""}
    assert interpolate("a$$b ${SET} $SET ${UNSET:-d} ${EMPTY:-d} ${EMPTY-d} ${UNSET}", env) == "a$b x x d d  "
    with pytest.raises(MissingVariable):
        interpolate("${EMPTY:?needed}", env)
    assert interpolate("${EMPTY?needed}", env) == ""
