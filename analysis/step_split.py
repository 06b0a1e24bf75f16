"""Where the step goes in a job without a pipeline (DDP, FSDP2, tensor parallelism, a plain loop), in the
job's own terms: the model's compute, the optimizer, data loading, exposed communication per group split
into waiting for peers and transfer, and host gaps. No bubble: nothing in such a job is a pipeline's idle.

Algorithm (mean per rank per analysed step):
1. Totals: each rank's breakdown (``analysis.breakdown``: from its spans, or from its step aggregate where
   the step travelled without spans) gives compute C (the union of compute spans: the model's forward and
   backward, the optimizer, data loading), exposed communication X and idle I; window = C + X + I.
2. Splits, from the steps with spans: the model's, the optimizer's and data loading's shares of C (each
   kind's union over the rank's window); each group's share of X (its communication not under compute)
   and, of that, the share before the call's last member arrived (``collective_waits``: waiting for peers;
   the rest is transfer). They apply to the totals of every analysed step, spans or not.
3. Host gaps = I: time nothing was recorded in (Python and launch overhead between ops, host work
   outside the instrumented model). Of them, the gaps every rank has (per step, the least any rank had):
   one rank's gaps beyond its peers' are its own slowness, which the others wait for (step 4).
4. The culprit of the waits: the rank that started the collectives last, where it caused at least half of
   its peers' waits and 1.5 times its share by chance (``collective_waits.waits_and_culprits``), with the ranks
   that waited; its lateness is each of them's exposed wait for it (the exposed waits of every rank, times
   its share of the waits, over the ranks that waited): the step it would shrink by.
5. Compute instrumented: a step with spans holds a forward or backward span. Without one, the training
   reads as host gaps: the split says so, and names the call to add.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from bubblescope import intervals, wire
from bubblescope.analysis.attribution import CauseKind
from bubblescope.analysis.collective_waits import waits_and_culprits
from bubblescope.analysis.model import RankPlace, TimedSpan
from bubblescope.analysis.step_record import BrokenDownStep

MODEL_COMPUTE = CauseKind("model_compute", "compute", "the model's forward and backward")
OPTIMIZER = CauseKind("optimizer", "optimizer step", "optimizer.step(), outside the model's backward")
DATA_LOADING = CauseKind("data_loading", "data loading", "waiting for the next batch (the data loader's next())")
COLLECTIVE_WAIT = CauseKind(
    "collective_wait",
    "waiting for peers",
    "exposed communication before the call's last member arrived: a late rank makes every other rank wait",
)
COLLECTIVE_TRANSFER = CauseKind(
    "collective_transfer",
    "exposed transfer",
    "communication the rank waited on with no compute under it: moving the bytes",
)
HOST_GAPS = CauseKind(
    "host_gaps",
    "host gaps",
    "nothing recorded: Python and launch overhead between ops, host work outside the instrumented model",
)
STEP_PARTS: Final[tuple[CauseKind, ...]] = (
    MODEL_COMPUTE,
    OPTIMIZER,
    DATA_LOADING,
    COLLECTIVE_WAIT,
    COLLECTIVE_TRANSFER,
    HOST_GAPS,
)
"""Every part of a step without a pipeline, in the order a split lists them."""

MODEL_KINDS: Final = frozenset({"forward", "backward", "backward_input", "backward_weight"})
CULPRIT_SHARE: Final = 0.5
"""A rank is the culprit of its peers' waits when it caused at least this share of them, and at least 1.5 times
its share were the last arrival chosen at random (3/4 of them with two ranks)."""
NOT_INSTRUMENTED: Final = (
    "compute is not instrumented: no forward or backward was recorded, so the training reads as host gaps. "
    "Add collector.instrument_model(model) after building the model (collector.instrument_ddp(ddp_model) "
    "does it for DDP), or wrap forward and backward in collector.span(...)"
)


@dataclass(frozen=True)
class StepPart:
    name: str  # a STEP_PARTS name
    ns: float  # mean per rank per step
    fraction_of_step: float  # of the ranks' mean window


@dataclass(frozen=True)
class GroupTime:
    """One process group's exposed communication, mean per rank per step, ns."""

    group: str
    exposed_ns: float
    wait_ns: float
    transfer_ns: float


