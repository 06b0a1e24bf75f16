"""The service's settings: one object, one ``serve`` option per field, and docs/limits.md's table generated
from it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

from bubblescope.backend.settings import ServiceSettings, from_options, limits_table, option_name
from bubblescope.cli import build_parser
from tests.support import REPO


def test_the_docs_table_is_generated_from_the_settings() -> None:
    generated = limits_table()
    document = (REPO / "docs" / "limits.md").read_text()
    assert generated in document, "regenerate with: python -m bubblescope.backend.settings"
    done = subprocess.run(
        [sys.executable, "-m", "bubblescope.backend.settings"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout == generated, done.stderr


def test_every_setting_is_a_serve_option_read_back_into_the_object() -> None:
    given = {
        "--max-batch-spans": "5",
        "--ingest-in-flight": "3",
        "--retry-after": "7",
        "--silent-after": "1.5",
        "--captures-per-hour": "2",
    }
    argv = ["serve", *[part for option, value in given.items() for part in (option, value)]]
    argv += ["--allowed-host", "a.example", "--allowed-host", "b.example", "--cors-origin", "https://c.example"]
    settings = from_options(build_parser().parse_args(argv))
    assert (settings.max_batch_spans, settings.ingest_in_flight, settings.retry_after_s) == (5, 3, 7)
    assert (settings.silent_after_s, settings.captures_per_hour) == (1.5, 2)
    assert settings.allowed_hosts == ("a.example", "b.example")
    assert settings.cors_origins == ("https://c.example",)
    help_text = subprocess.run(
        [sys.executable, "-m", "bubblescope.cli", "serve", "--help"], capture_output=True, text=True, timeout=60
    ).stdout
    for setting in dataclasses.fields(ServiceSettings):
        assert option_name(setting) in help_text, setting.name
    assert from_options(build_parser().parse_args(["serve"])) == ServiceSettings()


def test_the_host_allowlist_defaults_by_the_address_served() -> None:
    settings = ServiceSettings()
    assert settings.hosts_for("127.0.0.1") == settings.hosts_for("::1") == ("localhost", "127.0.0.1", "::1")
    assert settings.hosts_for("0.0.0.0") == ("*",)
    assert ServiceSettings(allowed_hosts=("x.example",)).hosts_for("127.0.0.1") == ("x.example",)
