"""The planner's price of one context-parallel rank's attention against the same rank's kernels timed on an H200
(``data/measured_cp_attention_h200.csv``, ``bench/gpu_cp_attention.py``: torch's schedule, a causal block then
cp − 1 half blocks merged in fp32, 32k tokens a rank, cp 1-8, Llama 3 8B's and 405B's heads a GPU,
FlashAttention-2 and cuDNN). The planner splits attention's work evenly over the cp ranks at one efficiency."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bubblescope.analysis.planner import ParallelConfig, model_from
from bubblescope.analysis.planner.calibration import PUBLISHED_RUNS, published_rows
from bubblescope.analysis.planner.efficiencies import efficiencies_for
from bubblescope.analysis.planner.specs import gpu_from
from bubblescope.analysis.planner.step_time import attention_seconds

ROWS = published_rows(PUBLISHED_RUNS.with_name("measured_cp_attention_h200.csv"))


def priced_seconds(row: dict[str, str]) -> float:
    """The planner's forward + backward attention of the row's rank, on an H200 (the H100 SXM's constants)."""
    cp, local, heads = int(row["cp"]), int(row["local"]), int(row["heads"])
    model = replace(model_from(row["preset"]), seq=int(row["seq"]))
    assert model.head_dim == int(row["head_dim"])
    cfg = ParallelConfig(tp=1, pp=1, dp=1, cp=cp, mbs=1, flash_attention=True, attention_kernel=row["kernel"])
    forward, backward = attention_seconds(model, cfg, gpu_from("H200", "gpu"), efficiencies_for("H200"), local, heads)
    return forward + backward


def measured_seconds(row: dict[str, str]) -> float:
    return (float(row["forward_ms"]) + float(row["backward_ms"])) / 1e3


def test_the_file_holds_both_kernels_both_models_and_cp_1_to_8_first_and_last_rank() -> None:
    keys = {(r["preset"], r["kernel"], int(r["cp"]), int(r["rank"])) for r in ROWS}
    for preset in ("llama-3-8b", "llama-3.1-405b"):
        for kernel in ("flash2", "cudnn"):
            assert {(cp, rank) for p, k, cp, rank in keys if (p, k) == (preset, kernel)} == {
                (1, 0), (2, 0), (2, 1), (4, 0), (4, 3), (8, 0), (8, 7)
            }  # fmt: skip


@pytest.mark.parametrize("row", ROWS, ids=[f"{r['preset']}-{r['kernel']}-cp{r['cp']}-rank{r['rank']}" for r in ROWS])
def test_a_cp_ranks_attention_is_priced_within_15_percent(row: dict[str, str]) -> None:
    assert abs(priced_seconds(row) / measured_seconds(row) - 1) < 0.15, (priced_seconds(row), measured_seconds(row))


@pytest.mark.parametrize("preset", ["llama-3-8b", "llama-3.1-405b"])
@pytest.mark.parametrize("kernel", ["flash2", "cudnn"])
def test_a_ranks_attention_grows_with_cp_as_priced_within_10_percent(preset: str, kernel: str) -> None:
    """Each rank does 1/cp of the sequence's attention, at 32k tokens a rank cp times the cp-1 rank's: measured
    1.00-1.08× that (the fp32 merges, the unmasked half blocks), the planner exactly cp×."""
    rows = [r for r in ROWS if (r["preset"], r["kernel"]) == (preset, kernel)]
    (alone,) = [r for r in rows if r["cp"] == "1"]
    for row in rows:
        measured = measured_seconds(row) / measured_seconds(alone)
        priced = priced_seconds(row) / priced_seconds(alone)
        assert priced == pytest.approx(int(row["cp"]))
        assert abs(measured / priced - 1) < 0.10, (row["cp"], row["rank"], measured, priced)
