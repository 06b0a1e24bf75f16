"""API shape of the stragglers view: the API's own models, filled from ``analysis.stragglers``'s report."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, PlainSerializer

from bubblescope.backend.fields import FromAnalysis


def _four_places(value: float) -> float:
    return round(value, 4)


Ratio = Annotated[float, PlainSerializer(_four_places, return_type=float)]
"""A ratio (or a score) written with 4 decimals: a matrix of 100k of them is a third of its full-precision
size."""


class PhaseMatrixOut(FromAnalysis):
    """One phase's rank × step times and their ratio to the step's median over all ranks."""

    phase: str
    values_ns: list[list[int | None]] | None = Field(description="rank × step times (null in a compact answer)")
    ratio_to_step_median: list[list[Ratio | None]] | None = Field(
        description="each cell over its step's median over all ranks (null in a compact answer: the heat map "
        "draws `ratio_to_baseline`, what the flags compare)"
    )
    step_median_ns: list[float | None] = Field(description="per step, the median over the ranks: the ratios' base")


class RankScoreOut(FromAnalysis):
    rank: int
    host: str | None
    stage: int | None
    dp: int | None
    basis: str = Field(description='"stage peers", "all ranks" or "own history": what the rank is compared with')
    peers: list[int] = Field(
        description="the stage peers (empty for all ranks and own history, and past 64 peers: see peer_count)"
    )
    peer_count: int = Field(description="how many stage peers the rank is compared with (0: not by peers)")
    steps_scored: int
    median_ratio: Ratio | None = Field(description="compute / baseline, median over the scored steps")
    median_z: Ratio | None
    flagged_steps: list[int]
    flagged_fraction: Ratio
    flagged_median_ratio: Ratio | None
    verdict: str = Field(description="persistent, one-off, intermittent, noise or normal")
    phase_ratios: dict[str, Ratio | None] = Field(
        description="per phase (window, compute, comm, exposed_comm, idle): median over steps of the ratio to the "
        "step's median over all ranks"
    )


class GroupFindingOut(FromAnalysis):
    dimension: str = Field(description="host, stage or dp")
    group: str
    kind: str = Field(description="slow host, slow stage or slow replica")
    ranks: list[int]
    flagged_steps: list[int]
    steps_scored: int
    flagged_fraction: float
    median_ratio: float | None
    verdict: str
    basis: str = Field(description="peers: flagged against comparable ranks; own history: against their own medians")
    aliases: list[str]


class FindingOut(FromAnalysis):
    kind: str = Field(description="slow rank, slow host, slow stage or slow replica")
    verdict: str
    ranks: list[int]
    steps: list[int]
    ratio: float | None
    message: str
    compared_with: str = Field(
        description="what ratio divides by: the median of its stage peers, of the other ranks, or its own median step"
    )


class StragglerThresholdsOut(FromAnalysis):
    z_score: float
    min_ratio: float
    min_excess_of_window: float
    min_relative_spread: float
    persistent_fraction: float
    max_one_off_episodes: int
    intermittent_fraction: float
    max_outside_fraction: float
    group_min_share: float
    min_values_for_z: int


class StragglersOut(FromAnalysis):
    run_key: str
    from_step: int | None = Field(description="first step of the range (None: the run has no steps yet)")
    to_step: int | None
    ranks: list[int] = Field(description="row order of every matrix")
    hosts: list[str | None] = Field(description="each row's host, like ranks")
    stages: list[int | None] = Field(description="each row's pipeline stage, like ranks")
    steps: list[int] = Field(description="column order of every matrix (steps some rank reported)")
    matrices: dict[str, PhaseMatrixOut] = Field(
        description="window, compute, comm, exposed_comm, idle (those asked for with `phases`)"
    )
    flagged: list[list[bool]] | None = Field(
        description="compute cells flagged against the rank's basis, like the matrices (null in a compact answer)"
    )
    ratio_to_baseline: list[list[Ratio | None]] = Field(
        description="each compute cell over the rank's baseline, what its flag compares (its stage peers' median, "
        "all ranks' or its own history: the rank's score's basis), like the matrices; a stage slow by design is "
        "about 1 here (imbalance, in the analysis), a straggler above it"
    )
    flagged_cells: list[tuple[int, int]] = Field(
        description="the flagged compute cells as [row, column] indexes into ranks and steps"
    )
    rank_scores: list[RankScoreOut] = Field(
        description="every rank's score, like ranks (a compact answer: only the ranks not scored normal)"
    )
    groups: list[GroupFindingOut]
    findings: list[FindingOut] = Field(description="what to read first, in plain English")
    thresholds: StragglerThresholdsOut
