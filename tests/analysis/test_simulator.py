"""The schedule replay against the registry's closed forms, and its orders against torch's own."""

from __future__ import annotations

import itertools

import pytest

from bubblescope.analysis.schedules import SCHEDULES, ScheduleError, closed_form_bubble, lookup
from bubblescope.analysis.simulator import PipelineSetup, StageCost, simulate, uniform_costs


def build_orders(schedule: str, p: int, m: int, v: int = 1) -> dict:
    return lookup(schedule).build_orders(p, m, v)


SHAPES = [(p, m) for p in (2, 3, 4, 8) for m in (p, 2 * p, 4 * p)]


def replay(schedule: str, p: int, m: int, v: int, costs: tuple[float, float, float]) -> PipelineSetup:
    return PipelineSetup(schedule, p, m, uniform_costs(p * v, *costs), v)


@pytest.mark.parametrize("p,m", SHAPES)
@pytest.mark.parametrize(
    "schedule,v",
    [
        ("gpipe", 1),
        ("1f1b", 1),
        ("interleaved1f1b", 2),
        ("interleaved1f1b", 3),
        ("loopedbfs", 2),
        ("interleavedzb", 1),
        ("interleavedzb", 2),
    ],
)
def test_equal_stage_times_give_the_closed_form_exactly(schedule: str, v: int, p: int, m: int) -> None:
    result = simulate(replay(schedule, p, m, v, (1.0, 2.0, 1.0)))  # T_F = T_B(input) = T_W
    floor = closed_form_bubble(schedule, p, m, v)
    assert floor is not None
    assert result.bubble_fraction == pytest.approx(floor.fraction, abs=1e-12)


@pytest.mark.parametrize("p,m", [(p, m) for p, m in SHAPES if m >= 2 * p])
@pytest.mark.parametrize("schedule", ["zbv", "dualpipev"])
def test_v_shaped_schedules_match_their_form_at_equal_times(schedule: str, p: int, m: int) -> None:
    result = simulate(replay(schedule, p, m, 2, (1.0, 2.0, 1.0)))
    floor = closed_form_bubble(schedule, p, m, 2)
    assert floor is not None
    assert result.bubble_fraction == pytest.approx(floor.fraction, abs=1e-12)
    assert result.idle_ns == pytest.approx([p - 1] * p)  # DualPipeV: (2p/2-1)(T_F&B+T_B-3T_W) = p-1


def test_naive_model_parallelism_idles_p_minus_1_of_p() -> None:
    for p in (2, 4, 8):
        result = simulate(replay("naive", p, 1, 1, (1.0, 2.0, 1.0)))
        assert result.bubble_fraction == pytest.approx((p - 1) / p)


@pytest.mark.parametrize("forward,backward,weight", [(1, 2, 1), (1, 3, 1), (2, 3, 1), (1, 2, 0.5), (1.5, 2, 0.8)])
@pytest.mark.parametrize("p", [2, 4, 8])
def test_zb_h1_idle_per_rank_is_p_minus_1_times_f_plus_b_minus_w(
    forward: float, backward: float, weight: float, p: int
) -> None:
    result = simulate(replay("interleavedzb", p, 4 * p, 1, (forward, backward, weight)))
    expected = (p - 1) * (forward + (backward - weight) - weight)
    assert sum(result.idle_ns) / p == pytest.approx(expected)
    one_f_one_b = simulate(replay("1f1b", p, 4 * p, 1, (forward, backward, weight)))
    assert sum(one_f_one_b.idle_ns) / p == pytest.approx((p - 1) * (forward + backward))


def test_activations_in_flight_match_the_table() -> None:
    p, m = 4, 16
    assert max(simulate(replay("gpipe", p, m, 1, (1, 2, 1))).peak_activations) == m
    assert max(simulate(replay("1f1b", p, m, 1, (1, 2, 1))).peak_activations) == p
    assert max(simulate(replay("interleavedzb", p, m, 1, (1, 2, 1))).peak_activations) == p  # like 1F1B
    assert max(simulate(replay("zbv", p, m, 2, (1, 2, 1))).peak_activations) == 2 * p
    assert max(simulate(replay("dualpipev", p, m, 2, (1, 2, 1))).peak_activations) == 2 * p + 1
    # Megatron's interleaved warm-up: rank 0 holds (v-1)p + 2(p-1) + 1 chunks, under the table's p·v+p-1 bound
    assert max(simulate(replay("interleaved1f1b", p, m, 2, (1, 2, 1))).peak_activations) <= p * 2 + p - 1


