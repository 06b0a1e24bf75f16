"""deploy/alertmanager/alertmanager.yml as Debian's ``amtool`` checks it: as it stands, and with each of its
commented receivers (PagerDuty, Slack) uncommented as its comments say; their secrets come from files
that docker-compose.yml knows how to mount."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.files import COMPOSE, ENV_EXAMPLE, enable_examples, example_names
from tests.support import REPO, require_program

AMTOOL = "/usr/bin/amtool"
CONFIG = REPO / "deploy" / "alertmanager" / "alertmanager.yml"
EXAMPLES = {"pagerduty", "slack"}


def amtool_check(config: Path) -> subprocess.CompletedProcess[str]:
    require_program(AMTOOL, "prometheus-alertmanager")
    return subprocess.run([AMTOOL, "check-config", str(config)], capture_output=True, text=True, timeout=60)


def test_the_config_is_valid_as_it_stands() -> None:
    checked = amtool_check(CONFIG)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    config = yaml.safe_load(CONFIG.read_text())
    assert [receiver["name"] for receiver in config["receivers"]] == ["default"]
    assert config["route"]["receiver"] == "default" and "run" in config["route"]["group_by"]


@pytest.mark.parametrize("enabled", [{"pagerduty"}, {"slack"}, EXAMPLES], ids=lambda names: "+".join(sorted(names)))
def test_each_commented_example_is_valid_once_uncommented(enabled: set[str], tmp_path: Path) -> None:
    text = CONFIG.read_text()
    assert example_names(text) == EXAMPLES
    config_file = tmp_path / "alertmanager.yml"
    config_file.write_text(enable_examples(text, enabled))
    checked = amtool_check(config_file)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    config = yaml.safe_load(config_file.read_text())
    receivers = {receiver["name"]: receiver for receiver in config["receivers"]}
    assert set(receivers) == {"default", *enabled}
    routed = {route["receiver"] for route in config["route"]["routes"]}
    assert routed == enabled
    if "pagerduty" in enabled:
        (pagerduty,) = receivers["pagerduty"]["pagerduty_configs"]
        assert pagerduty["routing_key_file"] == "/run/secrets/pagerduty_routing_key"
        (page_route,) = [route for route in config["route"]["routes"] if route["receiver"] == "pagerduty"]
        assert page_route["matchers"] == ['severity="critical"'] and page_route["continue"] is True


def test_a_broken_example_would_be_caught(tmp_path: Path) -> None:
    """The check has teeth: a receiver the route names but nobody defines is refused."""
    text = enable_examples(CONFIG.read_text(), EXAMPLES).replace("- name: pagerduty", "- name: pagerduty-typo")
    config_file = tmp_path / "alertmanager.yml"
    config_file.write_text(text)
    assert amtool_check(config_file).returncode != 0


def test_no_secret_is_written_in_the_file_and_compose_can_mount_each() -> None:
    text = enable_examples(CONFIG.read_text(), EXAMPLES)
    # Keys and webhook URLs only ever come from files.
    assert not re.search(r"^\s*-?\s*(routing_key|service_key|api_url|api_key|url_file_contents):", text, re.M)
    compose_text = COMPOSE.read_text()
    env_example = ENV_EXAMPLE.read_text()
    for secret in re.findall(r"_file: /run/secrets/(\w+)", text):
        # docker-compose.yml's commented lines that give the container that file, from a variable that
        # .env.example names.
        assert re.search(rf"^\s*#\s+- {secret}\s*$", compose_text, re.M), f"alertmanager's secrets: - {secret}"
        declared = re.search(rf"^\s*# {secret}:\s*\n\s*#\s+environment: (\w+)\s*$", compose_text, re.M)
        assert declared, f"top-level secret {secret} from an environment variable"
        assert re.search(rf"^# {declared[1]}=\s*$", env_example, re.M), declared[1]
