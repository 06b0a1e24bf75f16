"""How well *any* model of a context-parallel scan can do: the floor under the planner's error on a published scan.

A CP scan is a table of runs of one model on the same GPUs that doubles the sequence with the CP degree, so each GPU
holds the same tokens a step (torchtitan's Table 2: 32k at CP 1 up to 256k at CP 8). On such a scan a GPU's step is
its share of the layers' work, which the scan keeps fixed (L), plus its attention, whose keys grow with the sequence
while its queries stay fixed (A·cp), plus the keys and values it receives from the other cp − 1 ranks, exposed or not
(C·(cp − 1)): step = L + A·cp + C·(cp − 1) = (L + A) + (A + C)·(cp − 1), the step at CP 1 and a cost per further CP
rank, both ≥ 0, nothing else assumed (no peak, no efficiency, no bandwidth). ``scan_floor`` finds the two that
minimise the scan's largest error on tokens per GPU per second: no model whose step grows linearly with cp at fixed
tokens per GPU can do better on that scan's rows, whatever constants it fits. The planner's step is of that form on
a scan whose CP exchange hides under attention (``step_time.cp_seconds``: a hinge, exposed only past the first
block's attention), as on NVLink; only a term not linear in the degree could do better.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy

TERMS = ("step_at_cp1", "per_cp_rank")  # L + A and A + C: the weights of 1 and cp − 1


@dataclass(frozen=True)
class ScanFloor:
    rows: list[str]  # the scan's rows by model name, in CP order
    cps: list[int]
    max_error_pct: float  # the least largest |error| any step linear in cp leaves on the scan's tokens/s
    weights: dict[str, float]  # ``TERMS`` of that fit, as fractions of the first row's step
    errors_pct: list[float]  # each row's error at that fit (predicted over measured tokens/s, minus one)


def _feasible(design: numpy.ndarray, lower: numpy.ndarray, upper: numpy.ndarray) -> numpy.ndarray | None:
    """Non-negative weights w with lower ≤ design·w ≤ upper, or None: a vertex of that bounded polyhedron (three of
    its planes meet there and it satisfies every constraint) exists where the polyhedron is not empty."""
    size = design.shape[1]
    planes = [
        (row, bound) for row, lo, hi in zip(design, lower, upper, strict=True) for row, bound in ((row, lo), (row, hi))
    ]
    planes += [(numpy.eye(size)[i], 0.0) for i in range(size)]
    for chosen in itertools.combinations(planes, size):
        matrix = numpy.array([row for row, _ in chosen])
        if abs(numpy.linalg.det(matrix)) < 1e-12:
            continue
        weights = numpy.linalg.solve(matrix, numpy.array([bound for _, bound in chosen]))
        values = design @ weights
        if (weights >= -1e-12).all() and (values >= lower - 1e-9).all() and (values <= upper + 1e-9).all():
            return numpy.maximum(weights, 0.0)
    return None


def minimax_fit(steps: Sequence[float], cps: Sequence[int], tolerance: float = 1e-7) -> tuple[float, numpy.ndarray]:
    """The least ``e`` such that a step at CP 1 and a cost per further CP rank, both ≥ 0, predict every step within
    ``steps / (1 ± e)`` (a tokens/s error of at most ``e``), by bisection; with those two."""
    measured = numpy.asarray(steps, dtype=float)
    cp = numpy.asarray(cps, dtype=float)
    design = numpy.column_stack([numpy.ones_like(cp), cp - 1])
    low, high = 0.0, 0.999
    best = _feasible(design, measured / (1 + high), measured / (1 - high))
    assert best is not None  # at a 99.9 % error any positive scan fits
    while high - low > tolerance:
        middle = (low + high) / 2
        found = _feasible(design, measured / (1 + middle), measured / (1 - middle))
        if found is None:
            low = middle
        else:
            high, best = middle, found
    return high, best


def scan_floor(names: Sequence[str], cps: Sequence[int], tokens_per_gpu_s: Sequence[float]) -> ScanFloor:
    """The floor of one scan: each row's name, CP degree and measured tokens per GPU per second (the same tokens per
    GPU a step on every row, so a step is proportional to 1 / tokens per second)."""
    order = sorted(range(len(cps)), key=lambda i: cps[i])
    steps = [1.0 / tokens_per_gpu_s[i] for i in order]
    error, weights = minimax_fit(steps, [cps[i] for i in order])
    cp = numpy.array([cps[i] for i in order], dtype=float)
    predicted = weights[0] + weights[1] * (cp - 1)
    return ScanFloor(
        [names[i] for i in order],
        [cps[i] for i in order],
        100 * error,
        {term: float(w / steps[0]) for term, w in zip(TERMS, weights, strict=True)},
        [float(100 * (s / p - 1)) for s, p in zip(steps, predicted, strict=True)],
    )


def cp_scans(rows: Sequence[dict[str, str]]) -> list[ScanFloor]:
    """Every CP scan among published rows (``published_runs_h100.csv``'s columns): rows of one source, GPU, GPU count,
    TP and PP degrees and model preset, with the same tokens per GPU a step and the same sequence per CP rank, at three
    CP degrees or more."""
    groups: dict[tuple[str, ...], list[dict[str, str]]] = {}
    for row in rows:
        if not row.get("measured_tokens_per_gpu_s", "").strip() or not row.get("preset", "").strip():
            continue
        cp = int(row.get("cp") or 1)
        tokens, local = int(row["seq"]) * int(row["global_batch"]) // int(row["gpus"]), int(row["seq"]) // cp
        key = (row["source"], row["gpu"], row["gpus"], row["tp"], row["pp"], row["preset"], f"{tokens}/{local}")
        groups.setdefault(key, []).append(row)
    found = []
    for members in groups.values():
        cps = [int(row.get("cp") or 1) for row in members]
        if len(set(cps)) >= 3:
            speeds = [float(row["measured_tokens_per_gpu_s"]) for row in members]
            found.append(scan_floor([row["model"] for row in members], cps, speeds))
    return found
