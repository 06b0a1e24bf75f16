"""The planner's context parallelism against NeMo's long-sequence table: Llama 2 7B, FP8, 4k to 1M tokens a sequence
on 4 to 1,024 H100s, CP 1 to 32 (``analysis/planner/data/checks_nemo_long_sequence_h100.csv``; SOURCES.md there).

A check, not calibration: the table leaves micro-batch, recompute, TP overlap and gradient type out (the rows take 1,
none, off and fp32). Each row is predicted with the H100 SXM's constants (``efficiencies.csv``), its attention priced
as the cuDNN fused attention Transformer Engine ran on Hopper (TE 1.4 ``attention.py``: FusedAttention on sm90), and
again at FlashAttention-2's speed (``attention_kernel=flash2``, its forward 0.55 of it): where the error moves with the sequence
length, attention's speed is off; where it is flat across CP 1-32, the context-parallel pricing holds.

    python bench/planner_long_sequence.py
"""

from __future__ import annotations

import csv

from bubblescope.analysis.planner.calibration import (
    NEMO_LONG_SEQUENCE_CHECKS,
    nemo_flops_per_token,
    predict_row,
    row_model,
)
from bubblescope.analysis.planner.efficiencies import efficiencies_for


def main() -> None:
    rows = list(csv.DictReader(NEMO_LONG_SEQUENCE_CHECKS.open(newline="")))
    print(f"{'row':26} {'TFLOP/s':>8} {'tokens/s':>9} {'cuDNN':>14} {'FA2 speed':>14}")
    errors: dict[str, list[float]] = {"cudnn": [], "flash2": []}
    for row in rows:
        tokens = float(row["nemo_model_tflops_per_gpu"]) * 1e12 / nemo_flops_per_token(row_model(row))
        cells = []
        for kernel in errors:
            predicted = predict_row({**row, "attention_kernel": kernel}, efficiencies_for(row["gpu"]))
            errors[kernel].append(predicted.error_pct)
            cells.append(f"{predicted.predicted:7.0f} {predicted.error_pct:+5.1f}%")
        print(f"{row['model']:26} {row['nemo_model_tflops_per_gpu']:>8} {tokens:9.0f} {cells[0]:>14} {cells[1]:>14}")
    for kernel, found in errors.items():
        mean = sum(abs(e) for e in found) / len(found)
        print(f"{kernel}: mean |error| {mean:.1f}%, from {min(found):+.1f}% to {max(found):+.1f}%")


if __name__ == "__main__":
    main()
