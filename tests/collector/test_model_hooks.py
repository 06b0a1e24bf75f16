"""``instrument_model`` in one process, on a real recorder: the model's spans and each block's, nested, in order,
with the time each part really took (sleeps in the forward and in the backward of each block)."""

from __future__ import annotations

import itertools
import time

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from bubblescope import wire
from bubblescope.collector import model_hooks
from bubblescope.collector.recorder import Recorder, StepRecord

SLEEP_MS = (4.0, 8.0, 16.0)  # per block, forward; the backward sleeps twice as long


class SleepInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: object, x: torch.Tensor, ms: float) -> torch.Tensor:
        ctx.ms = ms  # type: ignore[attr-defined]
        return x.clone()

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        time.sleep(2 * ctx.ms / 1e3)  # type: ignore[attr-defined]
        return grad, None


class Block(nn.Module):
    def __init__(self, ms: float) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.ms = ms

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.ms / 1e3)
        return SleepInBackward.apply(self.linear(x), self.ms)


def recorded(model: nn.Module, steps: int = 1, **hooks: object) -> list[StepRecord]:
    out: list[StepRecord] = []
    recorder = Recorder(out.append, lambda _n: None, 10_000)
    model_hooks.instrument_model(model, recorder, **hooks)  # type: ignore[arg-type]
    for _ in range(steps):
        recorder.begin_step()
        model(torch.randn(2, 8)).sum().backward()
        recorder.end_step()
    return out


def ms(row: tuple[object, ...]) -> float:
    return (int(row[3]) - int(row[2])) / 1e6  # type: ignore[call-overload]


def test_each_block_gets_its_own_forward_and_backward_nested_in_the_models() -> None:
    model = nn.Sequential(*(Block(m) for m in SLEEP_MS))
    spans = recorded(model, blocks=model)[-1].spans
    named = {(row[1], row[-1]): row for row in spans}
    assert len(named) == len(spans) == 8, [(r[1], r[-1]) for r in spans]  # 2 of the model's, 2 per block
    root_forward, root_backward = named[("forward", "Sequential")], named[("backward", "Sequential")]
    for index, sleep in enumerate(SLEEP_MS):
        name = wire.block_span_name("Sequential", str(index))
        assert wire.block_of(name) == str(index)
        forward, backward = named[("forward", name)], named[("backward", name)]
        assert root_forward[2] <= forward[2] < forward[3] <= root_forward[3]
        # the last block's backward starts at a hook on the model's output registered before the model's own,
        # and block 0's, fed by data, ends in a callback queued after the model's: microseconds apart
        assert root_backward[2] - 1_000_000 <= backward[2] < backward[3] <= root_backward[3] + 1_000_000
        assert sleep <= ms(forward) < sleep + 50, (name, ms(forward))
        # block 0 is fed by data: its backward ends with the whole backward, which ends in it anyway
        assert 2 * sleep <= ms(backward) < 2 * sleep + 50, (name, ms(backward))
    blocks_backward = sorted(
        (named[("backward", wire.block_span_name("Sequential", str(i)))] for i in range(3)), key=lambda r: r[2]
    )
    assert [wire.block_of(r[-1]) for r in blocks_backward] == ["2", "1", "0"]  # backward runs last block first
    for earlier, later in itertools.pairwise(blocks_backward):
        assert earlier[3] <= later[2]  # block backwards never overlap


def test_a_block_outside_the_model_is_refused_and_the_models_own_spans_stay() -> None:
    model = nn.Sequential(Block(1.0))
    with pytest.raises(ValueError, match="blocks: Linear is not a submodule"):
        recorded(model, blocks=[nn.Linear(8, 8)])
    spans = recorded(model)[-1].spans  # a second instrumentation on the same model: its own spans only
    assert {(r[1], r[-1]) for r in spans} == {("forward", "Sequential"), ("backward", "Sequential")}


def test_a_checkpointed_blocks_recompute_is_not_recorded_twice() -> None:
    class Checkpointed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = Block(4.0)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return checkpoint(self.inner, x, use_reentrant=False)

    model = nn.Sequential(nn.Linear(8, 8), Checkpointed())
    spans = recorded(model, blocks=[model[1].inner])[-1].spans
    block = wire.block_span_name("Sequential", "1.inner")
    assert [(r[1], r[-1]) for r in spans].count(("forward", block)) == 1
    assert [(r[1], r[-1]) for r in spans].count(("backward", block)) == 1


