"""Holistic Trace Analysis 0.5.0 and our code on the same real traces: its temporal breakdown, idle time by cause
and communication overlap, per rank, within 0.5 percentage points of its own figures (read here: within 0.01)."""

from __future__ import annotations

import logging
import math
import shutil
from pathlib import Path

import pytest

from bubblescope.analysis.trace_figures import hta_figures
from bubblescope.kineto import read_rank_trace
from tests.traces.support import JOBS, job_files

POINTS = 0.5  # percentage points


@pytest.fixture(scope="module", params=sorted(JOBS))
def job(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], object]:
    """The job's files and HTA's ``TraceAnalysis`` of them (it reads a folder: a copy of just these files)."""
    files = job_files(request.param)
    folder = tmp_path_factory.mktemp(request.param)
    for path in files:
        shutil.copy(path, folder / path.name)
    from hta.trace_analysis import TraceAnalysis

    logging.getLogger("hta").setLevel(logging.ERROR)
    return files, TraceAnalysis(trace_dir=str(folder))


def test_temporal_breakdown_and_overlap_match_htas(job: tuple[list[Path], object]) -> None:
    files, hta = job
    breakdown = hta.get_temporal_breakdown(visualize=False)  # type: ignore[attr-defined]
    overlap = hta.get_comm_comp_overlap(visualize=False)  # type: ignore[attr-defined]
    for path in files:
        trace = read_rank_trace(path)
        ours = hta_figures(trace.activities)
        theirs = breakdown[breakdown["rank"] == trace.rank].iloc[0]
        assert ours.kernel_span_us == theirs["kernel_time(us)"], path
        for part, column in (
            ("idle_us", "idle_time_pctg"),
            ("compute_us", "compute_time_pctg"),
            ("non_compute_us", "non_compute_time_pctg"),
        ):
            assert abs(100 * ours.share(getattr(ours, part)) - theirs[column]) < POINTS, (path, part)
        their_overlap = overlap[overlap["rank"] == trace.rank].iloc[0]["comp_comm_overlap_pctg"]
        if math.isnan(their_overlap):  # no communication kernel at all (NCCL in a world of one): no overlap to say
            assert ours.comm_overlap is None, path
            continue
        assert ours.comm_overlap is not None and abs(100 * ours.comm_overlap - their_overlap) < POINTS, path


def test_idle_time_by_cause_matches_htas(job: tuple[list[Path], object]) -> None:
    """Host wait, kernel wait and other, summed over the rank's streams, as shares of its kernel span."""
    files, hta = job
    for path in files:
        trace = read_rank_trace(path)
        ours = hta_figures(trace.activities)
        idle, _ = hta.get_idle_time_breakdown(ranks=[trace.rank], visualize=False)  # type: ignore[attr-defined]
        theirs = idle.groupby("idle_category")["idle_time"].sum().to_dict()
        assert set(theirs) <= set(ours.idle_by_cause_us), theirs
        for cause, ns in ours.idle_by_cause_us.items():
            assert abs(ours.share(ns) - ours.share(theirs.get(cause, 0.0))) * 100 < POINTS, (path, cause, ns, theirs)
        assert sum(ours.idle_by_cause_us.values()) > 0
