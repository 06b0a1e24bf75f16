"""The array arithmetic of the straggler cells gives, bit for bit, what the rules give cell by cell.

``reference_*`` below is rule 3 of ``analysis.stragglers`` written one cell at a time in plain Python
(the form the module had before its arrays), on matrices with missing cells, ties, slow cells, groups
below and above ``EXACT_MAD_UP_TO`` and a step nobody reported.
"""

from __future__ import annotations

import random
from statistics import median

import numpy as np
import pytest

from bubblescope.analysis.straggler_cells import (
    EXACT_MAD_UP_TO,
    MAD_TO_SIGMA,
    Cell,
    column_medians,
    group_cells,
    history_cells,
)
from bubblescope.analysis.stragglers import StragglerThresholds

T = StragglerThresholds()
NONE = Cell(None, None, False)


def reference_score(value: int | None, baseline: float | None, mad: float, count: int, window: float | None) -> Cell:
    if value is None or not baseline or baseline <= 0:
        return NONE
    spread = max(MAD_TO_SIGMA * mad, T.min_relative_spread * baseline)
    ratio, z = value / baseline, (value - baseline) / spread
    big_enough = (value - baseline) >= T.min_excess_of_window * (window or 0)
    outlying = z >= T.z_score or count < T.min_values_for_z
    return Cell(ratio, z, outlying and ratio >= T.min_ratio and big_enough)


def reference_group(
    group: list[int], values: list[list[int | None]], windows: list[float | None]
) -> dict[int, list[Cell]]:
    cells: dict[int, list[Cell]] = {r: [] for r in group}
    for j, window in enumerate(windows):
        present = sorted((v, r) for r in group if (v := values[r][j]) is not None)
        ordered = [v for v, _ in present]
        for r in group:
            if values[r][j] is None or len(ordered) < 2:
                cells[r].append(NONE)
                continue
            k = next(i for i, (_, q) in enumerate(present) if q == r)
            others = ordered[:k] + ordered[k + 1 :]
            centre = float(median(others))
            spread_of = ordered if len(ordered) > EXACT_MAD_UP_TO else others
            about = float(median(ordered)) if len(ordered) > EXACT_MAD_UP_TO else centre
            mad = float(median(abs(v - about) for v in spread_of))
            cells[r].append(reference_score(values[r][j], centre, mad, len(ordered) - 1, window))
    return cells


def reference_history(row: list[int | None], windows: list[float | None]) -> list[Cell]:
    own = [v for v in row if v is not None]
    if not own:
        return [NONE for _ in row]
    centre = float(median(own))
    mad = float(median(abs(v - centre) for v in own))
    return [reference_score(v, centre, mad, len(own), w) for v, w in zip(row, windows)]


TIGHT = (100, 101, 102, 105, 130)  # a tight spread: the z decides
WIDE = (80, 95, 100, 112, 125, 140)  # a wide one: cells ≥ 1.1× with a small z (the ratio alone does not flag)


def random_values(ranks: int, steps: int, seed: int, levels: tuple[int, ...] = TIGHT) -> list[list[int | None]]:
    rng = random.Random(seed)
    values: list[list[int | None]] = []
    for r in range(ranks):
        slow = 1.4 if r % 7 == 3 else 1.0
        row: list[int | None] = []
        for j in range(steps):
            if j == steps - 1 or rng.random() < 0.08:  # the last step: nobody reported it
                row.append(None)
            else:  # coarse values: ties happen
                row.append(int(rng.choice(levels) * slow * 1_000_000))
        values.append(row)
    return values


def as_matrix(values: list[list[int | None]]) -> np.ndarray:
    return np.array([[np.nan if v is None else v for v in row] for row in values], dtype=np.float64)


@pytest.mark.parametrize("levels", [TIGHT, WIDE])
@pytest.mark.parametrize("ranks", [3, 6, 20, EXACT_MAD_UP_TO + 1, 150])
def test_group_cells_equal_the_cell_by_cell_rule(ranks: int, levels: tuple[int, ...]) -> None:
    values = random_values(ranks, 12, seed=ranks, levels=levels)
    matrix = as_matrix(values)
    windows = column_medians(matrix)
    group = list(range(ranks))
    found = group_cells(group, matrix, windows, T)
    expected = reference_group(group, values, windows)
    assert found == [expected[r] for r in group]
    assert any(cell.flagged for row in found for cell in row)  # the slow ranks are in it


@pytest.mark.parametrize("levels", [TIGHT, WIDE])
def test_history_cells_equal_the_cell_by_cell_rule(levels: tuple[int, ...]) -> None:
    values = random_values(40, 12, seed=7, levels=levels)
    values[5] = [None] * 12  # a rank that reported nothing
    matrix = as_matrix(values)
    windows = column_medians(matrix)
    assert history_cells(matrix, windows, T) == [reference_history(row, windows) for row in values]


def test_column_medians_skip_missing_cells_and_say_none_for_an_empty_step() -> None:
    values = [[1, None, 5], [3, None, None], [4, None, 6]]
    assert column_medians(as_matrix(values)) == [3.0, None, 5.5]
