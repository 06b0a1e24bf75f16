"""The real profiler traces of ``../shared/data/kineto`` (from HTA's test data), where this checkout has them, and
two of our own, kept in the repository: the docs' DDP loop and its FSDP2 form profiled on an H100 (torch 2.11, NCCL
in a world of one; ``bench/gpu_checks.sh``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.support import REPO

KINETO = Path(os.environ.get("BUBBLESCOPE_SHARED_DATA", REPO.parent / "shared" / "data")) / "kineto"
JOBS = {  # one job's ranks per entry
    "hta_trace_filter_2rank": [
        "hta_trace_filter_2rank/sampled_rank-0.json.gz",
        "hta_trace_filter_2rank/sampled_rank-1.json.gz",
    ],
    "nccl_data_rank0_of2_a100": ["nccl_data_rank0_of2_a100.json.gz"],
    "trace_diff_control_rank3_of8_a100": ["trace_diff_control_rank3_of8_a100.json.gz"],
    "h100_ddp_from_docs": ["h100/ddp_from_docs_rank0.json.gz"],
    "h100_fsdp2_from_docs": ["h100/fsdp2_from_docs_rank0.json.gz"],
}
OWN = Path(__file__).parent / "data"  # the jobs whose files are here, not in KINETO


def job_files(job: str) -> list[Path]:
    """The job's trace files; the test skips, saying where it looked, when they are absent."""
    files = [(OWN if (OWN / name).is_file() else KINETO) / name for name in JOBS[job]]
    if not all(path.is_file() for path in files):
        pytest.skip(f"the Kineto reference traces are not in {KINETO} (set BUBBLESCOPE_SHARED_DATA to their folder)")
    return files


def settled(found: dict[str, Any]) -> dict[str, Any]:
    """A report without what moves between two dumps of one rank taken moments apart: started, completed ids."""
    moving = ("last_started", "last_completed")
    groups = [
        {**g, "progress": [{k: v for k, v in p.items() if k not in moving} for p in g["progress"]]}
        for g in found["groups"]
    ]
    return {**found, "groups": groups}
