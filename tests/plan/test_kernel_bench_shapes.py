"""``bench/gpu_kernel_efficiency.py`` times each published run's linear GEMMs on a GPU and divides by what the planner
charges for them. Here, on the CPU, the bench must time the GEMMs the planner prices (torchtitan's projections apart,
a TP 8 rank's wk 128 columns wide), and its planned seconds must be ``layer_cost``'s: forward plus a backward of
twice it, from ``linear_gemm_seconds``. The timing itself needs a GPU (``bench/gpu_checks.sh``)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from bubblescope.analysis.planner import calibration
from bubblescope.analysis.planner.efficiencies import efficiencies_for
from bubblescope.analysis.planner.specs import make_cluster
from bubblescope.analysis.planner.step_time import linear_gemm_seconds
from tests.support import REPO

BENCH = REPO / "bench" / "gpu_kernel_efficiency.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("gpu_kernel_efficiency", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def published(name: str) -> dict[str, str]:
    rows = calibration.published_rows([calibration.PUBLISHED_RUNS, calibration.PUBLISHED_RUNS_H100])
    return next(row for row in rows if row["model"] == name)


def test_a_tensor_parallel_torchtitan_row_is_timed_projection_by_projection() -> None:
    bench = load_bench()
    _, _, local, shapes = bench.row_layer(published("llama-3.1-8b tp fp8"))
    tokens = 12 * 8192  # local batch 12, no CP
    assert local == 8192
    # wq, wk, wv (4096/8 and two of 1024/8), wo, w1 and w3 (14336/8 each), w2
    assert shapes == (
        (tokens, 4096, 512),
        (tokens, 4096, 128),
        (tokens, 4096, 128),
        (tokens, 512, 4096),
        (tokens, 4096, 1792),
        (tokens, 4096, 1792),
        (tokens, 1792, 4096),
    )


def test_a_megatron_row_keeps_its_fused_gemms() -> None:
    bench = load_bench()
    _, _, _, shapes = bench.row_layer(published("gpt-1.7b-h100"))
    assert len(shapes) == 4


@pytest.mark.parametrize("name", ["llama-3.1-8b tp fp8", "llama-3.1-70b tp bf16", "gpt-1.7b-h100"])
def test_planned_seconds_are_what_layer_cost_charges_for_the_gemms(name: str) -> None:
    bench = load_bench()
    row = published(name)
    model, cfg, local, shapes = bench.row_layer(row)
    gpu = make_cluster("H200", 8, 8).gpu
    charged = linear_gemm_seconds(model, cfg, gpu, efficiencies_for(gpu), cfg.mbs * local)
    expected = 3.0 * sum(map(sum, charged))
    assert bench.planned_layer_seconds(shapes, gpu, cfg.precision) == pytest.approx(expected, rel=1e-6)
