"""Every Megatron-LM flag the suggestions, the memory and layout fixes and the planner write is one Megatron
defines. Megatron cannot be installed here; ``tests/data/megatron_flags.csv`` lists each flag with where
Megatron-LM defines it (NVIDIA/Megatron-LM at d98e8a64ddf34856e74b24714e3bedb2f5a39553, 2026-08-22): an
``add_argument`` in megatron/training/arguments.py, or a config dataclass field that its
``ArgumentGroupFactory`` turns into ``--field-name`` (megatron/training/argument_utils.py)."""

from __future__ import annotations

import csv
import re

from tests.support import REPO

SOURCES = [
    *(REPO / "analysis" / name for name in ("suggestions.py", "step_fixes.py", "layout_fixes.py", "memory_fixes.py")),
    *(REPO / "analysis" / "planner").glob("*.py"),
]
NOT_MEGATRON = {
    "--rdzv",  # torchrun's, in a suggestion's torch line
    "--decoder-first",  # "--decoder-first/last-pipeline-num-layers", a sentence naming the two flags
    "--json",  # the planner's own command line
    "--write-efficiencies",  # bench/planner_calibration.py's, named in a docstring
}


def test_every_megatron_flag_written_is_one_megatron_defines() -> None:
    with (REPO / "tests" / "data" / "megatron_flags.csv").open() as table:
        defined = {row["flag"]: row["defined_in"] for row in csv.DictReader(table)}
    written = {flag for path in SOURCES for flag in re.findall(r"--[a-z][a-z0-9-]+", path.read_text())}
    assert written - NOT_MEGATRON, "no flag found: the scan itself is broken"
    unknown = sorted(written - NOT_MEGATRON - set(defined))
    assert unknown == [], f"Megatron-LM defines no {unknown}: check its arguments and add a row with the source"
    assert all(re.fullmatch(r"megatron/[\w/]+\.py:\d+", where) for where in defined.values())
