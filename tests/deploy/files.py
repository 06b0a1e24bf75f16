"""Reading the deployment files as Docker and Compose read them, so that tests can check them and run
what they say natively: Compose's variable interpolation, the Dockerfile's instructions, and the build
context that .dockerignore leaves."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.support import REPO

COMPOSE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
ENV_EXAMPLE = REPO / ".env.example"


# ---- Compose ----------------------------------------------------------------------------------------

_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}"
    r"|(?P<named>[A-Za-z_][A-Za-z0-9_]*))"
)


class MissingVariable(Exception):
    """A ``${NAME:?message}`` whose variable is unset or empty: ``docker compose`` refuses to start."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """Compose's interpolation of one value: ``$$``, ``$NAME``, ``${NAME}``, ``${NAME:-default}``,
    ``${NAME-default}``, ``${NAME:?error}``, ``${NAME?error}``."""

    def replace(match: re.Match[str]) -> str:
        if match["escaped"]:
            return "$"
        name = match["braced"] or match["named"]
        value = env.get(name)
        op = match["op"]
        if op in (":-", ":?"):
            unset = not value
        else:
            unset = value is None
        if op and op.endswith("-") and unset:
            return interpolate(match["arg"], env)
        if op and op.endswith("?") and unset:
            raise MissingVariable(name, match["arg"])
        return value or ""

    return _VARIABLE.sub(replace, text)


def _interpolated(node: Any, env: Mapping[str, str]) -> Any:
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [_interpolated(item, env) for item in node]
    if isinstance(node, dict):
        return {key: _interpolated(value, env) for key, value in node.items()}
    return node


def compose_raw() -> dict[str, Any]:
    """docker-compose.yml as written (merge keys resolved, variables not)."""
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def compose(env: Mapping[str, str]) -> dict[str, Any]:
    """docker-compose.yml as ``docker compose config`` resolves it with the variables ``env``."""
    resolved: dict[str, Any] = _interpolated(compose_raw(), env)
    return resolved


def variables_used() -> dict[str, str | None]:
    """Every variable docker-compose.yml reads (outside comments): name -> its operator (``:?``, ``:-``...)."""
    found: dict[str, str | None] = {}

    def visit(node: Any) -> None:
        if isinstance(node, str):
            for match in _VARIABLE.finditer(node):
                name = match["braced"] or match["named"]
                if name:
                    found.setdefault(name, match["op"])
        elif isinstance(node, list):
            for item in node:
                visit(item)
        elif isinstance(node, dict):
            for value in node.values():
                visit(value)

    visit(compose_raw())
    return found


def env_example() -> dict[str, str]:
    """``.env.example``'s assignments (NAME=value lines; comments skipped)."""
    pairs: dict[str, str] = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            pairs[name.strip()] = value.strip()
    return pairs


# ---- Dockerfile -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, COPY ...
    arguments: str  # as written, continuation lines joined

    def json_form(self) -> list[str] | None:
        """The arguments of the exec form (``["a", "b"]``), or None for the shell form."""
        try:
            value = json.loads(self.arguments)
        except ValueError:
            return None
        return value if isinstance(value, list) and all(isinstance(item, str) for item in value) else None


def dockerfile_instructions(text: str | None = None) -> list[Instruction]:
    """The Dockerfile's instructions in order: comments and blank lines dropped, ``\\`` continuations
    joined (a comment line inside a continuation is dropped, as Docker does)."""
    lines = (DOCKERFILE.read_text() if text is None else text).splitlines()
    instructions: list[Instruction] = []
    pending: list[str] = []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        continued = stripped.endswith("\\")
        pending.append(stripped[:-1].rstrip() if continued else stripped)
        if not continued:
            joined = " ".join(part for part in pending if part)
            keyword, _, arguments = joined.partition(" ")
            instructions.append(Instruction(keyword.upper(), arguments.strip()))
            pending = []
    assert not pending, f"the Dockerfile ends inside a continued line: {pending}"
    return instructions


