"""The layer rules of docs/architecture.md: what each layer must not import, checked in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support import REPO

ANALYSIS_MODULES = sorted(
    path.relative_to(REPO / "analysis").with_suffix("").as_posix().replace("/", ".").removesuffix(".__init__")
    for path in (REPO / "analysis").rglob("*.py")
    if path.name != "__init__.py" or path.parent != REPO / "analysis"
)
SERVER_MODULES = ["fastapi", "starlette", "sqlalchemy", "pydantic", "plotly", "pandas", "uvicorn", "alembic"]

RULES = [
    # (module imported, modules that must then be absent)
    ("bubblescope.collector", [*SERVER_MODULES, "torch", "bubblescope.backend"]),
    ("bubblescope.collector.pipelining", [*SERVER_MODULES, "torch", "bubblescope.backend"]),
    ("bubblescope.integrations.torchtitan", [*SERVER_MODULES, "torch", "bubblescope.backend", "torchtitan"]),
    ("bubblescope.wire", [*SERVER_MODULES, "torch"]),
    ("bubblescope.cli", [*SERVER_MODULES, "torch", "bubblescope.backend"]),
    # Reading profiler traces: the standard library and the pure analysis (no pandas: the point is to be light)
    ("bubblescope.trace_summary", [*SERVER_MODULES, "torch", "bubblescope.backend", "bubblescope.collector", "numpy"]),
    # The analysis is pure: every module of it, the planner included, imports no server, database, torch or collector.
    *[
        (f"bubblescope.analysis.{name}", [*SERVER_MODULES, "torch", "bubblescope.collector", "bubblescope.backend"])
        for name in ANALYSIS_MODULES
    ],
    ("bubblescope.backend.app", ["torch", "bubblescope.collector"]),
]


def loaded_after_import(module: str) -> set[str]:
    code = f"import json, sys; import {module}; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(json.loads(done.stdout))


@pytest.mark.parametrize("module,forbidden", RULES, ids=[rule[0] for rule in RULES])
def test_layer_imports_nothing_it_must_not(module: str, forbidden: list[str]) -> None:
    loaded = loaded_after_import(module)
    assert module in loaded
    leaked = sorted(f for f in forbidden if f in loaded or any(m.startswith(f + ".") for m in loaded))
    assert leaked == [], f"{module} pulled in {leaked}"
