"""Ranked fixes for a job without a pipeline, from its step split (``step_split``), each priced by a replay of
the measured step: the step with the time the fix addresses removed (an upper bound: the fix may hide less
of it). Rules (thresholds are fractions of the measured step):
- data loading ≥ 5% → load batches in the background (worker processes, pinned memory, prefetch);
- exposed transfer in a data-parallel group ≥ 5% → overlap it with the backward pass (smaller DDP buckets,
  FSDP2 per block), up to the model's compute it could hide under;
- waiting for peers in collectives ≥ 5% → the rank the others wait for, by name, with its victims, priced by
  the wait each victim has (the step is theirs plus that wait); else the ranks' uneven work before each
  collective, priced by the mean wait;
- host gaps every rank has ≥ 10% → cut the launch and Python overhead between ops (torch.compile, CUDA
  graphs); one rank's gaps beyond the others' are the late rank's.
A job whose compute is not instrumented gets none: its training reads as host gaps.
"""

from __future__ import annotations

from typing import Final

from bubblescope.analysis.step_split import (
    COLLECTIVE_WAIT,
    DATA_LOADING,
    MODEL_COMPUTE,
    StepSplit,
)
from bubblescope.analysis.suggestions import MIN_GAIN, RunEvidence, Suggestion, build_suggestion

DATA_LOADING_MARGIN: Final = 0.05
TRANSFER_MARGIN: Final = 0.05
WAIT_MARGIN: Final = 0.05
HOST_GAPS_MARGIN: Final = 0.10
DATA_PARALLEL_GROUPS: Final = frozenset(
    {"world", "dp", "ddp", "fsdp", "dp_shard", "dp_replicate", "dp_shard_cp", "dp_cp"}
)
"""Group labels whose collectives are the gradients' and parameters' data-parallel traffic in a job without a
pipeline (a DDP model on the default group reduces over "world")."""


def step_fixes(split: StepSplit, evidence: RunEvidence) -> list[Suggestion]:
    """The fixes the split supports, ranked by predicted gain (those under ``MIN_GAIN`` dropped)."""
    if not split.compute_instrumented:
        return []
    step = evidence.step_ns
    found = [
        *_background_loading(split, evidence),
        *_overlap_transfer(split, evidence),
        *_late_rank(split, evidence),
        *_host_gaps(split, evidence),
    ]
    worthwhile = [s for s in found if step and s.gain_fraction >= MIN_GAIN]
    return sorted(worthwhile, key=lambda s: s.gain_fraction, reverse=True)


def _fraction(split: StepSplit, ns: float) -> float:
    return ns / split.window_ns if split.window_ns else 0.0


def _background_loading(split: StepSplit, evidence: RunEvidence) -> list[Suggestion]:
    data = split.part(DATA_LOADING.name).ns
    if _fraction(split, data) < DATA_LOADING_MARGIN:
        return []
    return [
        build_suggestion(
            evidence,
            "background_data_loading",
            evidence.step_ns - data,
            None,
            "Load batches in the background",
            f"each rank waits {data / 1e6:.1f} ms a step for its next batch ({_fraction(split, data):.0%} of the "
            "step): the data loader runs on the training thread, or its workers cannot keep up",
            "each worker holds prefetch_factor batches in host memory",
            {"dataloader_num_workers": "more"},
            "DataLoader(dataset, num_workers=4, pin_memory=True, persistent_workers=True, prefetch_factor=2)",
            {},
            ["--num-workers <N>"],
        )
    ]


def _overlap_transfer(split: StepSplit, evidence: RunEvidence) -> list[Suggestion]:
    groups = [g for g in split.groups if g.group in DATA_PARALLEL_GROUPS]
    transfer = sum(g.transfer_ns for g in groups)
    if _fraction(split, transfer) < TRANSFER_MARGIN:
        return []
    hidden = min(transfer, split.part(MODEL_COMPUTE.name).ns)
    names = ", ".join(g.group for g in groups)
    return [
        build_suggestion(
            evidence,
            "overlap_dp_communication",
            evidence.step_ns - hidden,
            None,
            "Overlap the data-parallel communication with the backward pass",
            f"{transfer / 1e6:.1f} ms a step of communication over {names} runs with no compute under it "
            f"({_fraction(split, transfer):.0%} of the step); the prediction hides it all under the model's compute",
            "smaller buckets: none; FSDP2 without resharding after forward keeps each block's parameters",
            {"overlap_dp_communication": True},
            "DDP(model, bucket_cap_mb=<smaller than 25>) so the first buckets reduce while backward runs; FSDP2: "
            "fully_shard(block) for each block before fully_shard(model), so each block's reduce-scatter overlaps "
            "the next block's backward",
            {},
            ["--overlap-grad-reduce", "--overlap-param-gather"],
        )
    ]


def _late_rank(split: StepSplit, evidence: RunEvidence) -> list[Suggestion]:
    wait = split.part(COLLECTIVE_WAIT.name).ns
    if _fraction(split, wait) < WAIT_MARGIN:
        return []
    culprit = split.culprit
    if culprit is None:
        return [
            build_suggestion(
                evidence,
                "even_out_rank_work",
                evidence.step_ns - wait,
                None,
                "Even out the ranks' work before each collective",
                f"each rank waits {wait / 1e6:.1f} ms a step for its peers inside collectives "
                f"({_fraction(split, wait):.0%} of the step), no one rank the late one",
                "none",
                {},
                "compare the ranks' batches (uneven sequence lengths?) and hosts in the straggler view",
                {},
                [],
            )
        ]
    # Every rank's step is the victims' timeline plus what each waited: without the lateness, the step shrinks
    # by one victim's exposed wait (its peers' waits are the same delay, seen from each of them).
    lateness = culprit.lateness_ns
    where = f"rank {culprit.rank}" + (f" (host {culprit.host})" if culprit.host else "")
    victims = ", ".join(str(rank) for rank in culprit.victims[:8]) + (" …" if len(culprit.victims) > 8 else "")
    return [
        build_suggestion(
            evidence,
            "late_rank",
            evidence.step_ns - min(lateness, evidence.step_ns),
            None,
            f"Find why {where} arrives late at the collectives",
            f"{where} starts the collectives last and causes {culprit.share:.0%} of the waits in them: rank(s) "
            f"{victims} wait {lateness / 1e6:.1f} ms a step each for it",
            "none",
            {"exclude_hosts": [culprit.host]} if culprit.host else {},
            f"compare {where}'s compute and data loading with its peers' (the straggler view); drain its host "
            "if it stays slow",
            {},
            [],
        )
    ]


def _host_gaps(split: StepSplit, evidence: RunEvidence) -> list[Suggestion]:
    """Priced by the gaps every rank has: one rank's extra gaps are a late rank's (``_late_rank``)."""
    gaps = split.shared_gaps_ns
    if _fraction(split, gaps) < HOST_GAPS_MARGIN:
        return []
    return [
        build_suggestion(
            evidence,
            "cut_host_gaps",
            evidence.step_ns - gaps,
            None,
            "Cut the host's gaps between ops",
            f"every rank has {gaps / 1e6:.1f} ms a step ({_fraction(split, gaps):.0%}) with nothing recorded in it: "
            "Python and kernel-launch overhead between ops, or host work outside the instrumented model",
            "none",
            {"compile": True},
            "torch.compile(model) (mode='reduce-overhead' adds CUDA graphs); a larger batch per rank spreads the "
            "per-op cost; instrument_model() on any model the step runs outside the one instrumented",
            {"compile.enable": True},
            [],
        )
    ]
