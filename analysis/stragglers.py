"""Stragglers: which ranks (hosts, stages, replicas) are slow, on which steps, and how persistently.

In synchronous training every rank's step *window* is about the same (ranks wait for each
other), so a straggler shows in its busy time: its **compute** is longer, while the others show
more idle and exposed communication (waiting for it). Ranks are therefore scored on compute;
the other phases are reported beside it as evidence.

Algorithm (all times per rank per step, from the per-step aggregates):

1. **Matrix.** Ranks × steps of window, compute, comm, exposed comm and idle; each cell also as
   a ratio to the step's median over all ranks (the heatmap: a slow host or stage is a
   horizontal band, a one-off a lone cell).
2. **Comparable ranks.** Where ranks carry pipeline stages and there is more than one stage,
   stages legitimately do different work, so a rank is compared with its **stage peers** (the
   ranks of its stage in the other data-parallel replicas). Without stages, with **all ranks**.
   A pipeline rank with no stage peer is compared only with **its own history** (its median
   over the range): against other stages it would mistake stage imbalance for a straggler.
3. **Per-step score.** Baseline = median of the comparable ranks' compute at that step, the
   rank itself left out (so that with two peers, or half a group slow, the slow ones do not
   drag the baseline); spread = 1.4826 × MAD of those values, floored at
   ``min_relative_spread`` × baseline. ratio = x / baseline, robust z = (x − baseline) / spread.
   The own-history score is the same with the rank's own steps as the values. A cell is
   **flagged** when z ≥ ``z_score`` **and** ratio ≥ ``min_ratio`` **and** the excess x − baseline
   is at least ``min_excess_of_window`` of the step's median window — tiny MADs, tiny phases and
   jitter do not flag. With fewer than ``min_values_for_z`` comparable values (two replicas,
   four ranks of which two are slow) a MAD says little, so the ratio and the excess decide
   alone. Only slowness is flagged, never a fast rank.
4. **Rank verdict** from the flagged steps of its basis (peers, else history), over the steps
   it reported: *persistent* when flagged on ≥ ``persistent_fraction`` of them; else *one-off*
   when the flags form at most ``max_one_off_episodes`` runs of consecutive steps;
   else *intermittent* when flagged on ≥ ``intermittent_fraction``; else *noise* (scattered short
   flags: no finding); *normal* when never flagged.
5. **Groups** by host, by stage and by data-parallel replica (mesh coordinate ``dp``), for each
   grouping with at least two groups, and each group of at least two ranks: a step counts
   against the group when every rank of it is flagged there on the same footing — all by their
   basis, or all by their own history (a stage that slows down as a whole is invisible to stage
   peers) and by comparable amounts (each member's excess over its baseline at least
   ``group_min_share`` of the largest member's: a straggler plus a neighbour's hiccup, or one
   rank's slowdown that a neighbour feels a little, is not a slow host) — while at most
   ``max_outside_fraction`` of the other ranks are (else the whole job was slow, not the
   group). The group's verdict follows rule 4 on those steps: *slow host*, *slow stage* (the
   band), *slow replica*. Groups of different groupings holding the same ranks are reported
   once, the others named as aliases.
6. **Findings**, group findings first; a rank inside a reported group gets no finding of its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from statistics import median
from typing import NamedTuple

import numpy as np

from bubblescope.analysis import straggler_cells as cell_math
from bubblescope.analysis.model import RankPlace
from bubblescope.analysis.straggler_cells import Cell

PHASES = ("window", "compute", "comm", "exposed_comm", "idle")
LISTED_PEERS = 64
MIN_VERDICT_STEPS = 10
"""Steps after the warm-up before a straggler verdict is acted on (an alert, a suggestion to drain a
host): on fewer, a verdict on 2 of 4 steps is noise (a crashed run's survivor, a warm-up)."""
"""A rank's stage peers are listed up to this many, and only counted past it (16,384 ranks in 8 stages
would list 33 million peers)."""
GROUP_KINDS = {"host": "slow host", "stage": "slow stage", "dp": "slow replica"}


class RankStepTimes(NamedTuple):
    """One rank's per-step aggregate, in ns (a tuple: a 16,384-rank × 100-step range builds 1.6 million)."""

    rank: int
    step: int
    window_ns: int
    compute_ns: int
    comm_ns: int
    exposed_comm_ns: int
    idle_ns: int


@dataclass(frozen=True)
class RankPlacement:
    """Where a rank runs: its host, pipeline stage and mesh coordinates (e.g. ``{"dp": 1}``)."""

    rank: int
    host: str | None = None
    stage: int | None = None
    coords: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class StragglerThresholds:
    z_score: float = 3.5
    min_ratio: float = 1.10
    min_excess_of_window: float = 0.01
    min_relative_spread: float = 0.01
    persistent_fraction: float = 0.5
    max_one_off_episodes: int = 2
    intermittent_fraction: float = 0.2
    max_outside_fraction: float = 0.5
    group_min_share: float = 0.5  # a group slow together: each member's excess ≥ this × the largest's
    min_values_for_z: int = 5  # with fewer comparable values the MAD says little: ratio and excess decide


@dataclass(frozen=True)
class PhaseMatrix:
    """``values_ns[i][j]``: rank ``ranks[i]`` at step ``steps[j]`` (None: not reported);
    ``step_median_ns[j]``: the median over the ranks of step ``steps[j]``, the ratios' denominator."""

    phase: str
    values_ns: list[list[int | None]]
    ratio_to_step_median: list[list[float | None]]
    step_median_ns: list[float | None]


@dataclass(frozen=True)
class RankScore:
    rank: int
    host: str | None
    stage: int | None
    dp: int | None
    basis: str  # "stage peers" | "all ranks" | "own history"
    peers: list[int]  # the stage peers (empty for "all ranks" and "own history", and past LISTED_PEERS)
    peer_count: int  # how many stage peers the rank has (0 for "all ranks" and "own history")
    steps_scored: int
    median_ratio: float | None  # compute / baseline, median over the scored steps
    median_z: float | None
    flagged_steps: list[int]
    flagged_fraction: float
    flagged_median_ratio: float | None
    verdict: str  # "persistent" | "one-off" | "intermittent" | "noise" | "normal"
    phase_ratios: dict[str, float | None]  # per phase: median over steps of the ratio to the step median


@dataclass(frozen=True)
class GroupFinding:
    dimension: str  # "host" | "stage" | "dp"
    group: str
    kind: str  # "slow host" | "slow stage" | "slow replica"
    ranks: list[int]
    flagged_steps: list[int]
    steps_scored: int
    flagged_fraction: float
    median_ratio: float | None
    verdict: str
    basis: str  # "peers": flagged against comparable ranks; "own history": against the ranks' own medians
    aliases: list[str]


@dataclass(frozen=True)
class Finding:
    kind: str  # "slow rank" | "slow host" | "slow stage" | "slow replica"
    verdict: str
    ranks: list[int]
    steps: list[int]
    ratio: float | None
    message: str
    compared_with: str = "the median of comparable ranks"  # what ``ratio`` divides by, in words


@dataclass(frozen=True)
class StragglerReport:
    ranks: list[int]
    steps: list[int]
    matrices: dict[str, PhaseMatrix]
    flagged: list[list[bool]]  # compute cells flagged by the rank's basis, like the matrices
    ratio_to_baseline: list[list[float | None]]  # compute cells / the rank's basis, what the flags compare
    rank_scores: list[RankScore]
    groups: list[GroupFinding]
    findings: list[Finding]
    thresholds: StragglerThresholds


def find_stragglers(
    rows: Iterable[RankStepTimes],
    placements: Iterable[RankPlacement] = (),
    thresholds: StragglerThresholds = StragglerThresholds(),
) -> StragglerReport:
    """Score every rank on every step of ``rows`` and say which are stragglers (module docstring)."""
    table = {(row.rank, row.step): row for row in rows}
    where = {p.rank: p for p in placements}
    ranks = sorted({rank for rank, _ in table} | set(where))
    steps = sorted({step for _, step in table})
    for rank in ranks:
        where.setdefault(rank, RankPlacement(rank))
    arrays = _phase_arrays(table, ranks, steps)
    matrices = {phase: _phase_matrix(phase, values) for phase, values in arrays.items()}
    windows = matrices["window"].step_median_ns
    basis, groups_of_peers = _comparable_groups(where, ranks)
    history = dict(zip(ranks, cell_math.history_cells(arrays["compute"], windows, thresholds)))
    cells = dict(history)
    peers: dict[int, list[int]] = {r: [] for r in ranks}
    row_of = {r: i for i, r in enumerate(ranks)}
    for group in (g for g in groups_of_peers if len(g) > 1):
        members = [row_of[r] for r in group]
        cells.update(zip(group, cell_math.group_cells(members, arrays["compute"], windows, thresholds)))
        if basis == "stage peers":
            listed = len(group) - 1 <= LISTED_PEERS
            peers.update({r: [q for q in group if q != r] if listed else [] for r in group})
    peer_counts = {r: len(g) - 1 for g in groups_of_peers if basis == "stage peers" and len(g) > 1 for r in g}
    bases = {r: basis if cells[r] is not history[r] else "own history" for r in ranks}
    phase_ratios = {
        p: cell_math.row_medians(cell_math.ratios(a, matrices[p].step_median_ns)) for p, a in arrays.items()
    }
    scores = [
        _rank_score(
            r,
            where[r],
            bases[r],
            peers[r],
            peer_counts.get(r, 0),
            cells[r],
            steps,
            {p: medians[i] for p, medians in phase_ratios.items()},
            thresholds,
        )
        for i, r in enumerate(ranks)
    ]
    groups = _group_findings(where, ranks, steps, cells, history, thresholds)
    return StragglerReport(
        ranks=ranks,
        steps=steps,
        matrices=matrices,
        flagged=[[cell.flagged for cell in cells[r]] for r in ranks],
        ratio_to_baseline=[[cell.ratio for cell in cells[r]] for r in ranks],
        rank_scores=scores,
        groups=groups,
        findings=_findings(groups, scores),
        thresholds=thresholds,
    )


def _phase_arrays(
    table: Mapping[tuple[int, int], RankStepTimes], ranks: list[int], steps: list[int]
) -> dict[str, cell_math.Matrix]:
    """Per phase, ranks × steps of its ns (NaN: not reported)."""
    cube = np.full((len(ranks), len(steps), len(PHASES)), np.nan)
    if table:
        rows = np.array(list(table.values()), dtype=np.int64)
        at = np.searchsorted(np.array(ranks), rows[:, 0]), np.searchsorted(np.array(steps), rows[:, 1])
        columns = [RankStepTimes._fields.index(f"{phase}_ns") for phase in PHASES]
        cube[at] = rows[:, columns]
    return {phase: cube[:, :, k] for k, phase in enumerate(PHASES)}


def _phase_matrix(phase: str, values: cell_math.Matrix) -> PhaseMatrix:
    medians = cell_math.column_medians(values)
    ratios = cell_math.as_rows(cell_math.ratios(values, medians), integers=False)
    return PhaseMatrix(phase, cell_math.as_rows(values, integers=True), ratios, medians)  # type: ignore[arg-type]


def _median_of(values: Iterable[int | float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(median(present)) if present else None


def _comparable_groups(where: Mapping[int, RankPlacement], ranks: list[int]) -> tuple[str, list[list[int]]]:
    """The basis and the groups of mutually comparable ranks: stages where stages differ, else all."""
    stages = {where[r].stage for r in ranks}
    known = sorted(stage for stage in stages if stage is not None)
    if len(stages) > 1 and len(known) == len(stages):
        return "stage peers", [[r for r in ranks if where[r].stage == stage] for stage in known]
    return "all ranks", [ranks] if ranks else []


def _verdict(flagged: list[bool], scored: int, t: StragglerThresholds) -> str:
    count = sum(flagged)
    if count == 0 or scored == 0:
        return "normal"
    if count / scored >= t.persistent_fraction:
        return "persistent"
    episodes = sum(1 for j, f in enumerate(flagged) if f and (j == 0 or not flagged[j - 1]))
    if episodes <= t.max_one_off_episodes:
        return "one-off"
    return "intermittent" if count / scored >= t.intermittent_fraction else "noise"


def _rank_score(
    rank: int,
    where: RankPlacement,
    basis: str,
    peers: list[int],
    peer_count: int,
    cells: list[Cell],
    steps: list[int],
    phase_ratios: dict[str, float | None],
    t: StragglerThresholds,
) -> RankScore:
    scored = [c for c in cells if c.ratio is not None]
    flagged = [c.flagged for c in cells]
    count = sum(flagged)
    return RankScore(
        rank=rank,
        host=where.host,
        stage=where.stage,
        dp=where.coords.get("dp"),
        basis=basis,
        peers=peers,
        peer_count=peer_count,
        steps_scored=len(scored),
        median_ratio=_median_of(c.ratio for c in scored),
        median_z=_median_of(c.z for c in scored),
        flagged_steps=[s for s, f in zip(steps, flagged) if f],
        flagged_fraction=count / len(scored) if scored else 0.0,
        flagged_median_ratio=_median_of(c.ratio for c in cells if c.flagged),
        verdict=_verdict(flagged, len(scored), t),
        phase_ratios=phase_ratios,
    )


def _group_key(where: RankPlacement, dimension: str) -> str | None:
    value = where.coords.get("dp") if dimension == "dp" else getattr(where, dimension)
    return None if value is None else str(value)


def _group_findings(
    where: Mapping[int, RankPlacement],
    ranks: list[int],
    steps: list[int],
    cells: Mapping[int, list[Cell]],
    history: Mapping[int, list[Cell]],
    t: StragglerThresholds,
) -> list[GroupFinding]:
    found: list[GroupFinding] = []
    slow_per_step = [sum(cells[r][j].flagged or history[r][j].flagged for r in ranks) for j in range(len(steps))]
    for dimension in GROUP_KINDS:
        members: dict[str, list[int]] = {}
        for r in ranks:
            key = _group_key(where[r], dimension)
            if key is not None:
                members.setdefault(key, []).append(r)
        if len(members) < 2:
            continue
        for group, inside in members.items():
            finding = _group_finding(dimension, group, inside, len(ranks), slow_per_step, steps, cells, history, t)
            if finding is None:
                continue
            same = next((i for i, f in enumerate(found) if f.ranks == finding.ranks), None)
            if same is None:
                found.append(finding)
            else:
                found[same] = replace(found[same], aliases=[*found[same].aliases, f"{dimension} {group}"])
    return found


def _group_finding(
    dimension: str,
    group: str,
    inside: list[int],
    rank_count: int,
    slow_per_step: list[int],
    steps: list[int],
    cells: Mapping[int, list[Cell]],
    history: Mapping[int, list[Cell]],
    t: StragglerThresholds,
) -> GroupFinding | None:
    """``slow_per_step[j]``: how many of all ``rank_count`` ranks are flagged at step j (by peers or their
    own history); the group's own are taken off to count those outside it, O(group) per step."""
    outside = rank_count - len(inside)
    if len(inside) < 2 or not outside:
        return None
    scored = [j for j in range(len(steps)) if all(cells[r][j].ratio is not None for r in inside)]

    def slow_outside(j: int) -> int:
        return slow_per_step[j] - sum(cells[r][j].flagged or history[r][j].flagged for r in inside)

    def together(footing: Mapping[int, list[Cell]], j: int) -> bool:
        members = [footing[r][j] for r in inside]
        excess = [cell.ratio - 1 for cell in members if cell.flagged and cell.ratio is not None]
        if len(excess) < len(members):
            return False
        return min(excess) >= t.group_min_share * max(excess)

    flagged = [
        (together(cells, j) or together(history, j)) and slow_outside(j) <= t.max_outside_fraction * outside
        for j in scored
    ]
    verdict = _verdict(flagged, len(scored), t)
    if verdict in ("normal", "noise"):
        return None
    hits = [j for j, f in zip(scored, flagged) if f]
    by_peers = all(cells[r][j].flagged and cells[r][j] is not history[r][j] for r in inside for j in hits)
    ratios = [
        (cells[r][j] if by_peers or not history[r][j].flagged else history[r][j]).ratio for r in inside for j in hits
    ]
    return GroupFinding(
        dimension=dimension,
        group=group,
        kind=GROUP_KINDS[dimension],
        ranks=inside,
        flagged_steps=[steps[j] for j in hits],
        steps_scored=len(scored),
        flagged_fraction=len(hits) / len(scored),
        median_ratio=_median_of(ratios),
        verdict=verdict,
        basis="peers" if by_peers else "own history",
        aliases=[],
    )


VERDICT_WORDS = {
    "persistent": "a persistent straggler",
    "one-off": "a one-off slowdown",
    "intermittent": "an intermittent straggler",
}
BASIS_WORDS = {
    "stage peers": "the median of its stage peers",
    "all ranks": "the median of the other ranks",
    "own history": "its own median step",
}


def _steps_text(flagged: list[int], total: int) -> str:
    if len(flagged) <= 3 and flagged:
        listed = ", ".join(str(s) for s in flagged)
        return f"on step{'s' if len(flagged) > 1 else ''} {listed} ({len(flagged)} of {total})"
    return f"on {len(flagged)} of {total} steps"


def _rank_label(score: RankScore) -> str:
    parts = [f"host {score.host}" if score.host else None, f"stage {score.stage}" if score.stage is not None else None]
    where = ", ".join(p for p in parts if p)
    return f"rank {score.rank} ({where})" if where else f"rank {score.rank}"


def _findings(groups: list[GroupFinding], scores: list[RankScore]) -> list[Finding]:
    findings = []
    for g in groups:
        names = ", ".join([f"{g.dimension} {g.group}", *g.aliases])
        ranks = ", ".join(str(r) for r in g.ranks)
        than = "the median of comparable ranks" if g.basis == "peers" else "their own median step"
        message = (
            f"{names} (ranks {ranks}): all its ranks compute {g.median_ratio or 0:.2f}× {than} "
            f"{_steps_text(g.flagged_steps, g.steps_scored)} while the other ranks do not: "
            f"a {g.kind} ({g.verdict})"
        )
        findings.append(Finding(g.kind, g.verdict, g.ranks, g.flagged_steps, g.median_ratio, message, than))
    grouped = {r for g in groups for r in g.ranks}
    for s in scores:
        if s.verdict not in VERDICT_WORDS or s.rank in grouped:
            continue
        message = (
            f"{_rank_label(s)} computes {s.flagged_median_ratio or 0:.2f}× {BASIS_WORDS[s.basis]} "
            f"{_steps_text(s.flagged_steps, s.steps_scored)}: {VERDICT_WORDS[s.verdict]}"
        )
        findings.append(
            Finding(
                "slow rank", s.verdict, [s.rank], s.flagged_steps, s.flagged_median_ratio, message, BASIS_WORDS[s.basis]
            )
        )
    return findings


def straggler_report(times: Iterable[RankStepTimes], places: Sequence[RankPlace]) -> StragglerReport:
    """Every rank scored on every step of ``times`` against its peers, placed where ``places`` say."""
    return find_stragglers(times, [RankPlacement(p.rank, p.host, p.stage, p.coords) for p in places])
