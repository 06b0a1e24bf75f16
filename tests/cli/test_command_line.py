"""The command line as a first-time user meets it: every subcommand's help explains it and its defaults; a
command given without its subcommand shows its help; a taken port is one line and exit 2 before any URL."""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from bubblescope.analysis.planner.specs import CHOICES
from bubblescope.cli import build_parser

TRIVIAL_DEFAULTS = (None, False, [], argparse.SUPPRESS)


def subcommands(
    parser: argparse.ArgumentParser, path: str = "bubblescope"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield f"{path} {name}", sub
                yield from subcommands(sub, f"{path} {name}")


def test_every_subcommand_explains_itself_and_each_option_its_default() -> None:
    found = list(subcommands(build_parser()))
    assert {"bubblescope serve", "bubblescope demo", "bubblescope db upgrade", "bubblescope token create"} <= {
        name for name, _ in found
    }
    for name, parser in found:
        assert parser.description, f"{name} --help has no description"
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            assert action.help, f"{name} {action.option_strings or action.dest}: no help text"
            if action.default not in TRIVIAL_DEFAULTS and not action.required:
                assert "default" in action.help, f"{name} {action.option_strings}: its default is not said"


def test_plan_config_help_names_every_few_word_field_with_the_words_the_planner_takes() -> None:
    plan = dict(subcommands(build_parser()))["bubblescope plan"]
    config = next(a for a in plan._actions if "--config" in a.option_strings)
    for field, words in CHOICES.items():
        assert f"{field} ({'|'.join(words)})" in config.help, (field, config.help)


@pytest.mark.parametrize("command", ["token", "db"])
def test_a_command_without_its_subcommand_shows_its_help(command: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bubblescope.cli", command], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and f"usage: bubblescope {command}" in done.stderr, done
    assert "required" not in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("command", [["serve"], ["demo", "--steps", "2"]])
def test_a_taken_port_is_one_line_and_exit_2_before_any_url(command: list[str], tmp_path: object) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "bubblescope.cli", *command, "--port", str(port), "--db", f"{tmp_path}/x.db"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 2, done
    assert done.stdout == "" and "http://" not in done.stderr, done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"port {port} on 127.0.0.1 is taken" in lines[0] and "--port" in lines[0], lines
