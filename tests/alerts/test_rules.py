"""The alert rules on snapshots: who is blamed for a failure and a hang, what fires, what does not."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone
from typing import Any

from bubblescope.analysis.alert_rules import (
    RULES,
    BubbleFigures,
    RankStatus,
    RegressionFigures,
    RunSnapshot,
    Thresholds,
    evaluate,
    failure_culprit,
    hung_lagging,
)

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=timezone.utc)
THRESHOLDS = Thresholds(
    silent_after_s=120,
    hung_after_s=60,
    regression_percent=25,
    regression_for_s=300,
    bubble_over_floor_points=10,
    bubble_for_steps=20,
)


def rank(number: int, ago_s: float = 1.0, **changes: Any) -> RankStatus:
    base = RankStatus(
        rank=number,
        host=f"node{number // 8}",
        stage=number % 4,
        outcome=None,
        error=None,
        end_ns=None,
        ended_at=None,
        last_heard_at=NOW - timedelta(seconds=ago_s),
        last_step=100,
        in_flight=None,
    )
    return dataclasses.replace(base, **changes)


def snapshot(ranks: list[RankStatus], **changes: Any) -> RunSnapshot:
    base = RunSnapshot(
        key="job",
        state="running",
        state_detail="",
        now=NOW,
        quiet_s=1.0,
        ranks=ranks,
        world_size=len(ranks),
        usual_step_s=1.0,
        progress_quiet_s=1.0,
    )
    return dataclasses.replace(base, **changes)


def names(found: list[Any]) -> list[str]:
    return [alert.alertname for alert in found]


def test_a_healthy_run_raises_nothing() -> None:
    healthy = snapshot(
        [rank(r) for r in range(16)],
        bubble=BubbleFigures(0.20, 0.15, [0.20] * 20, None),
        regression=RegressionFigures(1.0, [1.05, 1.1, 1.0], 320),
    )
    assert evaluate(healthy, THRESHOLDS) == []


def test_the_first_failure_is_blamed_when_it_is_its_own_error() -> None:
    failed = snapshot(
        [
            rank(0, outcome="failed", error="RuntimeError: connection reset by peer", end_ns=20, ended_at=NOW),
            rank(1, outcome="failed", error="CUDA error: an illegal memory access", end_ns=10, ended_at=NOW),
            rank(2, outcome="failed", error="SIGTERM: terminated", end_ns=30, ended_at=NOW),
        ],
        state="failed",
    )
    culprit, why = failure_culprit(failed.ranks, 3, NOW) or (None, "")
    assert culprit is not None and culprit.rank == 1 and "illegal memory access" in why
    alert = evaluate(failed, THRESHOLDS)[0]
    assert alert.alertname == "BubblescopeRunFailed" and alert.labels == {"rank": "1", "host": "node0", "stage": "1"}
    assert alert.action.startswith("Read rank 1's log first, on host node0:"), alert.action  # no PID registered
    with_pid = snapshot([dataclasses.replace(r, pid=4000 + r.rank) for r in failed.ranks], state="failed")
    assert "on host node0 (PID 4001)" in evaluate(with_pid, THRESHOLDS)[0].action


def test_the_hung_alerts_action_names_the_lagging_ranks_host_and_pid() -> None:
    report = {"step": 101, "in_step": True, "elapsed_s": 90.0}
    blocked = {**report, "op": {"kind": "all_reduce", "name": "grads", "group": "dp", "peer": 8, "elapsed_s": 89.0}}
    ranks = [rank(r, pid=7000 + r, in_flight=blocked) for r in range(8)] + [rank(8, pid=7008, in_flight=report)]
    hung = snapshot(ranks, progress_quiet_s=95.0)
    alert = next(a for a in evaluate(hung, THRESHOLDS) if a.alertname == "BubblescopeRunHung")
    assert "(on host node1: py-spy dump --pid 7008 (rank 8))" in alert.action, alert.action
    assert alert.action.startswith("Dump the lagging rank's Python stack"), alert.action
    unknown = snapshot([dataclasses.replace(r, pid=None) for r in ranks], progress_quiet_s=95.0)
    generic = next(a for a in evaluate(unknown, THRESHOLDS) if a.alertname == "BubblescopeRunHung")
    assert "py-spy dump --pid PID on its host" in generic.action  # the runbook's own words, nothing invented


def test_broken_connections_and_terminations_blame_the_rank_that_vanished_first() -> None:
    ranks = [
        rank(0, outcome="failed", error="RuntimeError: Connection reset by peer", end_ns=50, ended_at=NOW),
        rank(1, outcome="failed", error="SIGTERM: terminated (by the launcher ...)", end_ns=40, ended_at=NOW),
        rank(9, ago_s=30, last_step=41),  # killed: quiet before anyone failed, no end
        rank(3, ago_s=40, last_step=40),  # killed earlier still: the culprit
    ]
    culprit, why = failure_culprit(ranks, len(ranks), NOW) or (None, "")
    assert culprit is not None and culprit.rank == 3
    assert "without reporting an end" in why and "host node0" in why and "last step 40" in why


def test_a_rank_heard_after_the_failures_is_not_blamed() -> None:
    ranks = [
        rank(0, outcome="failed", error="Connection reset by peer", end_ns=1, ended_at=NOW - timedelta(seconds=10)),
        rank(1, ago_s=1),  # heard after rank 0 failed: alive then
    ]
    culprit, _ = failure_culprit(ranks, len(ranks), NOW) or (None, "")
    assert culprit is not None and culprit.rank == 0


def blocked(peer: int | None, kind: str = "recv") -> dict[str, Any]:
    op = {"kind": kind, "name": "bwd", "group": "pp", "peer": peer, "bytes": 8, "elapsed_s": 70.0}
    return {"step": 101, "in_step": True, "elapsed_s": 71.0, "op": op}


def test_a_hang_names_the_rank_outside_any_collective_and_what_the_others_wait_in() -> None:
    stuck = {"step": 101, "in_step": True, "elapsed_s": 71.0, "op": None}
    ranks = [rank(0, in_flight=blocked(1)), rank(1, in_flight=stuck), rank(2, in_flight=blocked(None, "all_reduce"))]
    hung = snapshot(ranks, progress_quiet_s=75.0)
    lagging, waiting = hung_lagging(hung.ranks, hung.world_size, hung.now, 120)
    assert [r.rank for r in lagging] == [1] and {r.rank for r in waiting} == {0, 2}
    (alert,) = evaluate(hung, THRESHOLDS)
    assert alert.alertname == "BubblescopeRunHung" and alert.labels["rank"] == "1"
    assert "rank 0 waits in recv 'bwd' with rank 1 on group pp" in alert.description
    assert "outside any collective" in alert.description


def test_a_hang_blames_the_peer_a_recv_waits_on_when_it_is_quiet() -> None:
    ranks = [rank(0, in_flight=blocked(1)), rank(1, ago_s=100, in_flight=None), rank(2, in_flight=blocked(0))]
    stalled = snapshot(ranks, progress_quiet_s=90.0)
    lagging, _ = hung_lagging(stalled.ranks, stalled.world_size, stalled.now, 60)
    assert [r.rank for r in lagging] == [1]


def test_no_hang_before_the_threshold_or_five_usual_steps() -> None:
    ranks = [rank(0, in_flight=blocked(1)), rank(1, in_flight={"step": 3, "in_step": True, "elapsed_s": 9, "op": None})]
    assert evaluate(snapshot(ranks, progress_quiet_s=50.0), THRESHOLDS) == []
    slow_steps = snapshot(ranks, progress_quiet_s=80.0, usual_step_s=20.0)  # 5 steps = 100 s
    assert evaluate(slow_steps, THRESHOLDS) == []
    assert names(evaluate(snapshot(ranks, progress_quiet_s=101.0, usual_step_s=20.0), THRESHOLDS)) == [
        "BubblescopeRunHung"
    ]


def test_regression_fires_only_when_every_part_of_the_window_is_slower() -> None:
    slow = snapshot([rank(0)], regression=RegressionFigures(1.0, [1.4, 1.5, 1.45], 310))
    assert names(evaluate(slow, THRESHOLDS)) == ["BubblescopeStepTimeRegression"]
    spike = snapshot([rank(0)], regression=RegressionFigures(1.0, [1.0, 1.1, 2.0], 310))
    assert evaluate(spike, THRESHOLDS) == []
    short = snapshot([rank(0)], regression=RegressionFigures(1.0, [1.4, 1.5, 1.45], 200))
    assert evaluate(short, THRESHOLDS) == []


def test_bubble_above_floor_carries_the_advisors_action() -> None:
    above = snapshot([rank(0)], bubble=BubbleFigures(0.40, 0.15, [0.40, 0.30] * 10, "Raise micro-batches to 16"))
    (alert,) = evaluate(above, THRESHOLDS)
    assert alert.alertname == "BubblescopeBubbleAboveFloor" and alert.action == "Raise micro-batches to 16"
    assert "40% of the median step, and at least 30% in each of the newest 20 steps" in alert.description


def test_bubble_above_floor_must_hold_in_each_of_the_steps() -> None:
    """A median well above the floor with some steps near it is jitter (a loaded host), not a pattern;
    and fewer steps than --bubble-for-steps are not enough to say."""
    jittery = snapshot([rank(0)], bubble=BubbleFigures(0.40, 0.15, [0.40] * 19 + [0.24], None))
    assert evaluate(jittery, THRESHOLDS) == []
    young = snapshot([rank(0)], bubble=BubbleFigures(0.40, 0.15, [0.40] * 19, None))
    assert evaluate(young, THRESHOLDS) == []
    persistent = snapshot([rank(0)], bubble=BubbleFigures(0.40, 0.15, [0.40] * 19 + [0.26], None))
    assert names(evaluate(persistent, THRESHOLDS)) == ["BubblescopeBubbleAboveFloor"]


def test_silent_names_the_first_rank_to_go_quiet_and_disabled_rules_stay_quiet() -> None:
    silent = snapshot([rank(0, ago_s=200), rank(1, ago_s=300, last_step=7)], state="silent", quiet_s=200)
    (alert,) = evaluate(silent, THRESHOLDS)
    assert (
        alert.alertname == "BubblescopeRunSilent"
        and "rank 1" in alert.description
        and "last step 7" in alert.description
    )
    off = dataclasses.replace(THRESHOLDS, disabled=frozenset({"BubblescopeRunSilent"}))
    assert evaluate(silent, off) == []


def test_dropping_fires_while_the_count_grows() -> None:
    assert names(evaluate(snapshot([rank(0)], dropping=True, dropped_spans=500), THRESHOLDS)) == [
        "BubblescopeCollectorDropping"
    ]


def test_every_rule_is_documented_in_docs_alerts_md() -> None:
    from pathlib import Path

    from bubblescope.analysis.alert_rules import alerts_table

    document = (Path(__file__).resolve().parents[2] / "docs" / "alerts.md").read_text()
    assert alerts_table() in document, "regenerate with: python -m bubblescope.analysis.alert_rules"
    assert len({rule.alertname for rule in RULES}) == len(RULES)


def test_every_prometheus_rule_is_documented_in_docs_metrics_md() -> None:
    from pathlib import Path

    from bubblescope.analysis import prometheus_rules_table

    document = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    assert prometheus_rules_table() in document, "regenerate docs/metrics.md's table: prometheus_rules_table()"


def test_the_service_rules_take_their_names_severities_and_runbook_from_the_registry() -> None:
    from bubblescope.analysis.alert_catalog import CATALOG

    registry = {spec.alertname: spec for spec in CATALOG if spec.by_service}
    assert [rule.alertname for rule in RULES] == list(registry)
    for rule in RULES:
        assert (rule.severity, rule.meaning, rule.action) == (
            registry[rule.alertname].severity,
            registry[rule.alertname].meaning,
            registry[rule.alertname].action,
        )
