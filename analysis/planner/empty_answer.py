"""Why a search found nothing, in one sentence the answer carries (``PlanOutcome.why_none``): the global batch no
layout splits, the memory the leanest layout still needs, or the reason every layout is refused. An on-call engineer
reading "nothing fits" needs to know which of those it is, and what to change.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from bubblescope.analysis.planner.evaluate import evaluate
from bubblescope.analysis.planner.labels import config_label
from bubblescope.analysis.planner.memory import GIB
from bubblescope.analysis.planner.search import candidates, layouts
from bubblescope.analysis.planner.specs import ClusterSpec, ModelSpec


def why_nothing_runs(model: ModelSpec, cluster: ClusterSpec, batch: int, fixed: Mapping[str, Any]) -> str:
    """Why ``search`` with these arguments returned no plan (it evaluates the space again: the empty answer only)."""
    tried = list(candidates(model, cluster, batch, fixed))
    if not tried:
        return _batch_unsplit(model, cluster, batch, fixed)
    plans = [evaluate(model, cluster, config, batch) for config in tried]
    sized = [plan for plan in plans if plan.memory is not None and plan.step is not None]
    if sized:
        leanest = min(sized, key=lambda plan: plan.memory.total if plan.memory else 0.0)
        assert leanest.memory is not None
        return (
            f"the leanest of the {len(plans)} layouts tried ({config_label(leanest)}) needs "
            f"{leanest.memory.total / GIB:.1f} GiB per GPU, {leanest.memory.available / GIB:.1f} GiB available"
        )
    reasons = Counter(plan.problems[0] for plan in plans if plan.problems)
    reason, count = reasons.most_common(1)[0]
    return f"every one of the {len(plans)} layouts tried is refused; the most common reason ({count}): {reason}"


def _batch_unsplit(model: ModelSpec, cluster: ClusterSpec, batch: int, fixed: Mapping[str, Any]) -> str:
    """The search made no configuration: no layout's data-parallel replicas (times a held micro-batch) divide the
    global batch. Says the fewest replicas tried."""
    mbs = int(fixed.get("mbs", 1))
    per = f"dp·mbs (mbs {mbs})" if "mbs" in fixed else "dp"
    tried = sorted(layouts(model, cluster, fixed), key=lambda layout: layout[3])
    if not tried:
        return f"no tp·cp·pp·dp layout of the held fields fills the {cluster.gpus} GPUs"
    tp, cp, pp, dp = tried[0]
    return (
        f"global batch {batch} does not split over the {per} of any layout tried; the fewest replicas, {dp}, are "
        f"{cluster.gpus} GPUs over tp {tp} · cp {cp} · pp {pp}"
    )
