"""One context-parallel rank's attention on this GPU, as torch schedules it, against what the planner prices it at.

torch's context parallelism (``_templated_ring_attention`` and its backward, load-balanced round robin: rank r of c
holds chunks r and 2c-1-r of the sequence) runs, on each rank, one causal block over its own L = s/c tokens, then
c-1 blocks against the other ranks' keys and values, each half a square and unmasked (all of the queries against the
first half of the keys, or the second half of the queries against all of the keys), and merges the blocks' outputs
by their log-sum-exp in fp32; the backward runs the same blocks and sums the gradients in fp32. This bench runs
those kernel calls, merges, packs and casts, buffer for buffer, on one GPU, without the communication (which one GPU
cannot time; what it would deliver is stood in for by buffers of its size), and at cp 1 plain attention, for
Llama 3 8B's heads (keys and values repeated to every head, as torchtitan's Llama did) at 32k tokens a rank, cp 1,
2, 4 and 8: the compute of torchtitan's long-sequence rows (Table 2: 32k, 64k, 128k and 256k tokens on 8 GPUs).
Beside each, ``step_time.attention_seconds`` for the same rank on this GPU (``--gpu``: the planner's name).

    python bench/gpu_cp_attention.py --gpu H200 --csv out.csv        # needs a CUDA GPU
    python bench/gpu_cp_attention.py --device cpu --local 256 --heads 2   # the same code on the CPU, tiny
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
import torch.nn.functional as F

from bench.gpu_layer_step import timed
from bubblescope.analysis.planner.efficiencies import efficiencies_for
from bubblescope.analysis.planner.specs import ParallelConfig, gpu_from, model_from
from bubblescope.analysis.planner.step_time import attention_seconds

Tensor = torch.Tensor


@dataclass(frozen=True)
class Kernel:
    """A fused attention's forward ``(q, k, v, causal) -> (out, lse, saved)`` and backward
    ``(dout, q, k, v, out, lse, saved, causal) -> (dq, dk, dv)``, as torch's CP calls the aten ops."""

    name: str
    forward: Callable[[Tensor, Tensor, Tensor, bool], tuple[Tensor, Tensor, tuple]]
    backward: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, tuple, bool], tuple[Tensor, Tensor, Tensor]]


def _flash_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> tuple[Tensor, Tensor, tuple]:
    out, lse, cq, ck, mq, mk, seed, offset, _ = torch.ops.aten._scaled_dot_product_flash_attention(
        q, k, v, 0.0, causal, False
    )
    return out, lse, (cq, ck, mq, mk, seed, offset)


def _flash_backward(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, saved: tuple, causal: bool
) -> tuple[Tensor, Tensor, Tensor]:
    cq, ck, mq, mk, seed, offset = saved
    return torch.ops.aten._scaled_dot_product_flash_attention_backward(
        dout, q, k, v, out, lse, cq, ck, mq, mk, 0.0, causal, seed, offset
    )


def _cudnn_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> tuple[Tensor, Tensor, tuple]:
    out, lse, cq, ck, mq, mk, seed, offset, _ = torch.ops.aten._scaled_dot_product_cudnn_attention(
        q, k, v, None, True, 0.0, causal, False
    )
    return out, lse, (cq, ck, mq, mk, seed, offset)


def _cudnn_backward(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, saved: tuple, causal: bool
) -> tuple[Tensor, Tensor, Tensor]:
    cq, ck, mq, mk, seed, offset = saved
    return torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
        dout, q, k, v, out, lse, seed, offset, None, cq, ck, mq, mk, 0.0, causal
    )


def _cpu_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool) -> tuple[Tensor, Tensor, tuple]:
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)
    return out, lse, ()


def _cpu_backward(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, saved: tuple, causal: bool
) -> tuple[Tensor, Tensor, Tensor]:
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(dout, q, k, v, out, lse, 0.0, causal)


KERNELS = {
    "flash2": Kernel("flash2", _flash_forward, _flash_backward),  # torch's FlashAttention-2 (the planner's flash2)
    "cudnn": Kernel("cudnn", _cudnn_forward, _cudnn_backward),
    "cpu": Kernel("cpu", _cpu_forward, _cpu_backward),
}


def rank_chunks(x: Tensor, rank: int, cp: int) -> Tensor:
    """Rank ``rank``'s load-balanced share of a (batch, heads, seq, dim) tensor: chunks rank and 2·cp-1-rank."""
    chunks = x.chunk(2 * cp, dim=2)
    return torch.cat([chunks[rank], chunks[2 * cp - 1 - rank]], dim=2)


def block_inputs(i: int, rank: int, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor, bool]:
    """Step i's block (torch's ``if / elif / else``): the whole local square, causal, at i = 0; all queries against
    the first half of the keys where i <= rank; else the second half of the queries against all keys (partial)."""
    if i == 0:
        return q, k, v, False
    if i <= rank:
        return q, k.chunk(2, dim=2)[0], v.chunk(2, dim=2)[0], False
    return q.chunk(2, dim=2)[1], k, v, True


