"""The planner's context parallelism against NeMo's long-sequence table: Llama 2 7B, FP8, 4k to 1M tokens a sequence
on 4 to 1,024 H100s, CP 1 to 32 (``analysis/planner/data/checks_nemo_long_sequence_h100.csv``; SOURCES.md there).

A check, not calibration: the table leaves micro-batch, recompute, TP overlap and gradient type out (the rows take 1,
none, off and fp32). Each row is predicted with the H100 SXM's constants (``efficiencies.csv``), its attention priced
as the cuDNN fused attention Transformer Engine ran on Hopper (TE 1.4 ``attention.py``: FusedAttention on sm90), and
again at FlashAttention-2's speed (``attention_kernel=flash2``, its forward 0.55 of it): where the error moves with the sequence
length, attention's speed is off; where it is flat across CP 1-32, the context-parallel pricing holds.

Second, torchtitan's four Llama 3 8B long-sequence rows (32k-256k tokens, CP 1-8, 32,768 tokens a rank) against the
context-parallel attention measured on an H200 (``data/measured_cp_attention_h200.csv``, the slowest rank at each CP
degree): each pair of neighbours priced exactly as X + k·A (A: a rank's measured attention over the step, forward twice
under full AC), the 8k FP8 row's cost a token beside them, and the best any step linear in the CP degree can do on the
four (``planner.cp_scans``: the rank's other work fixed, as its tokens are; its attention and CP's transfers each a
cost per further CP rank).

    python bench/planner_long_sequence.py
"""

from __future__ import annotations

import csv

from bubblescope.analysis.planner.calibration import (
    NEMO_LONG_SEQUENCE_CHECKS,
    PUBLISHED_RUNS,
    PUBLISHED_RUNS_H100,
    nemo_flops_per_token,
    predict_row,
    published_rows,
    row_model,
)
from bubblescope.analysis.planner.cp_scans import cp_scans
from bubblescope.analysis.planner.efficiencies import efficiencies_for
from bubblescope.analysis.planner.specs import gpu_from


def nemo_check() -> None:
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


def measured_cp_attention_s(preset: str, kernel: str, layers: int) -> dict[int, float]:
    """Per CP degree, the slowest measured rank's attention over a full-AC step: every layer's forward twice (the
    forward and its recomputation) and its backward, in seconds."""
    slowest: dict[int, float] = {}
    for row in published_rows(PUBLISHED_RUNS.with_name("measured_cp_attention_h200.csv")):
        if row["preset"] == preset and row["kernel"] == kernel:
            seconds = layers * (2 * float(row["forward_ms"]) + float(row["backward_ms"])) / 1e3
            slowest[int(row["cp"])] = max(seconds, slowest.get(int(row["cp"]), 0.0))
    return slowest


def short_row_microseconds(layers: int) -> tuple[float, float]:
    """torchtitan's 8B FP8 row at 8,192 tokens (8 GPUs): its whole cost a token on a GPU, and its attention's at the
    H200's measured FlashAttention-2 speed (``measured_attention_h200.csv``: a fraction of the bf16 peak under the
    planner's causal count, 2·s·h a token a layer forward, the backward 2.5 forwards), in µs."""
    row = next(r for r in published_rows(PUBLISHED_RUNS_H100) if r["model"] == "llama-3.1-8b fsdp fp8")
    shape = next(
        r
        for r in published_rows(PUBLISHED_RUNS.with_name("measured_attention_h200.csv"))
        if "llama-3.1-8b fsdp fp8" in r["published_rows"].split("; ")
    )
    model = row_model(row)
    flops = layers * 3.5 * 2 * model.seq * model.heads * model.head_dim
    seconds = flops / (float(shape["flash2_forward_backward"]) * gpu_from("H200", "gpu").peak_tflops * 1e12)
    return 1e6 / float(row["measured_tokens_per_gpu_s"]), seconds * 1e6


def torchtitan_cp_rows() -> None:
    rows = [
        row
        for row in published_rows(PUBLISHED_RUNS_H100)
        if row["source"] == "torchtitan_llama3_h100_2024" and row["preset"] == "llama-3-8b" and int(row["seq"]) >= 32768
    ]
    model = row_model(rows[0])
    attention_by_cp = measured_cp_attention_s(model.name, rows[0]["attention_kernel"], model.layers)
    steps, attention = [], []
    print(f"\n{'torchtitan row':24} {'cp':>3} {'step s':>7} {'H200 attention s':>17}")
    for row in rows:
        tokens = int(row["global_batch"]) * int(row["seq"]) / int(row["gpus"])
        steps.append(tokens / float(row["measured_tokens_per_gpu_s"]))
        attention.append(attention_by_cp[int(row["cp"])])
        print(f"{row['model']:24} {row['cp']:>3} {steps[-1]:7.2f} {attention[-1]:17.2f}")
    degrees = [int(row["cp"]) for row in rows]
    slopes = [(steps[i + 1] - steps[i]) / (degrees[i + 1] - degrees[i]) for i in range(len(rows) - 1)]
    print(
        "step's growth a CP degree, between neighbours: "
        + ", ".join(f"{slope:.2f} s" for slope in slopes)
        + " (a cost convex in the degree needs them rising, a concave one falling)"
    )
    rank_tokens = int(rows[0]["global_batch"]) * int(rows[0]["seq"]) / int(rows[0]["gpus"])
    for i, j in ((0, 1), (2, 3)):
        k_pair = (steps[j] - steps[i]) / (attention[j] - attention[i])
        x_pair = steps[i] - k_pair * attention[i]
        print(
            f"through {rows[i]['model']} and {rows[j]['model']}: k {k_pair:.3f}, X {x_pair:.2f} s, "
            f"{x_pair / rank_tokens * 1e6:.0f} µs a token of non-attention work"
        )
    short = short_row_microseconds(model.layers)
    print(
        f"the 8k FP8 row: {short[0]:.0f} µs a token in all, its attention {short[1]:.0f} µs at the H200's measured speed"
        f" (the rest: {short[0] - short[1]:.0f} µs; per-op AC, which recomputes less than full AC)"
    )
    (floor,) = [scan for scan in cp_scans(rows) if scan.rows[0] == rows[0]["model"]]
    print(
        "best step linear in the CP degree over these rows (its value at CP 1 and a cost per further CP rank, both "
        "≥ 0: attention and CP's transfers alike; planner.cp_scans): errors "
        + ", ".join(f"{e:+.1f}%" for e in floor.errors_pct)
        + f"; max |error| {floor.max_error_pct:.2f}% (Calculon's max: 8.87%)"
    )


def main() -> None:
    nemo_check()
    torchtitan_cp_rows()


if __name__ == "__main__":
    main()
