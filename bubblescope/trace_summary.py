"""``bubblescope trace-summary TRACE...``: per rank, Holistic Trace Analysis' figures computed by our code, and our
own split beside them (``analysis/trace_figures.py``; docs/traces.md says where and why they differ)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from bubblescope.analysis import HtaFigures, OwnSplit, figures, p2p_waits
from bubblescope.kineto import P2pKernel, TraceError, rank_activities, rank_of


@dataclass(frozen=True)
class RankSummary:
    rank: int
    file: str
    events: int
    profiler_steps: list[str]
    hta: HtaFigures
    ours: OwnSplit
    p2p_wait_us: float | None = None  # recv kernels' time before the peer's send began (None: no peer's trace)

    def as_json(self) -> dict[str, Any]:
        hta, ours = self.hta, self.ours
        span = hta.kernel_span_us
        share = hta.share
        return {
            "rank": self.rank,
            "file": self.file,
            "events": self.events,
            "profiler_steps": self.profiler_steps,
            "kernel_span_us": span,
            "hta": {
                **asdict(hta),
                "idle_pct": 100 * share(hta.idle_us),
                "compute_pct": 100 * share(hta.compute_us),
                "non_compute_pct": 100 * share(hta.non_compute_us),
                "comm_overlap_pct": None if hta.comm_overlap is None else 100 * hta.comm_overlap,
            },
            "ours": {
                **asdict(ours),
                **{f"{k.removesuffix('_us')}_pct": 100 * v / span if span else 0.0 for k, v in asdict(ours).items()},
                "p2p_wait_us": self.p2p_wait_us,
                "p2p_wait_pct": None if self.p2p_wait_us is None or not span else 100 * self.p2p_wait_us / span,
            },
        }


def summarize(paths: list[Path]) -> list[RankSummary]:
    """Each file's rank and figures, in rank order; a ``TraceError`` for a file that cannot be summarised. A file's
    activities wait on disk and are read in order (``kineto.rank_activities``): memory holds a few numbers a rank."""
    by_rank: dict[int, RankSummary] = {}
    p2p: dict[int, list[P2pKernel]] = {}
    for path in paths:
        with rank_activities(path) as trace:
            rank = rank_of(path, trace.rank)
            if rank in by_rank:
                raise TraceError(f"{path} and {by_rank[rank].file} both hold rank {rank}: give one file per rank")
            hta, ours = figures(trace.by_start(), trace.by_stream())
            if hta.kernel_span_us == 0 and not _any(trace.by_start()):
                raise TraceError(
                    f"{path}: no GPU kernels (a CPU-only profile, or torch.profiler without ProfilerActivity.CUDA): "
                    "nothing to break down"
                )
            by_rank[rank] = RankSummary(rank, str(path), trace.events, trace.profiler_steps, hta, ours)
            p2p[rank] = trace.p2p()
    waits = p2p_waits(p2p)
    return [replace(by_rank[rank], p2p_wait_us=waits.get(rank)) for rank in sorted(by_rank)]


def _any(activities: Iterator[Any]) -> bool:
    return next(activities, None) is not None


def _percent_of(figures: HtaFigures) -> Any:
    return lambda us: f"{100 * figures.share(us):.2f}%"


def format_table(summaries: list[RankSummary]) -> str:
    """The figures as text columns: HTA's, then ours."""
    header = (
        f"{'rank':>5} {'span ms':>9} | {'HTA idle':>8} {'compute':>8} {'non-comp':>8} {'host wait':>9} "
        f"{'kern wait':>9} {'other':>8} {'overlap':>8} | {'ours: compute':>13} {'comm':>6} {'exposed':>8} "
        f"{'memory':>7} {'idle':>6} {'recv wait':>9}"
    )
    lines = [header]
    for summary in summaries:
        hta, ours = summary.hta, summary.ours
        pct = _percent_of(hta)
        causes = hta.idle_by_cause_us
        overlap = "-" if hta.comm_overlap is None else f"{100 * hta.comm_overlap:.2f}%"
        lines.append(
            f"{summary.rank:>5} {hta.kernel_span_us / 1e3:>9.1f} | {pct(hta.idle_us):>8} {pct(hta.compute_us):>8} "
            f"{pct(hta.non_compute_us):>8} {causes['host_wait'] / 1e3:>7.1f}ms {causes['kernel_wait'] / 1e3:>7.1f}ms "
            f"{causes['other'] / 1e3:>6.1f}ms {overlap:>8} | {pct(ours.compute_us):>13} {pct(ours.communication_us):>6} "
            f"{pct(ours.exposed_communication_us):>8} {pct(ours.memory_us):>7} {pct(ours.idle_us):>6} "
            f"{'-' if summary.p2p_wait_us is None else pct(summary.p2p_wait_us):>9}"
        )
    lines.append(
        "HTA: shares of the GPU's kernel span (first activity to last) as Holistic Trace Analysis 0.5.0 computes them; "
        "idle by cause summed over streams (kernel wait: gaps under 30 us). Ours: compute, communication (NCCL/RCCL "
        "by name or recorded collective), communication no compute overlapped, copies alone, idle; recv wait: recv "
        "kernels' time before the peer's matching send began (a wait for the previous stage: bubble to us, "
        "communication to HTA; '-' without the peer's trace). See docs/traces.md."
    )
    return "\n".join(lines)
