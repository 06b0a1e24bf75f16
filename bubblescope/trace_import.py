"""torch.profiler (Kineto) traces as a run: each rank's GPU timeline as the collector's wire batches.

One file per rank (``kineto.rank_of``). Steps are the profiler's ``ProfilerStep#N``: a GPU activity belongs to the
step whose annotation holds the runtime call that launched it (matched by ``correlation``), and a rank's step
window runs from its first activity's start to the next step's first start (the last step's: to its last end).

Each activity is classified (``classify``):

- communication, the kind from the kernel's ``Collective name`` argument, else from the CPU op or annotation that
  launched it (``record_param_comms`` with a ``Collective name``, ``nccl:all_to_all``, ``c10d::send``), else from
  the kernel's name under each NCCL generation (``ncclKernel_AllReduce_*``, ``ncclDevKernel_ReduceScatter_*``,
  ``ncclDevKernel_SendRecv``, ``ncclDevKernel_Generic``) and ROCm's RCCL; its process group from the kernel's or
  the launching op's ``Process Group Name``/``Ranks`` (``world`` when the group holds every rank); a send's or
  recv's peer where the trace names it, and a name that pairs it with its peer's (``numbered_p2p``);
- compute: optimizer when launched inside ``Optimizer.step``, backward when launched from a thread other than
  the one that runs the profiler steps (autograd's engine), forward otherwise; memory copies and sets count as
  compute of their phase, named ``memory:`` (the wire has no memory kind; the GPU is busy with them);
- data loading: the host's wait for the next batch (torch's ``enumerate(DataLoader)#...__next__`` op on a thread
  that runs the profiler steps), as the collector's ``timed_batches`` records it.

Times are epoch ns: ``ts`` (µs, integer or fractional) plus the trace's ``baseTimeNanoseconds`` where it has one.
Nothing is sent before every file has been read and converted (``TraceError`` otherwise), so a bad file stores
nothing.
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
import zlib
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from bubblescope import wire
from bubblescope.kineto import TraceError, rank_of, read_trace
from bubblescope.timesplit import split_window
from bubblescope.trace_spill import COMM_OP, DATA_LOADING, OPTIMIZER, PIPELINE_ACTION, TraceStore

STEP_NAME: Final = re.compile(r"ProfilerStep#(\d+)$")
COMM_KERNEL: Final = re.compile(r"^(?:void\s+)?(?:[\w:]*::)?[nr]ccl", re.IGNORECASE)
OPTIMIZER_STEP: Final = re.compile(r"^Optimizer\.step")
DATA_LOADER_NEXT: Final = re.compile(r"^enumerate\(DataLoader\)#")  # torch's op around a DataLoader iterator's next()
# torch.distributed.pipelining's annotations of a compute action: ``PP:{stage}{F|B|I|W}{micro-batch}`` (the schedules
# run by ``_PipelineScheduleRuntime``: interleaved 1F1B, zero-bubble, ZB-V, DualPipeV, looped BFS), ``Forward i`` and
# ``Backward i`` (GPipe: the stage is the rank's own). Schedule1F1B annotates nothing.
PIPELINE_ACTION_NAME: Final = re.compile(r"^PP:(\d{1,6})([FBIW])(\d{1,9})$|^(Forward|Backward) (\d{1,9})$")
ACTION_KINDS: Final = {
    "F": "forward",
    "B": "backward",
    "I": "backward_input",
    "W": "backward_weight",
    "Forward": "forward",
    "Backward": "backward",
}
SPANS_PER_BATCH: Final = 20_000  # as the collector sends at most
NAME_CHARS: Final = 64  # the wire's span name limit
GROUP_CHARS: Final = 32
COMM_OPS: Final = ("nccl:", "c10d::", "rccl:", "gloo:")  # CPU ops and annotations of a collective or P2P call
BACKWARD_OP: Final = "autograd::engine::evaluate_function"  # autograd's engine running one backward node
CPU_GAP_NS: Final = 200_000
"""On a CPU-only trace, two top-level operators of one pass (forward, backward, optimizer) on one thread less than
this apart, with no communication call between them, are one compute span: the gap is the interpreter running
the model between its operators (a collector's span of the pass counts it; a GPU trace shows it as launch gaps)."""
GPU_CATEGORIES: Final = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
# Words in a collective's name (lower case, without underscores), most specific first.
COLLECTIVE_WORDS: Final = (
    ("reducescatter", "reduce_scatter"),
    ("allgather", "all_gather"),
    ("alltoall", "all_to_all"),
    ("allreduce", "all_reduce"),
    ("broadcast", "broadcast"),
    ("sendrecv", "recv"),  # a P2P kernel with no direction known: its time is mostly the wait for the peer
    ("send", "send"),
    ("recv", "recv"),
    ("barrier", "all_reduce"),
    ("reduce", "all_reduce"),
    ("gather", "all_gather"),
    ("scatter", "reduce_scatter"),
)


def collective_kind(name: str) -> str | None:
    """The wire kind a collective's name says (``allreduce``, ``nccl:_all_gather_base``, ``c10d::send``,
    ``ncclDevKernel_ReduceScatter_Sum_f32_RING_LL``); None when it names none (``ncclDevKernel_Generic``)."""
    flat = name.lower().replace("_", "").replace("nccl:", "").replace("c10d::", "")
    flat = re.sub(r"^(void)?(ncclkernel|nccldevkernel|rcclkernel|ncclkernelfunc)?", "", flat)
    for word, kind in COLLECTIVE_WORDS:
        if word in flat:
            return kind
    return None


@dataclass(frozen=True)
class CommInfo:
    """What a communication annotation or kernel says of its collective."""

    collective: str | None
    group_name: str | None
    group_ranks: str | None
    peer: int | None = None
    """A send's destination or a recv's source: a global rank (NCCL's ``Dst Rank``/``Src Rank``), or, from a
    ``c10d::send``/``c10d::recv_`` recorded with ``record_shapes``, the rank in its group (``group_peer``)."""
    group_peer: bool = False


@dataclass
class _Window:
    """CPU intervals of one sort (profiler steps, optimizer steps, communication ops), searchable by time."""

    starts: list[int] = field(default_factory=list)
    items: list[tuple[int, int, int, Any]] = field(default_factory=list)  # (start, end, tid, payload)
    closed: bool = True  # an interval holds its end (a CPU op's moment at its parent's end is still inside); False:
    # it does not (a pipeline action or a batch's loading: the next operator may start the microsecond it ends)

    def add(self, start: int, end: int, tid: int, payload: Any) -> None:
        self.items.append((start, end, tid, payload))

    def freeze(self) -> None:
        self.items.sort(key=lambda item: item[0])
        self.starts = [item[0] for item in self.items]

    def holding(self, moment: int, tid: int | None = None) -> Any:
        """The payload of the latest-starting interval that holds ``moment`` (on ``tid``, if given)."""
        index = bisect.bisect_right(self.starts, moment) - 1
        for start, end, item_tid, payload in reversed(self.items[max(0, index - 63) : index + 1]):
            if (
                start <= moment
                and (moment <= end if self.closed else moment < end)
                and (tid is None or tid == item_tid)
            ):
                return payload
        return None


@dataclass
class _RankEvents:
    """What the import reads of one file: its profiler steps and threads in memory (a few per step), every other
    event it needs as rows of a ``TraceStore`` on disk."""

    store: TraceStore = field(default_factory=TraceStore)
    steps: _Window = field(default_factory=_Window)
    step_tids: set[int] = field(default_factory=set)
    pid: int | None = None
    events: int = 0

    def add(self, event: dict[str, Any]) -> None:
        self.events += 1
        ts, duration = event.get("ts"), event.get("dur")
        if not isinstance(ts, (int, float)) or isinstance(ts, bool) or not math.isfinite(ts):
            return
        if not isinstance(duration, (int, float)) or isinstance(duration, bool) or not math.isfinite(duration):
            duration = None
        args = event.get("args")
        args = args if isinstance(args, dict) else {}
        category, name = str(event.get("cat", "")), str(event.get("name", ""))
        start = round(ts * 1000)
        end = start + round(duration * 1000) if isinstance(duration, (int, float)) else start
        if not (-INT64 <= start < INT64 and -INT64 <= end < INT64):
            raise TraceError(f"an event at ts {ts} µs (dur {duration}): times past what a run can store")
        correlation = _integer(args.get("correlation"))
        if category in GPU_CATEGORIES and correlation is not None:
            self.store.add("gpu", (start, end, name, category, correlation, *_row_of(_comm_info(args))))
            return
        tid = _integer(event.get("tid"))
        tid = 0 if tid is None else tid
        if correlation is not None and category in ("cuda_runtime", "cuda_driver", "runtime"):
            self.store.add("launches", (correlation, start, tid))
            return
        if category not in ("cpu_op", "user_annotation"):
            return
        if self.pid is None and category == "cpu_op":
            self.pid = _integer(event.get("pid"))
        step = STEP_NAME.match(name)
        if step:
            self.steps.add(start, end, tid, int(step.group(1)))
            self.step_tids.add(tid)
        elif OPTIMIZER_STEP.match(name):
            self.store.add_interval(OPTIMIZER, start, end, tid, _row_of(None))
        elif DATA_LOADER_NEXT.match(name):
            self.store.add_interval(DATA_LOADING, start, end, tid, _row_of(None))
        elif category == "user_annotation" and (action := PIPELINE_ACTION_NAME.match(name)):
            stage, code, microbatch, single, index = action.groups()
            said = f"{stage or ''}:{ACTION_KINDS[code or single]}:{microbatch or index}"
            self.store.add_interval(PIPELINE_ACTION, start, end, tid, (said, None, None, None, 0))
        elif "Collective name" in args or name.startswith(COMM_OPS):
            info = _comm_info(args) or _c10d_p2p(name, args) or CommInfo(None, None, None)
            self.store.add_interval(
                COMM_OP, start, end, tid, _row_of(replace(info, collective=info.collective or name))
            )
        elif category == "cpu_op":
            self.store.add("cpu_ops", (start, end, tid, name.startswith(BACKWARD_OP)))


def _row_of(info: CommInfo | None) -> tuple[Any, ...]:
    if info is None:
        return (None, None, None, None, 0)
    return (info.collective, info.group_name, info.group_ranks, info.peer, int(info.group_peer))


def _info_of(row: Sequence[Any]) -> CommInfo | None:
    collective, group_name, group_ranks, peer, group_peer = row
    if collective is None and group_name is None and peer is None:
        return None
    return CommInfo(collective, group_name, group_ranks, peer, bool(group_peer))


@dataclass
class _StepContext:
    """A step's CPU intervals (from the store) and the threads that run the profiler's steps."""

    comm_ops: _Window
    optimizer: _Window
    data_loading: _Window
    actions: _Window  # pipeline actions: (stage or None, kind, micro-batch)
    step_tids: set[int]

    def loading_spans(self, lo: int, before: int, base: int) -> list[Span]:
        """The waits for the next batch (a DataLoader's ``next()``) that start in ``lo``..``before`` on a thread
        that runs the profiler's steps: ``data_loading`` spans, as the collector's ``timed_batches`` records."""
        return [
            ("data_loading", base + start, base + max(start, end), None, None, None, None, None)
            for start, end, tid, _payload in self.data_loading.items
            if lo <= start < before and tid in self.step_tids
        ]


def _context(events: _RankEvents, lo: int, hi: int) -> _StepContext:
    windows = []
    for sort in (COMM_OP, OPTIMIZER, DATA_LOADING, PIPELINE_ACTION):
        window = _Window(closed=sort in (COMM_OP, OPTIMIZER))
        for start, end, tid, *row in events.store.intervals(sort, lo, hi):
            payload = _info_of(row) if sort == COMM_OP else _action_of(row[0]) if sort == PIPELINE_ACTION else True
            window.add(start, end, tid, payload)
        window.freeze()
        windows.append(window)
    return _StepContext(windows[0], windows[1], windows[2], windows[3], events.step_tids)


Action = tuple[int | None, str, int]
"""A pipeline action: its stage (None: the rank's own, GPipe's), span kind and micro-batch."""


def _action_of(said: str) -> Action:
    stage, kind, microbatch = said.split(":")
    return (int(stage) if stage else None, kind, int(microbatch))


def _in_action(kind: str, action: Action | None, rank_stage: int | None) -> tuple[str, int | None, int | None]:
    """A compute span's kind, stage and micro-batch: the pipeline action's where one holds it (the optimizer and
    communication are no stage's work), else its own kind and none. An action that names no stage (GPipe's) is
    the rank's stage, ``rank_stage``: the rank itself in a pure pipeline, unknown (None) otherwise."""
    if action is None or kind not in ("forward", "backward"):
        return kind, None, None
    stage, action_kind, microbatch = action
    stage = rank_stage if stage is None else stage
    return action_kind, stage, None if stage is None else microbatch


@dataclass(frozen=True)
class _StepPlan:
    """A profiler step: the time segments whose moments are its (``lo`` <= t < ``before``), its annotations'
    extent (the CPU timeline's window)."""

    number: int
    segments: list[tuple[int, int]]
    window: tuple[int, int]


def _step_plans(steps: _Window) -> list[_StepPlan]:
    """Each ``ProfilerStep#N``'s segments, by number: a moment belongs to the latest-starting annotation that holds
    it (a step annotated inside another, or twice on two threads, keeps what is its own), and one number annotated
    more than once is one step."""
    items = steps.items  # by start
    bounds = sorted({start for start, _e, _t, _n in items} | {end + 1 for _s, end, _t, _n in items})
    segments: dict[int, list[list[int]]] = defaultdict(list)
    active: list[int] = []  # indexes of the annotations holding the segment, by start
    following = 0
    for lo, before in itertools.pairwise(bounds):
        while following < len(items) and items[following][0] <= lo:
            active.append(following)
            following += 1
        active = [index for index in active if items[index][1] + 1 > lo]
        if not active:
            continue
        number = items[active[-1]][3]
        held = segments[number]
        if held and held[-1][1] == lo:
            held[-1][1] = before
        else:
            held.append([lo, before])
    extent: dict[int, tuple[int, int]] = {}
    for start, end, _tid, number in items:
        first, last = extent.get(number, (start, end))
        extent[number] = (min(first, start), max(last, end))
    return [
        _StepPlan(number, [(lo, before) for lo, before in segments[number]], extent[number])
        for number in sorted(segments)
    ]


INT64: Final = 1 << 63  # what a stored integer holds


def _integer(value: Any) -> int | None:
    """An id or a rank as an integer; None where it is none, or past what can be stored (such an id pairs nothing)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if -INT64 <= number < INT64 else None


def _comm_info(args: dict[str, Any]) -> CommInfo | None:
    collective, group, ranks = (
        args.get("Collective name"),
        args.get("Process Group Name"),
        args.get("Process Group Ranks"),
    )
    if collective is None and group is None:
        return None
    return CommInfo(
        None if collective is None else str(collective),
        None if group is None else str(group),
        None if ranks is None else str(ranks),
        _integer(args.get("Src Rank" if "recv" in str(collective) else "Dst Rank")),  # torch: groupRanks[peer]
    )


C10D_P2P: Final = ("c10d::send", "c10d::recv_")  # (tensors, process group, peer, tag)


def _c10d_p2p(name: str, args: dict[str, Any]) -> CommInfo | None:
    """A ``c10d::send``/``c10d::recv_`` op's peer, from its ``Concrete Inputs`` (``record_shapes=True``): the
    rank in the call's group, which the trace does not name."""
    concrete = args.get("Concrete Inputs")
    if name not in C10D_P2P or not isinstance(concrete, list) or len(concrete) < 3:
        return None
    peer = _integer(concrete[2])
    return CommInfo(name, None, None, peer, group_peer=True) if peer is not None and peer >= 0 else None


@dataclass(frozen=True)
class ImportedRank:
    """One rank's trace as wire batches (one per step) and what the run page says of where it came from."""

    rank: int
    file: str
    pid: int
    world_size: int | None
    profiler: str
    steps: list[int]
    batches: Iterable[dict[str, Any]]  # read more than once: a list, or a converted file's batches on disk
    pg_config: list[dict[str, Any]]
    digest: str = ""
    last_end_ns: int = 0  # 0: read from the batches
    stages: tuple[int, ...] = ()  # the pipeline stages its actions ran (annotated by torch's schedules), if any
    microbatches: int = 0  # and their micro-batches


def _group_label(info: CommInfo | None, world_size: int | None, groups: dict[str, list[int]]) -> str | None:
    if info is None or info.group_name is None:
        return None
    ranks = groups.get(info.group_name)
    if ranks is None and info.group_ranks:
        ranks = [int(r) for r in re.findall(r"\d+", info.group_ranks)]
    if ranks is not None and world_size is not None and len(ranks) >= world_size:
        return wire.WORLD_GROUP
    return f"pg{info.group_name}"[:GROUP_CHARS]


def classify(
    name: str,
    category: str,
    info: CommInfo | None,
    launch: tuple[int, int],
    events: _StepContext,
) -> tuple[str, CommInfo | None]:
    """(wire kind, what it says of its collective) of one GPU activity launched at ``launch`` (ns, tid)."""
    moment, tid = launch
    if category == "kernel" and ((info is not None and info.collective) or COMM_KERNEL.match(name)):
        op: CommInfo | None = events.comm_ops.holding(moment, tid)
        said = [s for s in (info.collective if info else None, op.collective if op else None, name) if s]
        kind = next((k for k in map(collective_kind, said) if k), "all_reduce")
        sources = [source for source in (info, op) if source is not None]
        group = next((source.group_name for source in sources if source.group_name), None)
        ranks = next((source.group_ranks for source in sources if source.group_ranks), None)
        peer = next((source for source in sources if source.peer is not None), None)
        if peer is None:
            return kind, CommInfo(said[0], group, ranks)
        return kind, CommInfo(said[0], group, ranks, peer.peer, peer.group_peer)
    if events.optimizer.holding(moment, tid):
        return "optimizer", None
    main = tid in events.step_tids or not events.step_tids
    return ("forward" if main else "backward"), None


_PROFILER_FIELDS = (  # (where, key, label): what a trace says of the profiler and the stack that wrote it
    ("trace", "schemaVersion", "schemaVersion"),
    ("trace", "cupti_version", "CUPTI"),
    ("trace", "cuda_runtime_version", "CUDA runtime"),
    ("trace", "roctracer_version", "roctracer"),
    ("info", "nccl_version", "NCCL"),
    ("trace", "trace_id", "trace_id"),
)


def profiler_said(metadata: dict[str, Any], info: dict[str, Any]) -> str:
    """The profiler and its stack as the trace names them (schema, CUPTI, CUDA, NCCL versions, the first GPU),
    for the run page's source line; 'torch.profiler' when the trace names none."""
    sources = {"trace": metadata, "info": info}
    said = [
        f"{label} {sources[where][key]}"
        for where, key, label in _PROFILER_FIELDS
        if isinstance(sources[where].get(key), (str, int)) and not isinstance(sources[where].get(key), bool)
    ]
    devices = metadata.get("deviceProperties")
    first = devices[0] if isinstance(devices, list) and devices and isinstance(devices[0], dict) else {}
    if isinstance(first.get("name"), str):
        said.insert(1, first["name"][:64])
    return ", ".join(str(part)[:80] for part in said) or "torch.profiler"


def _epoch_base(metadata: dict[str, Any]) -> int:
    base = metadata.get("baseTimeNanoseconds")
    return base if isinstance(base, int) and not isinstance(base, bool) and base > 0 else 0


def convert(path: Path, run_key: str, seq_base: int = 0, single_stage: bool = False) -> ImportedRank:
    """One rank's file as wire batches; a ``TraceError`` naming the file when it cannot be imported. The events
    wait on disk (``TraceStore``) and are converted a step at a time, so memory holds a step, not the file.
    ``single_stage``: the job ran a schedule of one stage a rank (GPipe, 1F1B), so a step without annotated actions
    is cut into its micro-batches (``single_stage_chunks``)."""
    events = _RankEvents()
    try:
        return _converted(path, run_key, seq_base, events, single_stage)
    except TraceError as error:
        events.store.discard()
        raise TraceError(str(error) if str(error).startswith(str(path)) else f"{path}: {error}") from None
    except BaseException:
        events.store.discard()
        raise


def _converted(path: Path, run_key: str, seq_base: int, events: _RankEvents, single_stage: bool) -> ImportedRank:
    metadata = read_trace(path, events.add)
    events.store.finish()
    digest = file_digest(path)
    seq_base = seq_base or int(digest, 16) << SEQ_SHIFT
    info = metadata.get("distributedInfo")
    info = info if isinstance(info, dict) else {}
    rank = rank_of(path, info.get("rank"))
    world = info.get("world_size") if isinstance(info.get("world_size"), int) else None
    listed = info.get("pg_config")
    pg_config = [g for g in listed if isinstance(g, dict)] if isinstance(listed, list) else []
    groups = {
        str(g.get("pg_name")): [r for r in g["ranks"] if isinstance(r, int)]
        for g in pg_config
        if isinstance(g.get("ranks"), list)
    }
    on_gpu = events.store.counts["gpu"] > 0
    if not on_gpu and not events.store.counts["cpu_ops"]:
        raise TraceError(f"{path}: no GPU kernels and no CPU operators: nothing to import")
    if not events.steps.items:
        raise TraceError(
            f"{path}: no ProfilerStep#N annotations: profile with torch.profiler.profile(schedule=...) and call "
            "prof.step() once per training step, so that the steps can be told apart"
        )
    events.steps.freeze()
    base = _epoch_base(metadata)
    # a CPU-only profile (gloo): the CPU's operators are the timeline, each step its annotation's window
    # The rank's own stage, for actions that name none (GPipe's) and a 1F1B step cut at its P2P calls: the rank
    # in a pure pipeline (one process group, or no pg_config); in any other layout it cannot be told from here.
    rank_stage = rank if len(groups) <= 1 else None
    if on_gpu:
        steps = _gpu_steps(events, base, world, groups, rank_stage)
    else:
        steps = _cpu_steps(events, base, world, groups, rank_stage)
    converted = _Converted(run_key, rank, rank_stage if single_stage else None, seq_base)
    batches = events.store.batches(converted.batches(steps))
    if not converted.numbers:
        raise TraceError(f"{path}: nothing was launched or run inside a ProfilerStep#N: nothing to import")
    return ImportedRank(
        rank=rank,
        file=path.name,
        pid=events.pid or 0,
        world_size=world,
        profiler=profiler_said(metadata, info),
        steps=converted.numbers,
        batches=batches,
        pg_config=pg_config,
        digest=digest,
        last_end_ns=converted.last_end_ns,
        stages=tuple(sorted(converted.stages)),
        microbatches=converted.microbatches,
    )


StepSpans = tuple[int, list["Span"], tuple[int, int] | None]
"""A step's number, spans and window (None: from its spans, ``_gpu_window``)."""


@dataclass
class _Converted:
    """Steps become batches one at a time, each once the next step's first start is known (``_gpu_window``)."""

    run_key: str
    rank: int
    single_stage: int | None  # the rank's stage where a step without annotated actions is to be cut (1F1B)
    seq: int
    numbers: list[int] = field(default_factory=list)
    last_end_ns: int = 0
    stages: set[int] = field(default_factory=set)
    microbatches: int = 0
    previous_end: int | None = None  # the last step's window's end

    def batches(self, steps: Iterator[StepSpans]) -> Iterator[dict[str, Any]]:
        held: StepSpans | None = None
        for step in steps:  # one each number (``_step_plans``), in order
            if held is not None:
                yield from self._sent(held, step)
            held = step
        if held is not None:
            yield from self._sent(held, None)

    def _sent(self, step: StepSpans, following: StepSpans | None) -> Iterator[dict[str, Any]]:
        number, spans, window = step
        if window is None:
            adjacent = following if following and following[0] == number + 1 else None
            window = _gpu_window(spans, adjacent, self.previous_end)
        self.previous_end = window[1]
        self.numbers.append(number)
        self.last_end_ns = max(self.last_end_ns, window[1])
        if self.single_stage is not None and all(span[5] is None for span in spans):
            spans = single_stage_chunks(spans, self.single_stage)
        spans = merged_actions(spans)
        for span in spans:
            if span[5] is not None and span[6] is not None:
                self.stages.add(span[5])
                self.microbatches = max(self.microbatches, span[6] + 1)
        for batch in batches_of(self.run_key, self.rank, self.seq, number, numbered_p2p(spans), window):
            self.seq += 1
            yield batch


SEQ_SHIFT: Final = 20  # a file's batches are numbered from its digest: another file's never repeat them


def file_digest(path: Path) -> str:
    """The file's CRC-32, as hex: what tells two files of one rank apart (a re-import of the same file stores
    nothing twice; another file for a rank already imported is refused)."""
    crc = 0
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            crc = zlib.crc32(chunk, crc)
    return f"{crc:08x}"


Span = tuple[str, int, int, str | None, str | None, int | None, int | None, int | None]
"""kind, start, end (epoch ns), group, name, stage, micro-batch, peer (the last three known only in an export of
ours, ``export_import``)."""


def _gpu_steps(
    events: _RankEvents, base: int, world: int | None, groups: dict[str, list[int]], rank_stage: int | None
) -> Iterator[StepSpans]:
    """Each step's GPU activities (by the step that launched them), classified, read from the store a step at a
    time."""
    for plan in _step_plans(events.steps):
        spans: list[Span] = []
        for lo, before in plan.segments:
            context = _context(events, lo, before)
            for start, end, name, category, *row, launched, tid in events.store.gpu_launched(lo, before):
                kind, said = classify(name, category, _info_of(row), (launched, tid), context)
                if kind in wire.COMMUNICATION_KINDS:
                    label = said.collective if said else name
                    group = _group_label(said, world, groups)
                else:
                    label = f"memory: {name}" if category != "kernel" else None
                    group = None
                kind, stage, microbatch = _in_action(kind, context.actions.holding(launched), rank_stage)
                peer = _global_peer(said, groups) if kind in P2P_KINDS else None
                label = label and label[:NAME_CHARS]
                spans.append((kind, base + start, base + max(start, end), group, label, stage, microbatch, peer))
            spans += context.loading_spans(lo, before, base)
        if spans:
            yield plan.number, spans, None


P2P_KINDS: Final = frozenset({"send", "recv"})


def _global_peer(info: CommInfo | None, groups: dict[str, list[int]]) -> int | None:
    """A P2P call's peer as a global rank; None where the trace cannot say (a ``c10d`` op's rank in its group, in
    a job whose ``pg_config`` lists other than one group: the op does not name its group)."""
    if info is None or info.peer is None:
        return None
    return info.peer if not info.group_peer or len(groups) == 1 else None


def _p2p_calls(items: list[tuple[int, int, int, CommInfo]]) -> list[tuple[int, int, int, CommInfo]]:
    """The CPU's communication calls (sorted by start), each P2P call once: gloo records a send or a recv twice,
    as the ``c10d::send``/``c10d::recv_`` op that posts it (which names the peer) and as the ``gloo:send``/
    ``gloo:recv`` annotation of its work, which starts inside the op and lasts until the data left or arrived."""
    calls: list[tuple[int, int, int, CommInfo]] = []
    posting: dict[tuple[int, str | None], int] = {}  # (thread, kind) -> the last op with a peer, by index
    for start, end, tid, info in items:
        kind = collective_kind(info.collective or "")
        if kind in P2P_KINDS and info.peer is None and (tid, kind) in posting:
            index = posting.pop((tid, kind))
            op_start, op_end, _tid, op_info = calls[index]
            if start <= op_end:
                calls[index] = (op_start, max(op_end, end), tid, op_info)
                continue
        if kind in P2P_KINDS and info.peer is not None:
            posting[(tid, kind)] = len(calls)
        calls.append((start, end, tid, info))
    return calls


def numbered_p2p(spans: list[Span]) -> list[Span]:
    """P2P spans with a peer named by their order between the two ranks in the step (``p2p #3``, the same on both
    sides): NCCL and gloo deliver one pair's messages in the order they were posted, so the nth send from q to r
    is the nth recv from q on r, and the analysis matches a recv with its send by ranks and name
    (``analysis.breakdown``); the time a recv spent before its send started is then a wait, not a transfer."""
    counts: dict[tuple[str, int, str | None], int] = defaultdict(int)
    numbered: list[Span] = []
    for span in sorted(spans, key=lambda s: s[1]):
        kind, start, end, group, name, stage, microbatch, peer = span
        if kind in P2P_KINDS and peer is not None:
            counts[(kind, peer, group)] += 1
            name = f"p2p {group or ''} #{counts[(kind, peer, group)]}".replace("  ", " ")[:NAME_CHARS]
        numbered.append((kind, start, end, group, name, stage, microbatch, peer))
    return numbered


def _cpu_steps(
    events: _RankEvents, base: int, world: int | None, groups: dict[str, list[int]], rank_stage: int | None
) -> Iterator[StepSpans]:
    """Each step's CPU timeline: its top-level operators per thread as compute (backward when autograd's engine
    runs them, optimizer inside ``Optimizer.step``), its collective and P2P calls (``gloo:recv``, which lasts until
    the data arrived, ``c10d::send``) as communication: each from when it was posted, as the profiler recorded it.
    The step's window is its annotation's."""
    for plan in _step_plans(events.steps):
        spans: list[Span] = []
        for lo, before in plan.segments:
            spans += _cpu_segment(events, lo, before, base, world, groups, rank_stage)
        if spans:
            yield plan.number, spans, (base + plan.window[0], base + plan.window[1])


def _cpu_segment(
    events: _RankEvents,
    lo: int,
    before: int,
    base: int,
    world: int | None,
    groups: dict[str, list[int]],
    rank_stage: int | None,
) -> list[Span]:
    context = _context(events, lo, before)
    comm_starts = [start for start, _end, _tid, _said in context.comm_ops.items]
    spans: list[Span] = []
    open_span: dict[int, list[Any]] = {}  # per thread: [kind, start, end, stage, micro-batch] of the span extended
    for start, end, tid, backward in events.store.cpu_ops(lo, before):  # parents first
        current = open_span.get(tid)
        if current is not None and start < current[2]:
            continue  # inside an operator already counted
        if context.data_loading.holding(start, tid) is not None:
            continue  # the batch's collation (aten::stack): data loading, not the model
        kind = "optimizer" if context.optimizer.holding(start, tid) else "backward" if backward else "forward"
        kind, stage, microbatch = _in_action(kind, context.actions.holding(start), rank_stage)
        if (
            current is not None
            and (current[0], current[3], current[4]) == (kind, stage, microbatch)
            and start - current[2] <= CPU_GAP_NS
            and not _any_between(comm_starts, current[2], start)
        ):
            current[2] = max(current[2], end)  # the interpreter between two operators of one pass: still the pass
            continue
        if current is not None:
            spans.append((current[0], base + current[1], base + current[2], None, None, current[3], current[4], None))
        open_span[tid] = [kind, start, max(start, end), stage, microbatch]
    for current in open_span.values():
        spans.append((current[0], base + current[1], base + current[2], None, None, current[3], current[4], None))
    spans += context.loading_spans(lo, before, base)
    for start, end, _tid, said in _p2p_calls(context.comm_ops.items):
        if not lo <= start < before:
            continue  # another step's
        kind = collective_kind(said.collective or "") or "all_reduce"
        label = (said.collective or "")[:NAME_CHARS] or None
        group = _group_label(said, world, groups)
        peer = _global_peer(said, groups) if kind in P2P_KINDS else None
        spans.append((kind, base + start, base + max(start, end), group, label, None, None, peer))
    return spans


def single_stage_chunks(spans: list[Span], stage: int) -> list[Span]:
    """A step of a schedule with one stage a rank whose actions torch did not annotate (``Schedule1F1B``), cut into
    its micro-batches. Each rank runs its micro-batches' forwards in order, and their backwards in order, each
    between two of its P2P calls (the activation's recv and send), so a run of forward (or backward) spans with no
    P2P call starting between them is one micro-batch's, numbered by its order. Not a micro-batch's: forward work
    before the step's first P2P call where that call is a recv (splitting the batch), after the last backward
    (``PipelineStage.scale_grads``), or shorter than a tenth of the median backward run (the send's preparation).
    The stage is the rank's (a pure pipeline). Unchanged where the counts of forwards and backwards then differ:
    the cut would be a guess."""
    order = sorted((i for i, span in enumerate(spans) if span[0] in ("forward", "backward")), key=lambda i: spans[i][1])
    p2p = sorted((span[1], span[0]) for span in spans if span[0] in P2P_KINDS)
    p2p_starts = [start for start, _kind in p2p]
    runs: list[list[int]] = []  # indexes of one run's spans
    run_end = 0  # the latest end of the run's spans so far
    for index in order:
        kind, start, end = spans[index][:3]
        if not runs or spans[runs[-1][0]][0] != kind or _any_between(p2p_starts, run_end, start):
            runs.append([])
            run_end = end
        runs[-1].append(index)
        run_end = max(run_end, end)
    length = {id(run): sum(spans[i][2] - spans[i][1] for i in run) for run in runs}
    backward = [run for run in runs if spans[run[0]][0] == "backward"]
    if not backward:
        return spans
    last_backward = max(spans[i][2] for run in backward for i in run)
    shortest = sorted(length[id(run)] for run in backward)[len(backward) // 2] / 10
    splitting = p2p[0][0] if p2p and p2p[0][1] == "recv" else None  # the step's first call, a recv

    def microbatch_work(run: list[int]) -> bool:
        first = spans[run[0]]
        if first[0] == "backward":
            return True
        before_first_recv = splitting is not None and first[2] <= splitting
        return not before_first_recv and first[1] < last_backward and length[id(run)] >= shortest

    counted = [run for run in runs if microbatch_work(run)]
    forward = [run for run in counted if spans[run[0]][0] == "forward"]
    if len(forward) != len(backward):
        return spans
    chunked = list(spans)
    for runs_of_kind in (forward, backward):
        for microbatch, run in enumerate(runs_of_kind):
            for i in run:
                chunked[i] = (*spans[i][:5], stage, microbatch, spans[i][7])
    return chunked


def _any_between(sorted_starts: list[int], lo: int, hi: int) -> bool:
    index = bisect.bisect_left(sorted_starts, lo)
    return index < len(sorted_starts) and sorted_starts[index] < hi


def _gpu_window(spans: list[Span], following: StepSpans | None, previous_end: int | None) -> tuple[int, int]:
    """A step's window on the GPU: its first activity's start (or its wait for data, where the GPU had nothing of
    the last step to run by then) to the next step's first start, or to its own last end where that is later (a
    collective that runs on past the next step's first kernel counts whole). Windows never overlap: a host that
    loads the next batch while the GPU still runs this step's kernels starts the next window at this one's end."""
    lo, hi = min(span[1] for span in spans), max(span[2] for span in spans)
    on_gpu = [span[1] for span in spans if span[0] not in HOST_KINDS]
    if previous_end is not None and on_gpu:
        lo = min(max(lo, previous_end), min(on_gpu))
    if following is not None:
        hi = max(hi, min(span[1] for span in following[1]))  # the gap to the next step is idle
    return lo, max(lo + 1, hi)


HOST_KINDS: Final = frozenset({"data_loading"})  # spans of the host, not of the GPU's timeline


def merged_actions(spans: list[Span]) -> list[Span]:
    """One span per pipeline action (kind, stage, micro-batch): from its first piece's start to its last's end, as
    the collector times an action, since the analysis costs a stage by its actions' durations (a trace's action is
    many kernels or operators). Spans of no stage are left as they are."""
    extent: dict[tuple[str, int, int], list[int]] = {}
    kept: list[Span] = []
    for span in spans:
        kind, start, end, _group, _name, stage, microbatch, _peer = span
        if stage is None or microbatch is None:
            kept.append(span)
            continue
        held = extent.setdefault((kind, stage, microbatch), [start, end])
        held[0], held[1] = min(held[0], start), max(held[1], end)
    return kept + [(kind, lo, hi, None, None, stage, mb, None) for (kind, stage, mb), (lo, hi) in extent.items()]


def batches_of(
    run_key: str, rank: int, seq: int, step: int, spans: list[Span], window: tuple[int, int]
) -> list[dict[str, Any]]:
    """One step as batches: its aggregate and its spans, ``SPANS_PER_BATCH`` at most a batch (a large model's step
    launches more kernels than the service takes in one), numbered on from ``seq``."""
    spans.sort(key=lambda span: span[1])
    lo, hi = window
    split = split_window([(span[0], span[1], span[2]) for span in spans], lo, hi)
    aggregate = {
        "step": step,
        "start_ns": lo,
        "end_ns": hi,
        "compute_ns": split.compute_ns,
        "comm_ns": split.comm_ns,
        "exposed_comm_ns": split.exposed_comm_ns,
        "idle_ns": split.idle_ns,
        "span_count": len(spans),
    }
    out = []
    for part, first in enumerate(range(0, max(1, len(spans)), SPANS_PER_BATCH)):  # a step without spans: one
        piece = spans[first : first + SPANS_PER_BATCH]
        columns = {
            "step": [step] * len(piece),
            "kind": [s[0] for s in piece],
            "start_ns": [s[1] for s in piece],
            "end_ns": [s[2] for s in piece],
            "group": [s[3] for s in piece],
            "name": [s[4] for s in piece],
            "stage": [s[5] for s in piece],
            "microbatch": [s[6] for s in piece],
            "peer": [s[7] for s in piece],
        }
        steps = [aggregate] if part == 0 else []
        out.append({"run_key": run_key, "rank": rank, "seq": seq + part, "steps": steps, "spans": columns})
    return out


def convert_all(paths: Sequence[Path], run_key: str, single_stage: bool = False) -> list[ImportedRank]:
    """Every file converted (in rank order), or a ``TraceError`` before anything is sent."""
    by_rank: dict[int, ImportedRank] = {}
    from bubblescope.export_import import convert_export  # it builds on this module

    for path in paths:
        for imported in convert_export(path, run_key) or [convert(path, run_key, single_stage=single_stage)]:
            if imported.rank in by_rank:
                raise TraceError(
                    f"{path} and {by_rank[imported.rank].file} both hold rank {imported.rank}: give one file per rank"
                )
            by_rank[imported.rank] = imported
    return [by_rank[rank] for rank in sorted(by_rank)]


def pipeline_config(imported: Sequence[ImportedRank], schedule: str | None) -> dict[str, Any]:
    """The pipeline the files' actions describe, as a collected run's config says it (``num_stages``,
    ``num_microbatches``, ``virtual_stages``), and the schedule the user named (no trace names it); {} without one."""
    stages = {stage for rank in imported for stage in rank.stages}
    if not stages or stages != set(range(max(stages) + 1)):  # none, or not every stage: no pipeline to replay
        return {}
    config: dict[str, Any] = {
        "num_stages": max(stages) + 1,
        "num_microbatches": max(rank.microbatches for rank in imported),
    }
    per_rank = max(len(rank.stages) for rank in imported)
    if per_rank > 1:
        config["virtual_stages"] = per_rank
    if schedule:
        config["schedule"] = schedule
    return config


def run_config(imported: Sequence[ImportedRank], schedule: str | None = None) -> dict[str, Any]:
    """The run's config: where it came from (``wire.IMPORTED_FROM``), as the run page shows it, and, where the user
    named the schedule, the pipeline its actions describe (``pipeline_config``: every rank's file is needed for the
    stage count, so an upload of one rank says none)."""
    worlds = [r.world_size for r in imported if r.world_size]
    return {
        **(pipeline_config(imported, schedule) if schedule else {}),
        wire.IMPORTED_FROM: {
            "format": "torch.profiler (Kineto) trace",
            "files": {str(r.rank): r.file for r in imported},
            "digests": {str(r.rank): r.digest for r in imported},
            "ranks": [r.rank for r in imported],
            "world_size": max(worlds) if worlds else None,
            "profiler": imported[0].profiler,
            "steps": sorted({step for r in imported for step in r.steps}),
        },
    }


def merged_source(earlier: Any, added: dict[str, Any]) -> dict[str, Any]:
    """``added`` (a ``run_config``'s source) joined to the source a run already holds (files of other ranks
    uploaded before), so that ranks can be imported one request at a time."""
    if not isinstance(earlier, dict) or not isinstance(earlier.get("files"), dict):
        return added
    files = {**earlier["files"], **added["files"]}
    digests = {**(earlier.get("digests") or {}), **added.get("digests", {})}
    worlds = [w for w in (earlier.get("world_size"), added["world_size"]) if isinstance(w, int)]
    steps = [s for s in earlier.get("steps", []) if isinstance(s, int)] + added["steps"]
    return {
        **added,
        "files": dict(sorted(files.items(), key=lambda item: _rank_order(item[0]))),
        "digests": digests,
        "ranks": sorted(int(rank) for rank in files if str(rank).isdigit()),
        "world_size": max(worlds) if worlds else None,
        "steps": sorted(set(steps)),
    }


def _rank_order(rank: Any) -> tuple[bool, int, str]:
    text = str(rank)
    return (not text.isdigit(), int(text) if text.isdigit() else 0, text)


KEY_CHARS: Final = re.compile(r"[^A-Za-z0-9._:-]+")


def run_key_for(name: str) -> str:
    """The run key an import of ``name`` gets: the name, with characters a key cannot hold as '-'."""
    key = KEY_CHARS.sub("-", name).strip("-")[:128]
    return key or "imported-trace"


def requests_for(
    imported: Sequence[ImportedRank], run_key: str, name: str, schedule: str | None = None
) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(method, path, document) in the order a collector sends them: the run, each rank, its steps, its end; made
    one at a time (a file's batches are read from disk as they are sent)."""
    prefix = f"{wire.API_PREFIX}/runs/{run_key}"
    config = run_config(imported, schedule)
    world = max(config[wire.IMPORTED_FROM]["world_size"] or 0, max(r.rank for r in imported) + 1)
    yield ("PUT", prefix, {"name": name, "world_size": world, "config": config})
    for rank in imported:
        registration: dict[str, Any] = {"host": f"trace {rank.file}"[:255], "pid": rank.pid}
        if schedule and rank.stages:  # the stages its actions ran, as a pipelined collector registers them
            registration |= {"stage": rank.stages[0], "stages": list(rank.stages)}
        yield ("PUT", f"{prefix}/ranks/{rank.rank}", registration)
        last_end = rank.last_end_ns
        for batch in rank.batches:
            last_end = max([last_end, *(step["end_ns"] for step in batch["steps"])])
            yield ("POST", f"{wire.API_PREFIX}/ingest", batch)
        yield ("PUT", f"{prefix}/ranks/{rank.rank}/end", {"outcome": "finished", "end_ns": last_end, "pid": rank.pid})
