"""The schedule registry: every name of every schedule gets one answer from every part that reads it
(simulator, what-if, suggestions, planner, the CLI), and torch's own names are all known."""

from __future__ import annotations

import argparse
import ast
import re
from dataclasses import asdict
from pathlib import Path

import pytest

from bubblescope.analysis.attribution import attribute_bubble
from bubblescope.analysis.pipeline_profile import MeasuredPipeline
from bubblescope.analysis.planner.request import plan_document
from bubblescope.analysis.schedules import NAMES, SCHEDULES, Schedule, ScheduleError, closed_form_bubble, lookup
from bubblescope.analysis.simulator import PipelineSetup, StageCost, simulate
from bubblescope.analysis.suggestions import RunEvidence, suggest
from bubblescope.analysis.whatif import Change, predict
from bubblescope.cli import schedule_argument
from tests.support import REPO

MS = 1e6


def spellings(schedule: Schedule) -> list[str]:
    """Every way a user may name it: short name, aliases, torch's class, torchtitan's, case and separators."""
    names = [schedule.name, *schedule.aliases]
    if schedule.torch_class is not None:
        names += [schedule.torch_class, str(schedule.torchtitan_name)]
    variants = [name.upper() for name in names] + [f"{name[:2]}-{name[2:]}" for name in names if len(name) > 2]
    return names + variants


def shape(schedule: Schedule) -> tuple[int, int, int]:
    """(p, m, v) that every schedule can run: m >= 2p covers DualPipeV and the ZB-V closed form."""
    p = 2
    return p, (1 if schedule.min_microbatches == "one" else 4 * p), schedule.default_stages_per_rank


def measured_run(name: str, schedule: Schedule) -> MeasuredPipeline:
    p, m, v = shape(schedule)
    costs = tuple(StageCost((1 + s % 2) * MS, 2 * (1 + s % 2) * MS) for s in range(p * v))
    setup = PipelineSetup(name, p, m, costs, stages_per_rank=v, p2p_ns=0.2 * MS, step_overhead_ns=3 * MS)
    return MeasuredPipeline(setup, None, simulate(setup).step_ns, 10)


@pytest.mark.parametrize("schedule", SCHEDULES, ids=NAMES)
def test_every_spelling_gets_one_answer_from_simulator_whatif_suggestions_and_planner(schedule: Schedule) -> None:
    p, m, v = shape(schedule)
    answers = []
    for name in spellings(schedule):
        assert lookup(name) is schedule, name
        run = measured_run(name, schedule)
        replay = simulate(run.setup)
        attribution = attribute_bubble(run, measured_bubble_ns=0.3 * replay.step_ns, step_ns=replay.step_ns)
        evidence = RunEvidence(config={"schedule": name}, step_ns=replay.step_ns, measured=run, attribution=attribution)
        plan = plan_document(
            {
                "model": "gpt-1.7b",
                "cluster": "a100-80gb-x8",
                "global_batch": 64,
                # dp = 2: one micro-batch of 32 for the naive split, 32 of 1 otherwise
                "config": {"tp": 1, "pp": 4, "mbs": 32 if schedule.min_microbatches == "one" else 1, "schedule": name},
            }
        )
        answers.append(
            (
                schedule.build_orders(p, m, v),
                closed_form_bubble(name, p, m, v),
                (replay.step_ns, replay.idle_ns, replay.peak_activations),
                predict(run, Change(microbatches=2 * m if schedule.min_microbatches != "one" else None)).step_ns,
                [asdict(s) for s in suggest(evidence)],
                plan.as_dict(),
                schedule_argument(name),
            )
        )
    assert all(answer == answers[0] for answer in answers[1:])
    assert answers[0][-1] == schedule.name
    plan = answers[0][-2]["plans"][0]
    assert plan["config"]["schedule"] == schedule.name and plan["step_time_s"] is not None, plan  # priced


def test_torch_names_are_all_known_and_name_the_same_class() -> None:
    pipelining = pytest.importorskip("torch.distributed.pipelining.schedules")
    generic = {"PipelineScheduleSingle", "PipelineScheduleMulti"}  # base classes, not schedules to run
    known = ("1F1B", "Interleaved1F1B", "GPipe", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")
    for name in known:
        torch_class = pipelining.get_schedule_class(name)
        assert lookup(name).torch_class == torch_class.__name__, name
        assert lookup(torch_class.__name__).torch_class == torch_class.__name__
    for schedule in SCHEDULES:
        if schedule.torch_class is None:
            continue
        assert getattr(pipelining, schedule.torch_class) is pipelining.get_schedule_class(schedule.torchtitan_name)
        assert schedule.torchtitan_name not in generic
    with pytest.raises(ScheduleError, match=r"^schedule: unknown"):
        lookup("PipelineScheduleMulti")


def test_unknown_names_and_refused_shapes_name_the_field() -> None:
    with pytest.raises(ScheduleError) as unknown:
        lookup("zigzag")
    assert unknown.value.field == "schedule" and "1f1b" in unknown.value.message
    one_f_one_b, zbv, interleaved = lookup("1f1b"), lookup("ZBVZeroBubble"), lookup("Interleaved1F1B")
    assert one_f_one_b.shape_problem(4, 3, 1).field == "microbatches"  # torch: m >= stages
    assert zbv.shape_problem(2, 8, 3).field == "stages_per_rank"  # exactly two per rank
    assert interleaved.shape_problem(3, 10, 2).field == "microbatches"  # 10 % max(1, 10 // 3) != 0
    assert interleaved.shape_problem(4, 12, 3) is None
    with pytest.raises(argparse.ArgumentTypeError, match="unknown schedule 'zigzag'"):
        schedule_argument("zigzag")


def test_placements_put_each_stage_on_one_rank() -> None:
    for schedule in SCHEDULES:
        for p in (1, 2, 4):
            v = schedule.default_stages_per_rank
            held = sorted(stage for rank in range(p) for stage in schedule.local_stages(rank, p))
            assert held == list(range(p * v)), schedule.name
            assert all(
                schedule.stage_rank(p, stage) == rank for rank in range(p) for stage in schedule.local_stages(rank, p)
            )
    assert lookup("zbv").local_stages(0, 4) == [0, 7]  # the V: first and last stage on rank 0
    assert lookup("loopedbfs").local_stages(1, 4, 3) == [1, 5, 9]


def _string_literals(path: Path) -> list[tuple[int, str]]:
    if path.suffix == ".py":
        return [
            (node.lineno, node.value)
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
        ]
    return [
        (text.count("\n", 0, m.start()) + 1, m.group(2))
        for text in [path.read_text()]
        for m in re.finditer(r"([\"'`])([^\"'`\n]*)\1", text)
    ]


def test_schedule_names_are_written_only_in_the_registry() -> None:
    """Code holds a registry entry (``ONE_F_ONE_B``, ``lookup(name)`` at the edge), never a name of its own;
    the layer-wise split's name is the wire's (what the collector reports). Tests and benches, which run
    jobs as a user types them, may."""
    names = {schedule.name for schedule in SCHEDULES}
    homes = {REPO / "analysis" / "schedules.py", REPO / "bubblescope" / "wire.py"}
    product = [
        path
        for folder in ("analysis", "backend", "bubblescope", "collector", "frontend")
        for path in sorted((REPO / folder).rglob("*"))
        if path.suffix in (".py", ".js") and path not in homes
    ]
    found = [
        f"{path.relative_to(REPO)}:{line}: {text!r}"
        for path in product
        for line, text in _string_literals(path)
        if text in names
    ]
    assert found == []
