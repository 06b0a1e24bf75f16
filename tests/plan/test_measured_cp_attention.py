"""The planner's price of one context-parallel rank's attention against the same rank's kernels timed on an H200
(``data/measured_cp_attention_h200.csv``, ``bench/gpu_cp_attention.py``: torch's schedule, a causal block then
cp − 1 half blocks merged in fp32, 32k tokens a rank, cp 2-8, and plain attention at cp 1; Llama 3 8B's and 405B's
heads a GPU, FlashAttention-2 and cuDNN). The planner splits attention's work evenly over the cp ranks at one
efficiency."""

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
def test_a_ranks_attention_is_priced_within_20_percent_and_a_cp_ranks_within_7(row: dict[str, str]) -> None:
    """A CP rank's (cp 2-8) priced at 0.99-1.06× its measure. Plain attention (cp 1, a run without CP) at
    1.05-1.19×: cuDNN's causal kernel at 32k tokens outruns the forward efficiency the planner keeps (0.6, measured through SDPA at
    32k), and CP's blocks with
    their fp32 merges run 3-19% slower than cp times it, which the planner does not charge (docs/planner.md)."""
    ratio = priced_seconds(row) / measured_seconds(row)
    bound = 0.20 if row["cp"] == "1" else 0.07
    assert abs(ratio - 1) < bound, (ratio, priced_seconds(row), measured_seconds(row))


def test_the_planner_prices_a_cp_rank_at_its_share_of_the_sequences_attention() -> None:
    """cp · s/cp queries against s keys: each CP rank priced at exactly cp times the cp-1 rank's attention."""
    for row in ROWS:
        alone = next(r for r in ROWS if (r["preset"], r["kernel"], r["cp"]) == (row["preset"], row["kernel"], "1"))
        assert priced_seconds(row) / priced_seconds(alone) == pytest.approx(int(row["cp"]))
