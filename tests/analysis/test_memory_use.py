"""Memory per stage (analysis/memory_use.py), the planner's per-pipeline-rank prediction, and the
memory fix a measured peak near its limit brings."""

from __future__ import annotations

import pytest

from bubblescope.analysis.memory_fixes import memory_suggestions, predicted_memory_per_pipeline_rank
from bubblescope.analysis.memory_use import RankMemory, stage_memory
from bubblescope.analysis.planner import (
    ParallelConfig,
    cluster_preset,
    memory_per_gpu,
    memory_per_pipeline_rank,
    model_from,
)
from bubblescope.analysis.schedules import lookup

GIB = 2**30


def host(rank: int, stage: int | None, peak_gib: float, limit_gib: float | None = None) -> RankMemory:
    limit = None if limit_gib is None else int(limit_gib * GIB)
    return RankMemory(rank, stage, int(peak_gib * GIB), None, None, None, limit)


def gpu(rank: int, stage: int, reserved_gib: float, retries: int, limit_gib: float = 80) -> RankMemory:
    reserved = int(reserved_gib * GIB)
    return RankMemory(rank, stage, 2 * GIB, reserved - GIB, reserved, retries, int(limit_gib * GIB))


def test_a_stage_reads_its_fullest_rank_and_the_nearest_limit_is_over_its_own_limit() -> None:
    rows = stage_memory(
        [host(0, 0, 10, 20), host(1, 0, 12, 20), host(2, 1, 14, 40), host(3, 1, 6, 40), host(4, 1, 8, 40)]
    )
    assert [(r.stage, r.ranks, r.peak_rank) for r in rows] == [(0, 2, 1), (1, 3, 2)]
    assert rows[0].peak_bytes == 12 * GIB and rows[0].median_bytes == 11 * GIB
    assert rows[0].fraction_of_limit == pytest.approx(0.6) and rows[1].fraction_of_limit == pytest.approx(0.35)
    # stage 1 holds more bytes, stage 0 more of what it may use
    assert [r.nearest_limit for r in rows] == [True, False]


def test_without_limits_the_fullest_stage_is_flagged_and_gpu_readings_win_over_rss() -> None:
    rows = stage_memory([host(0, 0, 3), host(1, 1, 5)])
    assert [r.nearest_limit for r in rows] == [False, True] and rows[1].fraction_of_limit is None
    gpu_rows = stage_memory([gpu(0, 0, 70, retries=3), gpu(1, 0, 60, retries=1), gpu(2, 1, 40, retries=0)])
    assert gpu_rows[0].source == "gpu_reserved" and gpu_rows[0].peak_bytes == 70 * GIB
    assert gpu_rows[0].gpu_peak_allocated_bytes == 69 * GIB and gpu_rows[0].gpu_alloc_retries == 4
    assert stage_memory([RankMemory(0, 0, None, None, None, None, None)]) == []


def test_the_planner_puts_the_most_activations_on_the_first_rank_of_1f1b_and_equal_ones_on_gpipe() -> None:
    model, cluster = model_from("gpt-22b"), cluster_preset("a100-80gb-x8")
    one_f_one_b = memory_per_pipeline_rank(model, cluster, ParallelConfig(tp=2, pp=4, mbs=1), 16)
    # rank r holds p - r micro-batches' activations (its share of layers is equal: 48 / 4)
    assert [round(r.activations / one_f_one_b[3].activations) for r in one_f_one_b] == [4, 3, 2, 1]
    worst = memory_per_gpu(model, cluster, ParallelConfig(tp=2, pp=4, mbs=1), 16)
    assert one_f_one_b[0].activations == pytest.approx(worst.activations)
    assert one_f_one_b[0].weights > one_f_one_b[1].weights  # the embedding
    gpipe = memory_per_pipeline_rank(model, cluster, ParallelConfig(tp=2, pp=4, mbs=1, schedule=lookup("gpipe")), 16)
    assert {round(r.activations) for r in gpipe} == {round(gpipe[0].activations)}
    assert gpipe[0].activations == pytest.approx(4 * one_f_one_b[0].activations)  # 16 micro-batches against 4


def test_the_declared_model_is_predicted_per_stage_and_a_measured_peak_near_its_limit_brings_the_fix() -> None:
    config = {
        "model": "gpt-22b",
        "cluster": "a100-80gb-x16",
        "tp": 4,
        "pp": 4,
        "microbatch_size": 1,
        "global_batch": 16,
        "recompute": "full",
    }
    predicted = predicted_memory_per_pipeline_rank(config)
    assert predicted is not None and len(predicted) == 4 and predicted[0] > predicted[2]
    assert predicted_memory_per_pipeline_rank({"schedule": "1f1b"}) is None
    assert memory_suggestions(config, 2e9) == []  # the planner sees no pressure here
    rows = stage_memory([gpu(0, 0, 76, retries=12), gpu(4, 1, 50, retries=0)], dict(enumerate(predicted)))
    nearest = next(r for r in rows if r.nearest_limit)
    assert nearest.stage == 0 and nearest.predicted_bytes == predicted[0]
    found = memory_suggestions(config, 2e9, nearest)
    assert found and all(s.kind == "memory_pressure" for s in found)
    assert "stage 0's rank 0 peaked at 76.0 GiB of 80.0 GiB (95%)" in found[0].evidence
    calm = stage_memory([gpu(0, 0, 40, retries=0)])[0]
    assert memory_suggestions(config, 2e9, calm) == []
