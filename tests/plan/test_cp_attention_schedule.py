"""``bench/gpu_cp_attention.py`` times one context-parallel rank's attention as torch schedules it. Here, on the CPU
(torch's CPU flash attention, the same calls), every rank's blocks, merged as the bench merges them, must give
whole causal attention's output, and the gradients each rank sends round the ring must sum to whole attention's:
the bench runs the blocks CP runs; and a rank adds its gradients to what arrives before sending them on. That it
runs torch's copies and casts too is read off torch 2.13's source (the bench follows
``_templated_ring_attention_backward`` buffer for buffer), not tested here. At cp 1 this checks the schedule of one
rank; the bench times plain attention there instead, as a run without CP calls it."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from tests.support import REPO

BENCH = REPO / "bench" / "gpu_cp_attention.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("gpu_cp_attention", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_every_ranks_blocks_merge_to_whole_causal_attention_forward_and_backward(cp: int) -> None:
    bench = load_bench()
    kernel = bench.KERNELS["cpu"]
    torch.manual_seed(cp)
    q, k, v, dout = (torch.randn(1, 2, 64 * cp, 16) for _ in range(4))
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    whole = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    whole.backward(dout)
    dk_sum = {src: torch.zeros(1, 2, 64, 16) for src in range(cp)}
    dv_sum = {src: torch.zeros(1, 2, 64, 16) for src in range(cp)}
    for rank in range(cp):
        mine = bench.rank_chunks(q.detach(), rank, cp)
        order = bench.ring_order(rank, cp)
        kv_by_step = [(bench.rank_chunks(k.detach(), src, cp), bench.rank_chunks(v.detach(), src, cp)) for src in order]
        out, lse, saved = bench.rank_forward(kernel, rank, mine, kv_by_step)
        torch.testing.assert_close(out, bench.rank_chunks(whole.detach(), rank, cp), atol=1e-5, rtol=1e-4)
        local = dk_sum[rank].numel()
        arrived = lambda: torch.zeros(2 * local)  # nothing yet: each send is this rank's own part
        grad_q, sent = bench.rank_backward(
            kernel, rank, mine, kv_by_step, out, lse, bench.rank_chunks(dout, rank, cp), saved, arrived
        )
        torch.testing.assert_close(grad_q, bench.rank_chunks(q.grad, rank, cp), atol=1e-5, rtol=1e-4)
        for src, packed in zip(order, sent, strict=True):
            dk_sum[src] += packed[:local].reshape(dk_sum[src].shape)
            dv_sum[src] += packed[local:].reshape(dv_sum[src].shape)
    for src in range(cp):  # the key and value gradients, summed round the ring, are whole attention's
        torch.testing.assert_close(dk_sum[src], bench.rank_chunks(k.grad, src, cp), atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(dv_sum[src], bench.rank_chunks(v.grad, src, cp), atol=1e-5, rtol=1e-4)


def test_a_rank_adds_its_key_and_value_gradients_to_what_arrives_and_sends_the_sum_on() -> None:
    """torch's backward adds a rank's key and value gradients into the buffer that arrived from the previous rank
    (half of it where the block took the first half of the keys) and sends that on: with a buffer R arriving at each
    step, what the rank sends is R plus what it sends when nothing has arrived (rank 1 of 4: both kinds of block)."""
    bench = load_bench()
    kernel, cp, rank = bench.KERNELS["cpu"], 4, 1
    torch.manual_seed(7)
    q, k, v, dout = (torch.randn(1, 2, 64 * cp, 16) for _ in range(4))
    mine, order = bench.rank_chunks(q, rank, cp), bench.ring_order(rank, cp)
    kv_by_step = [(bench.rank_chunks(k, src, cp), bench.rank_chunks(v, src, cp)) for src in order]
    out, lse, saved = bench.rank_forward(kernel, rank, mine, kv_by_step)
    size = 2 * kv_by_step[0][0].numel()
    arriving = torch.randn(size)

    def sends(arrived) -> list[torch.Tensor]:
        return bench.rank_backward(
            kernel, rank, mine, kv_by_step, out, lse, bench.rank_chunks(dout, rank, cp), saved, arrived
        )[1]

    own = sends(lambda: torch.zeros(size))
    summed = sends(lambda: arriving.clone())  # a fresh buffer each step, as a collective's output is
    torch.testing.assert_close(summed[0], own[0])  # step 0: the rank's own keys, nothing arrived yet
    for step in range(1, cp):
        torch.testing.assert_close(summed[step], arriving + own[step], atol=1e-5, rtol=1e-4)


def test_a_blocks_schedule_is_torchs_a_causal_square_then_half_squares() -> None:
    bench = load_bench()
    q, k, v = (torch.zeros(1, 1, 8, 4) for _ in range(3))
    shapes = [
        (
            i,
            rank,
            *(t.shape[2] for t in bench.block_inputs(i, rank, q, k, v)[:2]),
            bench.block_inputs(i, rank, q, k, v)[3],
        )
        for rank in (0, 3)
        for i in range(4)
    ]
    assert shapes == [
        (0, 0, 8, 8, False), (1, 0, 4, 8, True), (2, 0, 4, 8, True), (3, 0, 4, 8, True),
        (0, 3, 8, 8, False), (1, 3, 8, 4, False), (2, 3, 8, 4, False), (3, 3, 8, 4, False),
    ]  # fmt: skip


def test_the_bench_runs_on_the_cpu_and_prints_a_row_a_rank() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), "--device", "cpu", "--local", "128", "--heads", "2", "--cp", "1,2", "--repeats", "1"],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if re.match(r"cpu +\d", line)]
    assert [(r[1], r[2], r[3]) for r in rows] == [("1", "0", "128"), ("2", "0", "256"), ("2", "1", "256")]
    assert all(float(r[5]) > 0 and float(r[6]) > 0 for r in rows)
