"""The planner's price of one layer against the same layer timed on a GPU (``data/measured_layers_h200.csv``:
Llama 3 8B and 70B layers on an H200, bf16 and FP8, and the 8B at 32k tokens in bf16, ``bench/gpu_layer_step.py``).
The H200 prices with the H100 SXM's constants, which were never fitted on these layers, and the layer as the bench
builds it, its projections apart (``projections="separate"``); bf16 reads within 5% at 8k (+4.7%, +2.8%) and 8% at
32k (+7.8%: its attention priced 10% over the measure of the same kernels, cuDNN's causal kernel outrunning the
fitted 0.6 there, the rest of its backward 11% over), FP8 within 15% (it reads 7% fast on the 8B: torchao's casts
cost more than ``fp8_cast_seconds`` charges), docs/planner.md "Measured on an H200"."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bubblescope.analysis.planner import ParallelConfig, make_cluster, model_from
from bubblescope.analysis.planner.calibration import PUBLISHED_RUNS, published_rows
from bubblescope.analysis.planner.efficiencies import efficiencies_for
from bubblescope.analysis.planner.step_time import layer_cost

ROWS = published_rows(PUBLISHED_RUNS.with_name("measured_layers_h200.csv"))
BOUND = {"bf16": 0.05, "fp8": 0.15}
BF16_BOUND_AT_32K = 0.08


@pytest.mark.parametrize("row", ROWS, ids=[f"{r['preset']}-{r['seq']}-{r['precision']}" for r in ROWS])
def test_a_layer_timed_on_an_h200_is_priced_within_its_bound(row: dict[str, str]) -> None:
    model = replace(model_from(row["preset"]), seq=int(row["seq"]))
    cfg = ParallelConfig(dp=8, mbs=int(row["mbs"]), precision=row["precision"], projections="separate")
    cost = layer_cost(model, make_cluster("H200", 8), cfg, efficiencies_for("H200"))
    measured = float(row["forward_backward_ms"]) / 1e3
    bound = BF16_BOUND_AT_32K if (row["precision"], row["seq"]) == ("bf16", "32768") else BOUND[row["precision"]]
    assert abs(cost.seconds / measured - 1) < bound, (cost.seconds, measured)


def test_fp8_over_bf16_is_priced_within_15_percent_of_the_measured_speed_up() -> None:
    """A whole layer's FP8 speed-up: 1.23× (8B) and 1.46× (70B) measured; priced at 1.38× and 1.50× (1.46× and
    1.62× were FP8 GEMMs as efficient as bf16's, ``FP8_GEMM_SHARE`` 1)."""
    cluster, eff = make_cluster("H200", 8), efficiencies_for("H200")
    for preset in ("llama-3-8b", "llama-3-70b"):
        measured = {
            r["precision"]: float(r["forward_backward_ms"])
            for r in ROWS
            if r["preset"] == preset and r["seq"] == "8192"
        }
        priced = {
            p: layer_cost(
                model_from(preset), cluster, ParallelConfig(dp=8, mbs=1, precision=p, projections="separate"), eff
            ).seconds
            for p in ("bf16", "fp8")
        }
        speed_up, priced_speed_up = measured["bf16"] / measured["fp8"], priced["bf16"] / priced["fp8"]
        assert abs(priced_speed_up / speed_up - 1) < 0.15, (preset, speed_up, priced_speed_up)