def test_a_slow_stage_sets_the_pace() -> None:
    costs = (StageCost(1, 2), StageCost(2, 4), StageCost(1, 2), StageCost(1, 2))
    slow = simulate(PipelineSetup("1f1b", 4, 8, costs))
    even = simulate(PipelineSetup("1f1b", 4, 8, uniform_costs(4, 1, 2)))
    assert slow.makespan_ns >= 8 * 6  # the slow stage alone needs m·(F+B)
    assert slow.makespan_ns > even.makespan_ns
    assert slow.idle_ns[1] < min(slow.idle_ns[i] for i in (0, 2, 3))


def test_p2p_latency_and_overheads_lengthen_the_step() -> None:
    base = simulate(replay("gpipe", 4, 8, 1, (1, 2, 1)))
    with_comm = simulate(PipelineSetup("gpipe", 4, 8, uniform_costs(4, 1, 2), p2p_ns=0.5, step_overhead_ns=3))
    assert with_comm.makespan_ns == pytest.approx(base.makespan_ns + 2 * 3 * 0.5)  # 3 hops down and 3 back
    assert with_comm.step_ns == pytest.approx(with_comm.makespan_ns + 3)
    one_f_one_b = simulate(PipelineSetup("1f1b", 4, 8, uniform_costs(4, 1, 2), p2p_ns=0.5))
    assert one_f_one_b.makespan_ns >= base.makespan_ns + 2 * 3 * 0.5  # its steady state waits on round trips too


@pytest.mark.parametrize(
    "setup,field",
    [
        (PipelineSetup("nope", 2, 2, uniform_costs(2, 1, 2)), "schedule"),
        (PipelineSetup("1f1b", 2, 0, uniform_costs(2, 1, 2)), "microbatches"),
        (PipelineSetup("1f1b", 2, 2, uniform_costs(3, 1, 2)), "stage_costs"),
        (PipelineSetup("zbv", 2, 4, uniform_costs(6, 1, 2), 3), "stages_per_rank"),
        (PipelineSetup("naive", 2, 4, uniform_costs(2, 1, 2)), "microbatches"),
    ],
)
def test_bad_setups_name_the_field(setup: PipelineSetup, field: str) -> None:
    with pytest.raises(ScheduleError, match=f"^{field}:"):
        simulate(setup)


TORCH_MULTI = {schedule.name: str(schedule.torch_class) for schedule in SCHEDULES if schedule.placement != "single"}


def torch_rank_order(class_name: str, p: int, m: int, v: int, rank: int) -> list[tuple[str, int, int]]:
    """torch's own per-rank plan (idle slots dropped, overlapped pairs flattened), built without a process group."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    cls = getattr(schedules, class_name)
    plan = cls.__new__(cls)
    rounds = max(1, m // p)
    for name, value in {
        "pp_group_size": p,
        "n_local_stages": v,
        "_n_microbatches": m,
        "number_of_rounds": rounds,
        "microbatches_per_round": m // rounds,
        "num_stages": p * v,
        "_num_stages": p * v,
        "_stages": [None] * v,
        "rank": rank,
    }.items():
        setattr(plan, name, value)
    flat = []
    for action in plan._calculate_single_rank_operations(rank):
        if action is None:
            continue
        for part in action.sub_actions or (action,):
            kind = part.computation_type.value
            flat.append(("B" if kind == "B" else kind, part.stage_index, part.microbatch_index))
    return flat


@pytest.mark.parametrize("schedule", sorted(TORCH_MULTI))
@pytest.mark.parametrize("p,m", [(2, 4), (2, 8), (4, 8), (4, 12), (4, 16), (8, 16)])
def test_orders_are_the_ones_torch_runs(schedule: str, p: int, m: int) -> None:
    v = 2
    ours = build_orders(schedule, p, m, v)
    for rank in range(p):
        expected = torch_rank_order(TORCH_MULTI[schedule], p, m, v, rank)
        assert [(a.kind, a.stage, a.microbatch) for a in ours[rank]] == expected, f"rank {rank}"


def test_every_order_runs_each_action_once() -> None:
    for schedule, v in [
        ("gpipe", 1),
        ("1f1b", 1),
        ("interleaved1f1b", 2),
        ("interleavedzb", 2),
        ("zbv", 2),
        ("dualpipev", 2),
    ]:
        for p, m in itertools.product((2, 4), (8, 16)):
            actions = [a for order in build_orders(schedule, p, m, v).values() for a in order]
            assert len(actions) == len(set(actions))
            forwards = {(a.stage, a.microbatch) for a in actions if a.kind == "F"}
            assert forwards == set(itertools.product(range(p * v), range(m)))
