"""DESIGN.md §3: what each layer must not import, checked in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

SERVER_MODULES = ["fastapi", "starlette", "sqlalchemy", "pydantic", "plotly", "pandas", "uvicorn", "alembic"]

RULES = [
    # (module imported, modules that must then be absent)
    ("bubblescope.collector", [*SERVER_MODULES, "torch", "bubblescope.backend"]),
    ("bubblescope.collector.pipelining", [*SERVER_MODULES, "torch", "bubblescope.backend"]),
    ("bubblescope.wire", [*SERVER_MODULES, "torch"]),
    ("bubblescope.cli", [*SERVER_MODULES, "torch", "bubblescope.backend"]),
    (
        "bubblescope.analysis.breakdown",
        ["fastapi", "starlette", "sqlalchemy", "pydantic", "plotly", "uvicorn", "torch", "bubblescope.collector"],
    ),
    ("bubblescope.analysis.stragglers", [*SERVER_MODULES, "torch", "bubblescope.collector", "bubblescope.backend.db"]),
    ("bubblescope.analysis.planner", [*SERVER_MODULES, "torch", "bubblescope.collector", "bubblescope.backend.db"]),
    *[
        (f"bubblescope.analysis.{name}", [*SERVER_MODULES, "torch", "bubblescope.collector", "bubblescope.backend.db"])
        for name in (
            "simulator",
            "schedules",
            "schedule_orders",
            "pipeline_profile",
            "whatif",
            "attribution",
            "suggestions",
            "memory_fixes",
        )
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
