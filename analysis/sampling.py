"""Which ranks stand for a big run's step: each stage's median and slowest rank, and a sample of whole
data-parallel replicas whose spans are read in place of every rank's.

A 16,384-rank step holds ~1.5 million spans: reading and splitting them all took the service 20 s of
CPU. Every rank's step aggregate (compute, communication, idle over its window) is stored anyway, so
past ``SPANS_OF_EVERY_RANK_UP_TO`` ranks the spans are read for ``SAMPLE_REPLICAS`` replicas only:
those holding each stage's median and slowest rank by compute (what the timeline shows), then others
evenly spaced over the replica indexes. A replica is taken whole (one rank of every stage) so that each
pipeline recv in the sample finds its peer's send, and the dependency waits stay measured, not guessed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Final

SPANS_OF_EVERY_RANK_UP_TO: Final = 2048
"""Up to this many ranks a step's spans are read for every rank; past it, for the sampled replicas."""
SAMPLE_REPLICAS: Final = 32
"""How many data-parallel replicas the sample holds (8 stages: 256 ranks, ~23k spans a step)."""


def median_and_slowest(computes: Iterable[tuple[int, int | None, int]]) -> list[tuple[int, int | None, str]]:
    """Per stage (stages in order, no stage last), its median rank by compute and, when another, its
    slowest: (rank, stage, role), role "median of N" or "slowest of N"."""
    by_stage: dict[int | None, list[tuple[int, int]]] = defaultdict(list)
    for rank, stage, compute_ns in computes:
        by_stage[stage].append((compute_ns, rank))
    chosen: list[tuple[int, int | None, str]] = []
    for stage, peers in sorted(by_stage.items(), key=lambda item: (item[0] is None, item[0] or 0)):
        ordered = sorted(peers)
        median, slowest = ordered[(len(ordered) - 1) // 2][1], ordered[-1][1]
        chosen.append((median, stage, f"median of {len(peers)}"))
        if slowest != median:
            chosen.append((slowest, stage, f"slowest of {len(peers)}"))
    return chosen


def sampled_ranks(
    compute_ns: Mapping[int, int],
    stage_of: Mapping[int, int | None],
    replica_of: Mapping[int, int | None],
    replicas: int = SAMPLE_REPLICAS,
) -> frozenset[int]:
    """The ranks of the sampled replicas (module docstring). A rank without a replica index (no ``dp``
    coordinate) is a replica of its own."""
    members: dict[tuple[bool, int], list[int]] = defaultdict(list)
    for rank in compute_ns:
        replica = replica_of.get(rank)
        members[(False, replica) if replica is not None else (True, rank)].append(rank)
    key_of = {rank: key for key, ranks in members.items() for rank in ranks}
    picked: list[tuple[bool, int]] = []
    for rank, _, _ in median_and_slowest((r, stage_of.get(r), ns) for r, ns in compute_ns.items()):
        if key_of[rank] not in picked:
            picked.append(key_of[rank])
    ordered = sorted(members)
    stride = max(1, len(ordered) // max(1, replicas))
    for key in ordered[::stride]:
        if len(picked) >= replicas:  # the median and slowest replicas are kept whatever their count
            break
        if key not in picked:
            picked.append(key)
    return frozenset(rank for key in picked for rank in members[key])