def dockerfile_env(instructions: list[Instruction]) -> dict[str, str]:
    """The ENV instructions' variables (``ENV A=1 B=2`` form)."""
    env: dict[str, str] = {}
    for instruction in instructions:
        if instruction.keyword == "ENV":
            for pair in instruction.arguments.split():
                name, sep, value = pair.partition("=")
                assert sep, f"ENV {instruction.arguments}: write NAME=value"
                env[name] = value.strip("\"'")
    return env


# ---- .dockerignore ----------------------------------------------------------------------------------


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """Docker's pattern (Go's filepath.Match plus ``**``), anchored at the context's root."""
    out = []
    index = 0
    while index < len(pattern):
        char = pattern[index]
        if pattern.startswith("**", index):
            index += 2
            if pattern.startswith("/", index):  # "**/" : any number of leading directories, none included
                index += 1
                out.append("(?:.*/)?")
            else:
                out.append(".*")
            continue
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        else:
            out.append(re.escape(char))
        index += 1
    return re.compile("".join(out))


def dockerignore_rules(text: str | None = None) -> list[tuple[bool, re.Pattern[str]]]:
    """(excludes, pattern) per line: ``!`` lines re-include. The last rule that matches decides."""
    rules = []
    for line in (DOCKERIGNORE.read_text() if text is None else text).splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = line[1:].strip() if negated else line
        pattern = pattern.strip("/")
        rules.append((not negated, _pattern_regex(pattern)))
    return rules


def ignored(relative: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether Docker leaves ``relative`` (a path in the context, ``/``-separated) out of the context: a
    pattern that matches the path or one of its parent directories applies to it."""
    parts = relative.split("/")
    candidates = ["/".join(parts[: end + 1]) for end in range(len(parts))]
    excluded = False
    for excludes, pattern in rules:
        if any(pattern.fullmatch(candidate) for candidate in candidates):
            excluded = excludes
    return excluded


def context_files(source: Path, rules: list[tuple[bool, re.Pattern[str]]] | None = None) -> Iterator[str]:
    """The files of the build context rooted at ``source``, relative and ``/``-separated."""
    rules = dockerignore_rules() if rules is None else rules
    for path in sorted(source.rglob("*")):
        if path.is_file() and not path.is_symlink():
            relative = path.relative_to(source).as_posix()
            if not ignored(relative, rules):
                yield relative


def docker_copy(source: Path, destination: Path) -> list[str]:
    """``COPY . <destination>``: the context's files, with their directories, into ``destination``, writable
    there (the build runs as root, who owns what COPY writes), whatever their mode in the source."""
    copied = []
    for relative in context_files(source):
        target = destination / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / relative, target)
        target.chmod((source / relative).stat().st_mode | 0o200)
        copied.append(relative)
    return copied


# ---- Commented examples -----------------------------------------------------------------------------

_EXAMPLE_START = re.compile(r"^\s*# >>> (?P<name>[\w-]+)\s*$")
_EXAMPLE_END = re.compile(r"^\s*# <<< (?P<name>[\w-]+)\s*$")


def example_names(text: str) -> set[str]:
    return {match["name"] for line in text.splitlines() if (match := _EXAMPLE_START.match(line))}


def enable_examples(text: str, names: set[str]) -> str:
    """``text`` with the commented examples ``names`` uncommented: between ``# >>> name`` and ``# <<< name``,
    one ``# `` is removed from each line (``##`` lines stay comments); the markers stay as comments."""
    lines = []
    current: str | None = None
    for line in text.splitlines():
        if start := _EXAMPLE_START.match(line):
            assert current is None, f"example {start['name']} starts inside {current}"
            current = start["name"]
        elif end := _EXAMPLE_END.match(line):
            assert end["name"] == current, f"example {end['name']} ends, {current} was open"
            current = None
        elif current in names:
            assert re.match(r"^\s*#( |#|$)", line), f"example {current}: an uncommented line: {line!r}"
            line = re.sub(r"^(\s*)# ", r"\1", line, count=1)
        lines.append(line)
    assert current is None, f"example {current} is not closed"
    return "\n".join(lines) + "\n"
