"""What ``collector.instrument_model`` costs a training step, in one process (CPU, no distributed group).

Two identical models (same weights), one instrumented, one not, step in ABBA order inside the same
``collector.step()`` windows, so the collector's per-step work falls on both alike and only the hooks differ:
the figure is the median over step pairs of (instrumented step / plain step), beside the ratio of total times,
and the same for two plain copies (an A/A control: the comparison's own noise).
The hooks run once per call of the instrumented module (the root), so their cost is per model call, not per
layer; the second figure is that cost alone, in microseconds, on a model that does nothing (``nn.Identity``
with a gradient): forward pre-hook + hook + the output's gradient hook + the end-of-backward callback; the third,
what ``blocks=`` adds per block call (the same hooks on each block, and a hook on its input's gradient).

    python bench/model_hooks_overhead.py [--steps 400] [--hidden 512] [--layers 8] [--batch 64]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
from torch import nn

from bench.answer_only_service import start_answer_only
from bubblescope import collector


def mlp(hidden: int, layers: int) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(hidden, hidden), nn.GELU()) for _ in range(layers)])


def train_step(model: nn.Module, inputs: torch.Tensor) -> float:
    start = time.perf_counter()
    model(inputs).pow(2).mean().backward()
    return time.perf_counter() - start


def step_ratio(args: argparse.Namespace, hooks: bool = True) -> tuple[float, float, float]:
    """(median pair ratio, ratio of totals, median plain step in ms); ``hooks=False``: the same with two plain
    copies, the comparison's own noise (an A/A control)."""
    plain = mlp(args.hidden, args.layers)
    hooked = copy.deepcopy(plain)
    if hooks:
        collector.instrument_model(hooked)
    inputs = torch.randn(args.batch, args.hidden)
    times: dict[str, list[float]] = {"plain": [], "hooked": []}
    for step in range(args.steps):
        order = ("plain", "hooked") if step % 2 == 0 else ("hooked", "plain")
        with collector.step():
            for name in order:
                times[name].append(train_step(plain if name == "plain" else hooked, inputs))
    pairs = [h / p for h, p in zip(times["hooked"][10:], times["plain"][10:])]
    return statistics.median(pairs), sum(times["hooked"]) / sum(times["plain"]), 1e3 * statistics.median(times["plain"])


def hook_cost_us(calls: int) -> float:
    """Microseconds the hooks add to one forward and backward of a module that does nothing."""
    plain = nn.Identity()
    hooked = collector.instrument_model(nn.Identity())
    x = torch.ones(1, requires_grad=True)

    def run(module: nn.Module) -> float:
        start = time.perf_counter()
        with collector.step():
            for _ in range(calls):
                module(x * 1.0).sum().backward()
        return time.perf_counter() - start

    rounds = [(run(hooked) - run(plain)) / calls * 1e6 for _ in range(5)]
    return statistics.median(rounds)


class Scale(nn.Module):
    """A block that does next to nothing: its input times one."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 1.0


def block_cost_us(calls: int, blocks: int = 8) -> float:
    """Microseconds ``blocks=`` adds per block call: a model of ``blocks`` blocks that do nothing, instrumented
    with its blocks against the same model instrumented alone."""
    alone = collector.instrument_model(nn.Sequential(*(Scale() for _ in range(blocks))))
    priced = nn.Sequential(*(Scale() for _ in range(blocks)))
    collector.instrument_model(priced, blocks=priced)
    x = torch.ones(1, requires_grad=True)

    def run(module: nn.Module) -> float:
        start = time.perf_counter()
        with collector.step():
            for _ in range(calls):
                module(x).sum().backward()
        return time.perf_counter() - start

    rounds = [(run(priced) - run(alone)) / (calls * blocks) * 1e6 for _ in range(5)]
    return statistics.median(rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    service = start_answer_only(Path(tempfile.mkdtemp(prefix="bubblescope-hooks-")))
    try:
        collector.init(url=service.url, run="hooks-overhead")
        control, control_total, _ = step_ratio(args, hooks=False)
        ratio, total, plain_ms = step_ratio(args)
        cost = hook_cost_us(2000)
        per_block = block_cost_us(500)
        collector.shutdown()
    finally:
        service.stop()
    print(f"MLP {args.layers}×{args.hidden}, batch {args.batch}: plain step {plain_ms:.2f} ms (forward + backward)")
    print(f"instrument_model / plain: median of step pairs {ratio:.4f}, ratio of totals {total:.4f}")
    print(f"plain / plain (control): median of step pairs {control:.4f}, ratio of totals {control_total:.4f}")
    print(f"hooks alone: {cost:.1f} µs per model call (forward and backward of the instrumented module)")
    print(f"blocks=: {per_block:.1f} µs more per block call (forward and backward of each block)")


if __name__ == "__main__":
    main()
