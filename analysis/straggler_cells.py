"""The per-cell arithmetic of the straggler analysis (``analysis.stragglers``, rules 1 and 3), on arrays.

A 16,384-rank × 10-step range is 163,840 cells per phase; scored one Python call per cell, the report
took 3.1 s. Here a phase is one ranks × steps float array (NaN: not reported), its step medians one
``nanmedian``, and a group's cells at a step are scored together. The arithmetic is the per-cell
rules' own, operation for operation (int64 ns values are exact in float64 below 2^53 ns, 104 days), so
the figures are the same to the last bit: ``tests/stragglers`` compares them with a per-cell
reference.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from statistics import median
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from bubblescope.analysis.spread import MAD_TO_SIGMA

if TYPE_CHECKING:
    from bubblescope.analysis.stragglers import StragglerThresholds

EXACT_MAD_UP_TO = 32  # larger comparable groups share one MAD per step

Matrix = np.ndarray  # ranks × steps, float64, NaN where a rank did not report a step


class Cell(NamedTuple):
    """One rank at one step against its baseline (a tuple: a 16k-rank range builds 160k of them)."""

    ratio: float | None
    z: float | None
    flagged: bool


NOT_SCORED = Cell(None, None, False)


def column_medians(matrix: Matrix) -> list[float | None]:
    """Each step's median over the ranks that reported it (None where none did)."""
    if matrix.shape[0] == 0:
        return []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN column: None below
        medians = np.nanmedian(matrix, axis=0)
    return [None if np.isnan(m) else float(m) for m in medians.tolist()]


def row_medians(matrix: Matrix) -> list[float | None]:
    """Each rank's median over the steps it reported (None where it reported none)."""
    if matrix.shape[1] == 0:
        return [None] * matrix.shape[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        medians = np.nanmedian(matrix, axis=1)
    return [None if np.isnan(m) else float(m) for m in medians.tolist()]


def ratios(matrix: Matrix, medians: Sequence[float | None]) -> Matrix:
    """Each cell over its step's median; NaN where either is missing or the median is 0."""
    denominator = np.array([m if m else np.nan for m in medians], dtype=np.float64)
    return matrix / denominator if matrix.size else matrix.copy()


def as_rows(matrix: Matrix, integers: bool) -> list[list[int | None]] | list[list[float | None]]:
    """The matrix as lists of rows, None for NaN (ints for ns values)."""
    if not np.isnan(matrix).any():
        whole: list[list[int | None]] | list[list[float | None]]
        whole = matrix.astype(np.int64).tolist() if integers else matrix.tolist()
        return whole
    convert = int if integers else float
    return [[None if v != v else convert(v) for v in row] for row in matrix.tolist()]


def _scored(
    values: np.ndarray,
    baseline: np.ndarray,
    mad: np.ndarray,
    count: np.ndarray,
    window: np.ndarray,
    t: StragglerThresholds,
) -> list[Cell]:
    """Rule 3 for cells side by side (``window``: the step's median window, 0 where unknown)."""
    valid = ~np.isnan(values) & ~np.isnan(baseline) & (baseline > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        spread = np.maximum(MAD_TO_SIGMA * mad, t.min_relative_spread * baseline)
        excess = values - baseline
        ratio, z = values / baseline, excess / spread
        big_enough = excess >= t.min_excess_of_window * window
        outlying = (z >= t.z_score) | (count < t.min_values_for_z)
        flagged = valid & outlying & (ratio >= t.min_ratio) & big_enough
    return [
        Cell(r, s, f) if ok else NOT_SCORED
        for r, s, f, ok in zip(ratio.tolist(), z.tolist(), flagged.tolist(), valid.tolist())
    ]


def history_cells(matrix: Matrix, windows: Sequence[float | None], t: StragglerThresholds) -> list[list[Cell]]:
    """Each rank's cells against its own median over the range, and the MAD about it."""
    rows, steps = matrix.shape
    if steps == 0:
        return [[] for _ in range(rows)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        centre = np.nanmedian(matrix, axis=1)
        mad = np.nanmedian(np.abs(matrix - centre[:, None]), axis=1)
    count = np.broadcast_to((~np.isnan(matrix)).sum(axis=1)[:, None], matrix.shape)
    window = np.broadcast_to(np.array([w or 0.0 for w in windows], dtype=np.float64), matrix.shape)
    flat = _scored(
        matrix.ravel(),
        np.broadcast_to(centre[:, None], matrix.shape).ravel(),
        np.broadcast_to(mad[:, None], matrix.shape).ravel(),
        count.ravel(),
        window.ravel(),
        t,
    )
    return [flat[i * steps : (i + 1) * steps] for i in range(rows)]


def group_cells(
    rows: Sequence[int], matrix: Matrix, windows: Sequence[float | None], t: StragglerThresholds
) -> list[list[Cell]]:
    """Each of ``rows`` (a group's ranks, in rank order) scored at each step against the group's other
    ranks at that step: their median, and their MAD (past ``EXACT_MAD_UP_TO`` the group's MAD about its
    median stands in, O(n) per step)."""
    cells: list[list[Cell]] = [[] for _ in rows]
    block = matrix[list(rows)]
    for j, window in enumerate(windows):
        column = block[:, j]
        present = np.flatnonzero(~np.isnan(column))
        # by value, ties by rank: a stable sort of rank-ordered members
        order = present[np.argsort(column[present], kind="stable")]
        ordered = column[order]
        n = len(ordered)
        if n < 2:
            for member in cells:
                member.append(NOT_SCORED)
            continue
        position = np.empty(len(rows), dtype=np.int64)
        position[order] = np.arange(n)
        if n > EXACT_MAD_UP_TO:
            baseline, mad = _leaving_out_shared_mad(ordered, position[present])
        else:
            baseline, mad = _leaving_out_exact(ordered, position[present])
        scored = _scored(column[present], baseline, mad, np.full(n, n - 1), np.full(n, window or 0.0), t)
        by_member = dict(zip(present.tolist(), scored))
        for i, member in enumerate(cells):
            member.append(by_member.get(i, NOT_SCORED))
    return cells


def _medians_leaving_out(ordered: np.ndarray, at: np.ndarray) -> np.ndarray:
    """For each index in ``at``, the median of sorted ``ordered`` without its element there."""
    m = len(ordered) - 1
    lo, hi = (m - 1) // 2, m // 2
    below = np.where(lo < at, ordered[lo], ordered[lo + 1])
    above = np.where(hi < at, ordered[hi], ordered[hi + 1])
    middle: np.ndarray = (below + above) / 2
    return middle


def _leaving_out_shared_mad(ordered: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    centre = float(median(ordered.tolist()))
    shared = float(median(np.abs(ordered - centre).tolist()))
    return _medians_leaving_out(ordered, at), np.full(len(at), shared)


def _leaving_out_exact(ordered: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    baselines = _medians_leaving_out(ordered, at)
    values = ordered.tolist()
    mads = [
        float(median(abs(v - centre) for v in values[:k] + values[k + 1 :]))
        for k, centre in zip(at.tolist(), baselines.tolist())
    ]
    return baselines, np.array(mads, dtype=np.float64)
