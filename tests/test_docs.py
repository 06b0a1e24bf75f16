"""The README is an entry point (at most 12 KB) whose links, like the docs', all resolve; nothing the
product, its docs or its benches need lives outside the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.support import REPO

README_LIMIT_BYTES = 12_000
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(document: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", document.read_text(), flags=re.S)
    return {slug(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


def test_the_readme_is_an_entry_point_not_a_notebook() -> None:
    assert len((REPO / "README.md").read_bytes()) <= README_LIMIT_BYTES


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.relative_to(REPO).as_posix())
def test_every_link_resolves(document: Path) -> None:
    broken = []
    for match in LINK.finditer(document.read_text()):
        target = match.group(1) or match.group(2)
        if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (document.parent / path_part).resolve() if path_part else document
        if not resolved.exists() or REPO.resolve() not in resolved.parents:
            broken.append(f"{target}: no such file in the repository")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading #{anchor} in {resolved.name}")
    assert broken == []


def test_nothing_refers_to_files_outside_the_repository() -> None:
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    outside = re.compile(r"\.\./shared|DESIGN\.md")
    offenders = [
        name
        for name in tracked
        if not name.startswith("tests/")
        and (REPO / name).is_file()
        and (REPO / name).suffix in {".py", ".md", ".toml", ".yml", ".js", ".html", ".cfg", ""}
        and outside.search((REPO / name).read_text(errors="ignore"))
    ]
    assert offenders == []
