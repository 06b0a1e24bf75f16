"""The one registry of pipeline schedules. The demo, the run config, the simulator, the what-if
replay, the suggestions and the planner all read it (``lookup``); none keeps a list of its own.

**Names.** The one home of the schedules' names: code elsewhere holds a ``Schedule`` (``ONE_F_ONE_B``,
``lookup(name)`` at the edge), never a name of its own. Each schedule has a short name (``1f1b``: the demo's ``--schedule``, the API's), torch's
class in ``torch.distributed.pipelining`` (``Schedule1F1B``, what the collector reports) and
torchtitan's name, torch's without ``Schedule`` (``1F1B``: what torch's own ``get_schedule_class``
takes). ``lookup`` accepts any of them and a few aliases from the literature (``zbh1``,
``layerwise``), ignoring case, ``-``, ``_`` and spaces. A test holds every name torch's
``get_schedule_class`` knows against this table.

**Placement.** ``single`` schedules run one stage per rank; ``loop`` schedules hold stages r, r+p,
r+2p, ... (``stages_per_rank`` of them, 2 unless told); ``v`` schedules (ZB-V, DualPipeV) hold
exactly two, r and 2p-1-r, so the first and the last stage sit on rank 0.

**Shape.** What torch's constructors refuse, refused here with the field named: 1F1B and DualPipeV
need at least as many micro-batches as stages; the interleaved schedules a multiple of their
rounds, max(1, m // p); a naive layer-wise split runs one micro-batch.

**Closed-form bubble**, as a fraction of wall time for p ranks, m micro-batches and v stages per
rank, with equal stage times and free communication (the zero-bubble forms take
T_F = T_B(input) = T_W). The simulator replays any other durations and agrees with each form
exactly (``tests/analysis/test_simulator.py``); ``docs/time.md`` has the table with its sources.

- naive layer-wise split: (p-1)/p; GPipe and 1F1B: (p-1)/(m+p-1);
- interleaved 1F1B and looped BFS: ((p-1)/v)/(m+(p-1)/v);
- ZB-H1 (``ScheduleInterleavedZeroBubble``): (p-1)(T_F+T_B-T_W) idle per rank, i.e.
  ((p-1)/v)/(3m+(p-1)/v);
- ZBV and DualPipeV (v=2, m >= 2p): torch's orders idle (p-1)·T per rank, the same
  ((p-1)/2)/(3m+(p-1)/2) (DualPipeV's (S/2-1)(T_F&B+T_B-3T_W) with S = 2p stages).

**Activations in flight** on the worst rank, in chunks of a stage's activations per micro-batch
(one chunk per stage and micro-batch; a rank with v stages holds chunks of 1/v of its layers):
naive 1, GPipe m, 1F1B min(p, m), interleaved min(p·v+p-1, m·v), looped BFS m·v, ZB-V min(2p, 2m),
DualPipeV min(2p+1, 2m).

**Action orders**: ``schedule_orders.py`` (ported from torch, checked against its own).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal

from bubblescope import wire
from bubblescope.analysis import schedule_orders as orders
from bubblescope.analysis.errors import InputError
from bubblescope.analysis.schedule_orders import Action

Placement = Literal["single", "loop", "v"]
OrderBuilder = Callable[[int, int, int, int], list[Action]]
Rule = Callable[[int, int, int], int]
ClosedForm = Callable[[int, int, int], "BubbleFloor | None"]


MAX_ACTIONS = 120_000
"""The largest schedule built or replayed (64 stages x 2 per rank x 300 micro-batches fits): a replay
costs about 4 us per action on the CI machine, and one analysis replays the schedule a few dozen
times, so bigger shapes are refused rather than run for minutes."""


class ScheduleError(InputError):
    """A schedule name or shape that cannot be replayed or planned; ``field`` names the input."""


@dataclass(frozen=True)
class BubbleFloor:
    fraction: float
    formula: str


@dataclass(frozen=True, kw_only=True)
class Schedule:
    name: str
    """Short name: the demo's ``--schedule``, the API's, the one every answer carries."""
    torch_class: str | None
    """The class in ``torch.distributed.pipelining``; None for the naive split torch does not ship."""
    placement: Placement
    orders: OrderBuilder
    """Every rank's actions in order: ``orders(rank, p, m, v)``."""
    closed_form: ClosedForm
    """The bubble for equal stages and free communication: ``closed_form(p, m, v)`` (None: not covered)."""
    in_flight: Rule
    """Activation chunks held at once by the worst rank: ``in_flight(p, m, v)``."""
    aliases: tuple[str, ...] = ()
    """Other names from the literature; torch's and torchtitan's are accepted anyway."""
    min_microbatches: Literal["none", "stages", "one"] = "none"
    """``stages``: m >= p·v (torch refuses fewer); ``one``: exactly one micro-batch."""
    rounds: bool = False
    """Micro-batches must be a multiple of the rounds, max(1, m // p) (torch's interleaved schedules)."""

    @property
    def torchtitan_name(self) -> str | None:
        """torchtitan's ``pipeline_parallel_schedule`` (torch's ``get_schedule_class`` name)."""
        return None if self.torch_class is None else self.torch_class.removeprefix("Schedule")

    @property
    def default_stages_per_rank(self) -> int:
        return 1 if self.placement == "single" else 2

    def stages_per_rank(self, asked: int | None = None) -> int:
        """Stages each rank runs: 1 for ``single``, 2 for ``v``, ``asked`` (default 2) for ``loop``."""
        if asked is None:
            return self.default_stages_per_rank
        if asked < 1:
            raise ScheduleError("stages_per_rank", f"must be at least 1, got {asked}")
        if self.placement != "loop" and asked != self.default_stages_per_rank:
            count = "one stage" if self.placement == "single" else "exactly 2 stages"
            raise ScheduleError("stages_per_rank", f"{self.label} runs {count} per rank, got {asked}")
        return asked

    @property
    def label(self) -> str:
        return self.torch_class or "naive layer-wise model parallelism"

    def stage_rank(self, ranks: int, stage: int) -> int:
        """The rank that runs ``stage``."""
        if self.placement == "v":
            return stage if stage < ranks else 2 * ranks - 1 - stage
        return stage % ranks

    def local_stages(self, rank: int, ranks: int, per_rank: int | None = None) -> list[int]:
        """The stage indices ``rank`` runs, in order."""
        count = self.stages_per_rank(per_rank)
        if self.placement == "v":
            return [rank, 2 * ranks - 1 - rank]
        return [rank + ranks * local for local in range(count)]

    def shape_problem(self, ranks: int, microbatches: int, stages_per_rank: int) -> ScheduleError | None:
        """Why this schedule cannot run p ranks × v stages with m micro-batches, or None."""
        if ranks < 1:
            return ScheduleError("ranks", f"must be at least 1, got {ranks}")
        if microbatches < 1:
            return ScheduleError("microbatches", f"must be at least 1, got {microbatches}")
        try:
            v = self.stages_per_rank(stages_per_rank)
        except ScheduleError as error:
            return error
        if self.min_microbatches == "one" and microbatches != 1:
            return ScheduleError("microbatches", f"{self.label} runs 1 micro-batch per step, got {microbatches}")
        if self.min_microbatches == "stages" and ranks > 1 and microbatches < ranks * v:
            return ScheduleError(
                "microbatches",
                f"{self.label} needs at least as many micro-batches as stages ({ranks * v}), got {microbatches}",
            )
        rounds = max(1, microbatches // ranks)
        if self.rounds and microbatches % rounds:
            return ScheduleError(
                "microbatches",
                f"{self.label} needs a multiple of its rounds, max(1, m // p) = {rounds}, got {microbatches}",
            )
        return None

    def bubble(self, ranks: int, microbatches: int, stages_per_rank: int = 1) -> BubbleFloor | None:
        """The closed-form bubble of the module docstring; None for a shape the form does not cover."""
        if ranks < 1 or microbatches < 1 or stages_per_rank < 1:
            return None
        return self.closed_form(ranks, microbatches, stages_per_rank)

    def build_orders(self, ranks: int, microbatches: int, stages_per_rank: int = 1) -> dict[int, list[Action]]:
        """Every rank's actions in the order it runs them; ``ScheduleError`` for a shape torch refuses
        (``stages_per_rank`` is ignored by ``single`` schedules)."""
        v = self._orderable(ranks, microbatches, stages_per_rank)
        return {rank: self.orders(rank, ranks, microbatches, v) for rank in range(ranks)}

    def rank_order(self, rank: int, ranks: int, microbatches: int, stages_per_rank: int = 1) -> list[Action]:
        """One rank's actions in the order it runs them (``build_orders``'s, for that rank alone)."""
        v = self._orderable(ranks, microbatches, stages_per_rank)
        if not 0 <= rank < ranks:
            raise ScheduleError("rank", f"must be in 0..{ranks - 1}, got {rank}")
        return self.orders(rank, ranks, microbatches, v)

    def _orderable(self, ranks: int, microbatches: int, stages_per_rank: int) -> int:
        """The stages per rank the orders use; ``ScheduleError`` for a shape torch refuses or one past the size
        a replay takes."""
        v = 1 if self.placement == "single" else stages_per_rank
        problem = self.shape_problem(ranks, microbatches, v)
        if problem is not None:
            raise problem
        actions = 3 * ranks * v * microbatches
        if actions > MAX_ACTIONS:
            raise ScheduleError(
                "num_microbatches",
                f"{microbatches} micro-batches on {ranks * v} stages make {actions:,} actions, above the "
                f"{MAX_ACTIONS:,} a replay takes",
            )
        return v


def _naive(p: int, m: int, v: int) -> BubbleFloor:
    return BubbleFloor((p - 1) / p, "(p-1)/p")


def _fill_drain(p: int, m: int, v: int) -> BubbleFloor:
    return BubbleFloor((p - 1) / (m + p - 1), "(p-1)/(m+p-1)")


def _interleaved(p: int, m: int, v: int) -> BubbleFloor:
    lead = (p - 1) / v
    return BubbleFloor(lead / (m + lead), "((p-1)/v)/(m+(p-1)/v)")


def _zero_bubble(p: int, m: int, v: int) -> BubbleFloor:
    lead = (p - 1) / v
    return BubbleFloor(lead / (3 * m + lead), "((p-1)/v)/(3m+(p-1)/v), T_F=T_B=T_W")


def _v_shape(p: int, m: int, v: int) -> BubbleFloor | None:
    if v != 2 or m < 2 * p:
        return None
    lead = (p - 1) / 2
    return BubbleFloor(lead / (3 * m + lead), "((p-1)/2)/(3m+(p-1)/2), T_F=T_B=T_W, m>=2p")


NAIVE: Final = Schedule(
    name=wire.LAYERWISE_SCHEDULE,  # what the collector reports for a layer-wise split
    closed_form=_naive,
    torch_class=None,
    placement="single",
    orders=orders.gpipe,
    in_flight=lambda p, m, v: 1,
    aliases=("layerwise", "modelparallel"),
    min_microbatches="one",
)

GPIPE: Final = Schedule(
    name="gpipe",
    closed_form=_fill_drain,
    torch_class="ScheduleGPipe",
    placement="single",
    orders=orders.gpipe,
    in_flight=lambda p, m, v: m,
)

ONE_F_ONE_B: Final = Schedule(
    name="1f1b",
    closed_form=_fill_drain,
    torch_class="Schedule1F1B",
    placement="single",
    orders=orders.one_f_one_b,
    in_flight=lambda p, m, v: min(p, m),
    min_microbatches="stages",
)

INTERLEAVED_1F1B: Final = Schedule(
    name="interleaved1f1b",
    closed_form=_interleaved,
    torch_class="ScheduleInterleaved1F1B",
    placement="loop",
    orders=orders.interleaved_1f1b,
    in_flight=lambda p, m, v: min(p * v + p - 1, m * v),
    rounds=True,
)

LOOPED_BFS: Final = Schedule(
    name="loopedbfs",
    closed_form=_interleaved,
    torch_class="ScheduleLoopedBFS",
    placement="loop",
    orders=orders.looped_bfs,
    in_flight=lambda p, m, v: m * v,
)

INTERLEAVED_ZERO_BUBBLE: Final = Schedule(
    name="interleavedzb",
    closed_form=_zero_bubble,
    torch_class="ScheduleInterleavedZeroBubble",
    placement="loop",
    orders=orders.interleaved_zero_bubble,
    in_flight=lambda p, m, v: min(p * v + p - 1, m * v),
    aliases=("zbh1", "zb1p"),
    rounds=True,
)

ZBV: Final = Schedule(
    name="zbv",
    closed_form=_v_shape,
    torch_class="ScheduleZBVZeroBubble",
    placement="v",
    orders=orders.zbv,
    in_flight=lambda p, m, v: min(2 * p, 2 * m),
)

DUALPIPE_V: Final = Schedule(
    name="dualpipev",
    closed_form=_v_shape,
    torch_class="ScheduleDualPipeV",
    placement="v",
    orders=orders.dualpipev,
    in_flight=lambda p, m, v: min(2 * p + 1, 2 * m),
    min_microbatches="stages",
)

SCHEDULES: tuple[Schedule, ...] = (
    NAIVE,
    GPIPE,
    ONE_F_ONE_B,
    INTERLEAVED_1F1B,
    LOOPED_BFS,
    INTERLEAVED_ZERO_BUBBLE,
    ZBV,
    DUALPIPE_V,
)
DEFAULT_SCHEDULE: Final = ONE_F_ONE_B
"""The schedule a run, the demo and the planner assume when none is named."""
NAMES: tuple[str, ...] = tuple(schedule.name for schedule in SCHEDULES)


def _key(name: str) -> str:
    return "".join(name.split()).lower().replace("-", "").replace("_", "")


def _index() -> dict[str, Schedule]:
    index: dict[str, Schedule] = {}
    for schedule in SCHEDULES:
        names = [schedule.name, *schedule.aliases]
        if schedule.torch_class is not None:
            names += [schedule.torch_class, schedule.torch_class.removeprefix("Schedule")]
        index.update({_key(name): schedule for name in names})
    return index


_BY_KEY = _index()


def lookup(name: str, field: str = "schedule") -> Schedule:
    """The schedule any of its names denotes; ``ScheduleError`` naming ``field`` otherwise."""
    schedule = _BY_KEY.get(_key(name)) if isinstance(name, str) else None
    if schedule is None:
        raise ScheduleError(field, f"unknown schedule {name!r}; known: {', '.join(NAMES)} (or torch's class names)")
    return schedule


def stages_floor(
    schedule: str | None, num_stages: int | None, num_microbatches: int | None, virtual_stages: int = 1
) -> BubbleFloor | None:
    """The closed form for a pipeline described as runs describe it, by its stage count (virtual stages
    included, ``num_stages``): the forms count ranks. None when the shape is not given."""
    if not num_stages or not num_microbatches:
        return None
    v = max(1, virtual_stages)
    return closed_form_bubble(schedule, max(1, num_stages // v), num_microbatches, v)


def closed_form_bubble(schedule: str | None, p: int, m: int, v: int = 1) -> BubbleFloor | None:
    """The schedule's closed-form bubble; None for an unknown schedule or a shape the form does not cover."""
    try:
        return None if schedule is None else lookup(schedule).bubble(p, m, v)
    except ScheduleError:
        return None
