"""NeMo's long-sequence table (Llama 2 7B, FP8, 4k-1M tokens, CP 1-32 on H100s) as a check of the planner's context
parallelism: the rows' tokens/s are NeMo's TFLOP/s over NeMo's own FLOP count, and the planner's error on them is
flat across sequence length and CP degree once attention runs at one speed (bench/planner_long_sequence.py)."""

from __future__ import annotations

import csv
from dataclasses import replace

import pytest

from bubblescope.analysis.planner import model_from
from bubblescope.analysis.planner.calibration import (
    NEMO_LONG_SEQUENCE_CHECKS,
    nemo_flops_per_token,
    predict_row,
    row_model,
)
from bubblescope.analysis.planner.efficiencies import efficiencies_for

ROWS = list(csv.DictReader(NEMO_LONG_SEQUENCE_CHECKS.open(newline="")))


def test_nemos_flop_count_gives_its_published_tokens_and_tflops_together() -> None:
    """NeMo 24.09's performance summary gives both for Llama 2 7B at 4,096 tokens on H100s, FP8: 16,934 tokens/s and
    780 TFLOP/s a GPU. Its formula, attention counted over every key (12·s/h), joins them; counted causal (6·s/h) it
    would give 726."""
    model = replace(model_from("llama-2-7b"), seq=4096)
    assert 16_934 * nemo_flops_per_token(model) / 1e12 == pytest.approx(780, abs=1)
    causal = nemo_flops_per_token(model) - model.layers * model.hidden**2 * 6 * model.seq / model.hidden
    assert 16_934 * causal / 1e12 == pytest.approx(726, abs=1)


def test_each_rows_tokens_are_its_published_tflops_over_nemos_count() -> None:
    assert len(ROWS) == 9 and {row["cp"] for row in ROWS} == {"1", "2", "4", "8", "16", "32"}
    for row in ROWS:
        tokens = float(row["nemo_model_tflops_per_gpu"]) * 1e12 / nemo_flops_per_token(row_model(row))
        assert round(tokens) == int(row["measured_tokens_per_gpu_s"]), row["model"]


def test_the_error_moves_with_attentions_speed_not_with_cp() -> None:
    """Priced at cuDNN's speed (today's H100 constant) the error climbs from 4k to 1M tokens by over 50 points, as
    attention's share grows; at FlashAttention-2's speed every row from CP 1 to CP 32 is within 8%."""
    sxm = efficiencies_for("H100-SXM")
    cudnn = [predict_row(row, sxm).error_pct for row in ROWS]
    flash2 = [predict_row({**row, "attention_kernel": "flash2"}, sxm).error_pct for row in ROWS]
    assert cudnn[-1] - cudnn[0] > 50, cudnn
    assert all(abs(error) < 8 for error in flash2), flash2