@dataclass(frozen=True)
class Culprit:
    """The rank its peers waited for in the collectives."""

    rank: int
    host: str | None
    caused_ns: float  # its peers' waits for it, summed over them, mean per step
    share: float  # of every wait in the collectives
    victims: list[int]  # the ranks that waited for it
    lateness_ns: float  # each victim's exposed wait for it (not under its own compute), mean per step

    def waited_on_by(self, ranks: Sequence[int]) -> bool:
        """Whether every one of ``ranks`` waits for this rank in the collectives: then whatever extra compute they
        show (a straggler finding) is not what holds the step, this rank is (the page and the suggestions say so)."""
        return bool(ranks) and self.rank not in ranks and set(ranks) <= set(self.victims)


@dataclass(frozen=True)
class StepSplit:
    window_ns: float  # the ranks' mean window per step
    parts: list[StepPart]
    groups: list[GroupTime]
    compute_instrumented: bool
    culprit: Culprit | None
    shared_gaps_ns: float = 0.0  # the host gaps every rank has (per step, the least of any rank's), mean per step

    def part(self, name: str) -> StepPart:
        return next(p for p in self.parts if p.name == name)

    @property
    def not_instrumented(self) -> str | None:
        """What to add when no compute was recorded, else None."""
        return None if self.compute_instrumented else NOT_INSTRUMENTED


@dataclass
class _Sums:
    """Sums over the ranks and steps with spans (step 2), ns."""

    compute: float = 0.0
    model: float = 0.0
    optimizer: float = 0.0
    data: float = 0.0
    exposed: float = 0.0
    steps: int = 0
    model_spans: int = 0

    def __post_init__(self) -> None:
        self.group_exposed: dict[str, float] = defaultdict(float)
        self.group_wait: dict[str, float] = defaultdict(float)
        self.caused: dict[int, float] = defaultdict(float)
        self.waited: set[int] = set()  # the ranks that waited in a collective


def split_steps(steps: Sequence[BrokenDownStep], places: Sequence[RankPlace]) -> StepSplit:
    """The split of ``steps`` (module docstring); ``steps`` is not empty."""
    coords = {place.rank: place.coords for place in places}
    rows = [b for step in steps for b in step.breakdowns]
    n = max(1, len(rows))
    window = sum(b.window_ns for b in rows) / n
    compute = sum(b.compute_ns for b in rows) / n
    exposed = sum(b.exposed_comm_ns for b in rows) / n
    idle = sum(b.idle_ns for b in rows) / n
    sums = _Sums()
    for step in steps:
        _add_step(sums, step, coords)
    if sums.compute > 0:
        model, optimizer, data = (compute * share for share in _shares(sums))
    else:  # no spans: the aggregates' compute is all the split knows
        model, optimizer, data = compute, 0.0, 0.0
    groups = _groups(sums, exposed)
    wait = sum(g.wait_ns for g in groups)
    values = {
        MODEL_COMPUTE.name: model,
        OPTIMIZER.name: optimizer,
        DATA_LOADING.name: data,
        COLLECTIVE_WAIT.name: wait,
        COLLECTIVE_TRANSFER.name: max(0.0, exposed - wait),
        HOST_GAPS.name: idle,
    }
    parts = [
        StepPart(kind.name, values[kind.name], values[kind.name] / window if window else 0.0) for kind in STEP_PARTS
    ]
    instrumented = sums.steps == 0 or sums.model_spans > 0
    shared_gaps = sum(min(b.idle_ns for b in step.breakdowns) for step in steps if step.breakdowns) / len(steps)
    return StepSplit(window, parts, groups, instrumented, _culprit(sums, places), shared_gaps)