def _merge(out: Tensor, lse: Tensor, block_out: Tensor, block_lse: Tensor) -> tuple[Tensor, Tensor]:
    """torch's ``_SDPAMerger._merge_one``: outputs weighted by their log-sum-exps, in fp32."""
    return out - F.sigmoid(block_lse - lse) * (out - block_out), lse - F.logsigmoid(lse - block_lse)


def rank_forward(
    kernel: Kernel, rank: int, q: Tensor, kv_by_step: list[tuple[Tensor, Tensor]]
) -> tuple[Tensor, Tensor, list[tuple]]:
    """One rank's forward: its queries ``q`` against step i's keys and values (``kv_by_step[i]``, the ring's order:
    rank - i's), blocks merged as torch merges them (``convert_to_f32``). Returns out (q's dtype), lse, and what the
    backward needs of each block."""
    out = lse = None
    saved = []
    squeeze = False  # FlashAttention's log-sum-exp has no last dimension, cuDNN's keeps one
    for i, (k, v) in enumerate(kv_by_step):
        if i < len(kv_by_step) - 1:  # torch packs the keys and values to send on
            torch.cat([k.flatten(), v.flatten()])
        bq, bk, bv, partial = block_inputs(i, rank, q, k, v)
        block_out, block_lse, kept = kernel.forward(bq, bk, bv, i == 0)
        saved.append(kept)
        squeeze = block_lse.dim() < block_out.dim()
        block_out, block_lse = block_out.float(), block_lse.float().reshape(*block_out.shape[:-1], 1)
        if out is None:
            out, lse = block_out, block_lse
        elif partial:
            half_out, half_lse = _merge(out.chunk(2, dim=2)[1], lse.chunk(2, dim=2)[1], block_out, block_lse)
            out = torch.cat([out.chunk(2, dim=2)[0], half_out], dim=2)
            lse = torch.cat([lse.chunk(2, dim=2)[0], half_lse], dim=2)
        else:
            out, lse = _merge(out, lse, block_out, block_lse)
    return out.to(q.dtype), lse.squeeze(-1) if squeeze else lse, saved


def _partial_add(original: Tensor, new: Tensor, idx: int) -> Tensor:
    """torch's ``_partial_update(..., n_chunks=2, add=True)``: ``new`` added to one half, the halves concatenated."""
    halves = list(original.chunk(2, dim=2))
    halves[idx] += new
    return torch.cat(halves, dim=2)


def rank_backward(
    kernel: Kernel,
    rank: int,
    q: Tensor,
    kv_by_step: list[tuple[Tensor, Tensor]],
    out: Tensor,
    lse: Tensor,
    dout: Tensor,
    saved: list[tuple],
    arrived: Callable[[], Tensor],
) -> tuple[Tensor, list[Tensor]]:
    """One rank's backward, buffer for buffer as torch's ``_templated_ring_attention_backward`` runs it: the same
    blocks' gradients, the queries' summed in fp32 (a half at a time by torch's ``_partial_update`` where the block
    took half of them), the keys' and values' added into the fp32 buffer that arrived from the previous rank
    (``arrived()`` stands in for it: the communication is not run) and packed to send on, and the casts back at the
    end. Returns the queries' gradient and what the rank sends at each step: with ``arrived`` giving zeros, its own
    contribution to the gradients of step i's keys and values (K then V, flattened)."""
    grad_q = torch.zeros_like(q, dtype=torch.float32)
    k0, v0 = kv_by_step[0]
    grad_k, grad_v = torch.zeros_like(k0, dtype=torch.float32), torch.zeros_like(v0, dtype=torch.float32)
    sent = []
    for i, (k, v) in enumerate(kv_by_step):
        if i != len(kv_by_step) - 1:  # torch packs the keys and values to send on
            torch.cat([k.flatten(), v.flatten()])
        bq, bk, bv, partial = block_inputs(i, rank, q, k, v)
        if partial:
            b_out, b_dout = out.chunk(2, dim=2)[1], dout.chunk(2, dim=2)[1]
            b_lse = lse.chunk(2, dim=2)[1].contiguous()
        else:
            b_out, b_dout, b_lse = out, dout, lse
        dq, dk, dv = kernel.backward(b_dout, bq, bk, bv, b_out, b_lse, saved[i], i == 0)
        if i == 0:
            grad_k += dk
            grad_v += dv
        else:
            buffer = arrived()
            grad_k, grad_v = buffer[: k.numel()].reshape(k.shape), buffer[k.numel() :].reshape(v.shape)
            if i <= rank:  # the first half of the keys
                grad_k, grad_v = _partial_add(grad_k, dk, 0), _partial_add(grad_v, dv, 0)
            else:
                grad_k += dk
                grad_v += dv
        sent.append(torch.cat([grad_k.flatten(), grad_v.flatten()]))
        if partial:  # the second half of the queries
            grad_q = _partial_add(grad_q, dq, 1)
        else:
            grad_q += dq
    arrived().to(k0.dtype)  # the rank's own gradients, back round the ring, cast to the keys' dtype
    return grad_q.to(q.dtype), sent