def test_a_root_name_with_the_separator_is_kept_apart_from_block_names() -> None:
    spans = recorded(nn.Sequential(Block(1.0)), name="team/model")[-1].spans
    assert {r[-1] for r in spans} == {"team_model"} and wire.block_of("team_model") is None


def test_a_pipeline_stages_layers_are_timed_with_their_activation_on_detailed_steps_apart() -> None:
    """``instrument_stage_layers`` while a schedule records the stage (``pipeline_compute``): each layer (a Block
    and the GELU after it) gets its forward and backward with its sleep, on the first steps after the one the
    layers first ran in, then on detailed steps at least ``LAYER_STEPS_APART`` apart; nothing while paused."""
    out: list[StepRecord] = []
    recorder = Recorder(out.append, lambda _n: None, 10_000)
    recorder.pipeline_compute = True
    stage = nn.Sequential(Block(SLEEP_MS[0]), nn.GELU(), Block(SLEEP_MS[1]), nn.GELU())
    assert model_hooks.instrument_stage_layers(stage, 3, recorder) == 2
    apart, first = model_hooks.LAYER_STEPS_APART, model_hooks.LAYER_STEPS_FIRST
    steps = first + 2 * apart + 1
    for _ in range(steps):
        recorder.begin_step()
        stage(torch.randn(2, 8)).sum().backward()
        recorder.end_step()
    timed = [record.step for record in out if record.spans]
    # from step 1 (step 0 ran the layers first), then apart
    assert timed == [*range(1, 1 + first), first + apart, first + 2 * apart], timed
    spans = {(row[1], row[-1]): row for row in out[1].spans}
    assert len(spans) == len(out[1].spans) == 4
    for child, sleep in (("0", SLEEP_MS[0]), ("2", SLEEP_MS[1])):
        name = wire.stage_layer_span_name(3, child)
        assert wire.stage_layer_of(name) == (3, child)
        assert sleep <= ms(spans[("forward", name)]) < sleep + 50
        assert 2 * sleep <= ms(spans[("backward", name)]) < 2 * sleep + 50
    recorder.set_paused_depth(1)
    for _ in range(apart):  # the next step to time its layers is among these
        recorder.begin_step()
        stage(torch.randn(2, 8)).sum().backward()
        recorder.end_step()
    assert len(out) == steps + apart and not any(record.spans for record in out[steps:])


def test_a_reused_leaf_input_keeps_no_hooks_and_a_second_pass_from_the_output_opens_nothing() -> None:
    """A pipeline stage's receive buffer is one leaf reused all run long: the hooks closing each call's backward at
    its gradient are removed once that backward is over, not piled up. A second gradient pass that starts again at
    a layer's output (a zero-bubble schedule's weight pass) records no second backward."""
    out: list[StepRecord] = []
    recorder = Recorder(out.append, lambda _n: None, 10_000)
    recorder.pipeline_compute = True
    stage = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8))
    model_hooks.instrument_stage_layers(stage, 1, recorder)
    received = torch.zeros(2, 8).requires_grad_()
    for _ in range(model_hooks.LAYER_STEPS_FIRST):  # steps 0-9; step 10, below, times its layers too
        recorder.begin_step()
        for _microbatch in range(4):
            received.data.normal_()
            stage(received).sum().backward()
        recorder.end_step()
    assert len(received._backward_hooks or {}) <= 1  # the newest call's, removed at the next one
    recorder.begin_step()
    output = stage(received)
    torch.autograd.grad(output.sum(), [received], retain_graph=True)  # the input-gradient pass
    torch.autograd.grad(output.sum(), list(stage.parameters()))  # the weight pass, from the output again
    recorder.end_step()
    backward = [row for row in out[-1].spans if row[1] == "backward"]
    assert sorted(row[-1] for row in backward) == [wire.stage_layer_span_name(1, n) for n in ("0", "2")], backward


def test_compiled_layers_are_not_timed() -> None:
    """torchtitan compiles each block (``module.compile()``): hooks on it would run inside the compiled region, which
    a full graph refuses. Such a stage keeps its actions' spans and gets no layer hooks (nothing is compiled here:
    ``compile()`` only wraps the call)."""
    recorder = Recorder(lambda _record: None, lambda _n: None, 10_000)
    stage = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8))
    stage[2].compile()
    assert model_hooks.instrument_stage_layers(stage, 0, recorder) == 0
    assert not stage[0]._forward_pre_hooks and not stage[2]._forward_hooks
    assert model_hooks.instrument_stage_layers(nn.Sequential(nn.Linear(8, 8)), 0, recorder) == 1
