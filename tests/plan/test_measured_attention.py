"""Fused attention's constants read off the H200's measurements (``data/measured_attention_h200.csv``,
``bench/gpu_kernel_efficiency.py`` in ``bench/gpu_checks.sh``: every published H100-class run's attention shape,
FlashAttention-2 and cuDNN through SDPA, forward and forward + backward, as fractions of the bf16 peak under the
planner's causal FLOP count, the backward counted as 2.5 forwards). The planner's ``ATTENTION_BACKWARD_RATIO`` and
``FLASH2_SHARE_ON_HOPPER`` are these shapes' medians, not fitted to the calibration rows."""

from __future__ import annotations

import statistics

from bubblescope.analysis.planner.calibration import PUBLISHED_RUNS, family_grid, published_rows
from bubblescope.analysis.planner.efficiencies import HOPPER_NVLINK, efficiencies_for, measured_on
from bubblescope.analysis.planner.step_time import ATTENTION_BACKWARD_RATIO, FLASH2_SHARE_ON_HOPPER

SHAPES = published_rows(PUBLISHED_RUNS.with_name("measured_attention_h200.csv"))


def backward_over_forward(row: dict[str, str], kernel: str) -> float:
    """Time backward / time forward: 3.5 forwards' FLOPs at the forward + backward efficiency, less the forward."""
    forward, both = float(row[f"{kernel}_forward"]), float(row[f"{kernel}_forward_backward"])
    return 3.5 * forward / both - 1.0


def test_fourteen_distinct_shapes_are_measured() -> None:
    keys = {(r["batch"], r["heads"], r["seq"], r["head_dim"]) for r in SHAPES}
    assert len(keys) == len(SHAPES) == 14


def test_each_kernels_backward_ratio_is_the_median_of_the_measured_shapes() -> None:
    for kernel in ("flash2", "cudnn"):
        median = statistics.median(backward_over_forward(r, kernel) for r in SHAPES)
        assert abs(ATTENTION_BACKWARD_RATIO[kernel] - median) < 0.05, (kernel, median)
    assert ATTENTION_BACKWARD_RATIO["cudnn"] > ATTENTION_BACKWARD_RATIO["flash2"] > 2.5  # both above the FLOP count


def test_flash_attention_2s_forward_share_is_the_median_of_the_measured_shapes() -> None:
    median = statistics.median(float(r["flash2_forward"]) / float(r["cudnn_forward"]) for r in SHAPES)
    assert abs(FLASH2_SHARE_ON_HOPPER - median) < 0.01, median


def test_the_h100_sxms_attention_is_cudnns_measured_forward_at_long_sequences_not_a_fit() -> None:
    """The constant the H100 SXM's (and H200's) fit keeps for fused attention is cuDNN's forward efficiency measured at
    the longest shapes (32k tokens, where it levels off), above every shorter shape's, and the fit keeps it whatever the
    rows would choose (``calibration.family_grid``)."""
    long = [float(r["cudnn_forward"]) for r in SHAPES if int(r["seq"]) >= 32768]
    shorter = [float(r["cudnn_forward"]) for r in SHAPES if int(r["seq"]) < 32768]
    measured = measured_on("H100-SXM")["attention"]
    assert len(long) == 2 and abs(measured - statistics.fmean(long)) < 0.02, long
    assert max(shorter) < min(long)  # the one constant prices shorter launches faster than they run (docs)
    grid = family_grid("H100-SXM", {"attention": (0.2, 0.4), "gemm": (0.6, 0.7)})
    nvlink = {"nvlink": (HOPPER_NVLINK,)}  # NCCL's published figure, held on every H100 board (test_efficiencies)
    assert grid == {"attention": (measured,), "gemm": (0.6, 0.7), **nvlink}
    assert family_grid("h100-sxm", {"attention": (0.2,)}) == {"attention": (measured,), **nvlink}  # any case
    assert family_grid("H100-HBM2e-500W", {"attention": (0.2, 0.4)}) == {"attention": (0.2, 0.4), **nvlink}
    for gpu in ("H100-SXM", "H200"):
        assert efficiencies_for(gpu).attention == measured, gpu