def ring_order(rank: int, cp: int) -> list[int]:
    """The rank whose keys and values rank ``rank`` holds at each step: its own, then rank - 1, rank - 2, ..."""
    return [(rank - i) % cp for i in range(cp)]


def time_rank(kernel: Kernel, rank: int, cp: int, local: int, heads: int, dim: int, device: str, repeats: int):
    """Seconds of one rank's forward and backward at ``local`` tokens a rank (other ranks' keys and values, and the
    gradient buffers that arrive from them, stood in for by tensors of the same shape: the kernels' time does not
    depend on their values). At cp 1, plain attention: one causal block, no merge, as a run without CP calls it."""
    shape = (1, heads, local, dim)
    q, k, v, dout = (torch.randn(shape, device=device, dtype=torch.bfloat16) for _ in range(4))
    if cp == 1:
        out, lse, kept = kernel.forward(q, k, v, True)  # also the warm-up
        kernel.backward(dout, q, k, v, out, lse, kept, True)
        forward = timed(lambda: kernel.forward(q, k, v, True), device, repeats)
        backward = timed(lambda: kernel.backward(dout, q, k, v, out, lse, kept, True), device, repeats)
        return forward, backward
    kv_by_step = [(k, v)] * cp
    out, lse, saved = rank_forward(kernel, rank, q, kv_by_step)  # also the forward's warm-up
    size = 2 * k.numel()

    def arrived() -> Tensor:  # the buffer NCCL would write, unfilled
        return torch.empty(size, device=device, dtype=torch.float32)

    rank_backward(kernel, rank, q, kv_by_step, out, lse, dout, saved, arrived)  # the backward's warm-up
    forward = timed(lambda: rank_forward(kernel, rank, q, kv_by_step), device, repeats)
    backward = timed(
        lambda: rank_backward(kernel, rank, q, kv_by_step, out, lse, dout, saved, arrived), device, repeats
    )
    return forward, backward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="llama-3-8b", help="the planner's model (its heads and head width)")
    parser.add_argument("--local", type=int, default=32768, help="tokens a rank")
    parser.add_argument("--heads", type=int, default=0, help="default: the preset's")
    parser.add_argument("--cp", default="1,2,4,8")
    parser.add_argument("--kernels", default="flash2,cudnn")
    parser.add_argument("--gpu", default="", help="the planner's name for this GPU; default: torch's name for it")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--csv", type=Path, help="write the figures here too")
    args = parser.parse_args()
    model = model_from(args.preset)
    heads = args.heads or model.heads
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else args.device
    gpu = gpu_from(args.gpu or (name if args.device == "cuda" else "H200"), "--gpu")  # the catalog knows torch's names
    eff = efficiencies_for(gpu)
    kernels = ["cpu"] if args.device == "cpu" else args.kernels.split(",")
    print(
        f"{name} (priced as {gpu.name}), torch {torch.__version__}; {args.preset}: {heads} heads of {model.head_dim}, {args.local} tokens a rank"
    )
    print(
        f"{'kernel':7} {'cp':>3} {'rank':>4} {'seq':>7} | {'fwd ms':>8} {'bwd ms':>8} {'TFLOP/s':>8} | planner fwd, bwd ms, measured/planner"
    )
    rows = []
    for kernel_name in kernels:
        for cp in (int(c) for c in args.cp.split(",")):
            seq = args.local * cp
            for rank in sorted({0, cp - 1}):
                forward, backward = time_rank(
                    KERNELS[kernel_name], rank, cp, args.local, heads, model.head_dim, args.device, args.repeats
                )
                flops = 2.0 * args.local * seq * model.head_dim * heads  # half of 4·q·s·d: causal, load-balanced
                cfg = ParallelConfig(
                    tp=1,
                    pp=1,
                    dp=1,
                    cp=cp,
                    mbs=1,
                    flash_attention=True,
                    attention_kernel="flash2" if kernel_name == "flash2" else "cudnn",
                )
                priced_f, priced_b = attention_seconds(replace(model, seq=seq), cfg, gpu, eff, args.local, heads)
                print(
                    f"{kernel_name:7} {cp:3} {rank:4} {seq:7} | {forward * 1e3:8.2f} {backward * 1e3:8.2f} "
                    f"{flops / forward / 1e12:8.1f} | {priced_f * 1e3:8.2f} {priced_b * 1e3:8.2f} "
                    f"{(forward + backward) / (priced_f + priced_b):6.3f}",
                    flush=True,
                )
                rows.append(
                    {
                        "kernel": kernel_name,
                        "cp": cp,
                        "rank": rank,
                        "seq": seq,
                        "local": args.local,
                        "heads": heads,
                        "head_dim": model.head_dim,
                        "forward_ms": round(forward * 1e3, 3),
                        "backward_ms": round(backward * 1e3, 3),
                    }
                )
    if args.csv:
        with args.csv.open("w", newline="") as out:
            writer = csv.DictWriter(out, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