def _add_step(sums: _Sums, step: BrokenDownStep, coords: Mapping[int, Mapping[str, int]]) -> None:
    spanned = {b.rank for b in step.breakdowns if b.from_spans}
    if not spanned or not step.record.spans:
        return
    sums.steps += 1
    by_rank: dict[int, list[TimedSpan]] = defaultdict(list)
    for span in step.record.spans:
        if span.rank in spanned:
            by_rank[span.rank].append(span)
    waits, caused_by = waits_and_culprits(step.record.spans, coords)
    for rank, spans in by_rank.items():
        lo, hi = step.record.windows[rank]
        kinds: dict[str, list[intervals.Interval]] = defaultdict(list)
        comm: dict[str, list[intervals.Interval]] = defaultdict(list)
        for span in spans:
            if span.kind in wire.COMPUTE_KINDS:
                kinds[span.kind].append((span.start_ns, span.end_ns))
                sums.model_spans += span.kind in MODEL_KINDS
            elif span.kind in wire.COMMUNICATION_KINDS:
                comm[span.group or "other"].append((span.start_ns, span.end_ns))
        all_compute = intervals.merge(intervals.clip([i for part in kinds.values() for i in part], lo, hi))
        sums.compute += intervals.total_length(all_compute)
        sums.model += _union(*(kinds[k] for k in MODEL_KINDS), lo=lo, hi=hi)
        sums.optimizer += _union(kinds["optimizer"], lo=lo, hi=hi)
        sums.data += _union(kinds["data_loading"], lo=lo, hi=hi)
        for group, parts in comm.items():
            sums.group_exposed[group] += _outside(parts, all_compute, lo, hi)
            sums.group_wait[group] += _outside(waits.get(group, {}).get(rank, []), all_compute, lo, hi)
    for rank, caused in caused_by.items():
        sums.caused[rank] += caused
    for by_rank_waits in waits.values():
        sums.waited.update(rank for rank, found in by_rank_waits.items() if found)


def _union(*parts: list[intervals.Interval], lo: int, hi: int) -> int:
    return intervals.total_length(intervals.merge(intervals.clip([i for part in parts for i in part], lo, hi)))


def _outside(parts: list[intervals.Interval], compute: list[intervals.Interval], lo: int, hi: int) -> int:
    """The length of ``parts`` (inside the window) not under ``compute`` (merged)."""
    merged = intervals.merge(intervals.clip(parts, lo, hi))
    return intervals.total_length(merged) - intervals.intersect_length(merged, compute)


def _shares(sums: _Sums) -> tuple[float, float, float]:
    """The model's, the optimizer's and data loading's shares of the compute union (normalised where kinds
    overlapped, as a hand-written span inside the model's would)."""
    total = sums.model + sums.optimizer + sums.data
    scale = sums.compute / total if total > sums.compute else 1.0
    return (sums.model * scale / sums.compute, sums.optimizer * scale / sums.compute, sums.data * scale / sums.compute)


def _groups(sums: _Sums, exposed: float) -> list[GroupTime]:
    measured = sum(sums.group_exposed.values())
    out = []
    for group, ns in sorted(sums.group_exposed.items(), key=lambda item: -item[1]):
        if ns <= 0:
            continue
        share = ns / measured
        wait_fraction = min(1.0, sums.group_wait[group] / ns)
        out.append(
            GroupTime(group, exposed * share, exposed * share * wait_fraction, exposed * share * (1 - wait_fraction))
        )
    return out


def _culprit(sums: _Sums, places: Sequence[RankPlace]) -> Culprit | None:
    total = sum(sums.caused.values())
    if not sums.caused or total <= 0:
        return None
    rank, caused = max(sums.caused.items(), key=lambda item: item[1])
    members = len(sums.waited | set(sums.caused))
    if caused / total < max(CULPRIT_SHARE, 1.5 / max(1, members)):
        return None
    hosts = {place.rank: place.host for place in places}
    victims = sorted(sums.waited - {rank})
    steps = max(1, sums.steps)
    exposed_waits = sum(sums.group_wait.values()) / steps  # over every rank, per step
    lateness = exposed_waits * (caused / total) / max(1, len(victims))
    return Culprit(rank, hosts.get(rank), caused / steps, caused / total, victims, lateness)
