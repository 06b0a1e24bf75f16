"""A Llama layer's forward and backward on this GPU, against what the planner prices it at.

A stack of Llama 3 transformer blocks written as torchtitan writes them (RMSNorm, rotary embeddings, grouped-query
attention through ``scaled_dot_product_attention``, SwiGLU; each block under its own ``torch.compile``), bf16
parameters, one micro-batch of the model's sequence: timed forward + backward per layer in bf16, and in FP8 with
torchao's ``convert_to_float8_training`` (tensor-wise dynamic scaling, torchtitan's default) when torchao is there.
Beside it ``step_time.layer_cost`` for the same layer on this GPU (``--gpu``: the planner's name, whose fitted
constants price it), forward and forward + backward. Needs a CUDA GPU.

    python bench/gpu_layer_step.py --preset llama-3-8b --gpu H200
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from bubblescope.analysis.planner.efficiencies import efficiencies_for
from bubblescope.analysis.planner.specs import ModelSpec, ParallelConfig, make_cluster, model_from
from bubblescope.analysis.planner.step_time import layer_cost


class Block(nn.Module):
    """One Llama 3 block: x + attention(norm(x)), then + SwiGLU(norm(·))."""

    def __init__(self, model: ModelSpec) -> None:
        super().__init__()
        h, d = model.hidden, model.head_dim
        self.heads, self.kv, self.d = model.heads, model.kv_heads, d
        self.attention_norm = nn.RMSNorm(h, eps=1e-5)
        self.wq = nn.Linear(h, model.heads * d, bias=False)
        self.wk = nn.Linear(h, model.kv_heads * d, bias=False)
        self.wv = nn.Linear(h, model.kv_heads * d, bias=False)
        self.wo = nn.Linear(model.heads * d, h, bias=False)
        self.ffn_norm = nn.RMSNorm(h, eps=1e-5)
        self.w1 = nn.Linear(h, model.ffn_hidden, bias=False)
        self.w3 = nn.Linear(h, model.ffn_hidden, bias=False)
        self.w2 = nn.Linear(model.ffn_hidden, h, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        y = self.attention_norm(x)
        q = self.wq(y).view(b, s, self.heads, self.d)
        k = self.wk(y).view(b, s, self.kv, self.d)
        v = self.wv(y).view(b, s, self.kv, self.d)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        repeats = self.heads // self.kv  # torchtitan repeats the key-value heads before the fused kernel
        k, v = k.repeat_interleave(repeats, dim=2), v.repeat_interleave(repeats, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(out.transpose(1, 2).reshape(b, s, -1))
        y = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(y)) * self.w3(y))


def rotate(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on (batch, seq, heads, head_dim), halves rotated."""
    first, second = t.chunk(2, dim=-1)
    return torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)


def layer_seconds(model: ModelSpec, layers: int, fp8: bool, device: str) -> tuple[float, float]:
    """Median seconds a layer, forward and forward + backward: one compiled block run ``layers`` times in a row (its
    weights shared: one compilation, the same kernels as distinct layers)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    blocks = nn.ModuleList([Block(model)]).to(device, torch.bfloat16)
    if fp8:
        from torchao.float8 import convert_to_float8_training

        convert_to_float8_training(blocks)
    compiled = [torch.compile(blocks[0])] * layers
    s, half = model.seq, model.head_dim // 2
    angles = torch.outer(torch.arange(s, device=device), 1e-4 ** (torch.arange(half, device=device) / half))
    cos, sin = (f(angles)[None, :, None, :].to(torch.bfloat16) for f in (torch.cos, torch.sin))
    x = torch.randn(1, s, model.hidden, device=device, dtype=torch.bfloat16, requires_grad=True)

    def forward() -> torch.Tensor:
        y = x
        for block in compiled:
            y = block(y, cos, sin)
        return y

    def step() -> None:
        forward().sum().backward()

    for _ in range(3):
        step()
    return timed(forward, device) / layers, timed(step, device) / layers


def timed(run: Callable[[], object], device: str, repeats: int = 7) -> float:
    """Median seconds of ``repeats`` calls: CUDA events on a GPU, the host clock elsewhere."""
    samples = []
    for _ in range(repeats):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        else:
            began = time.perf_counter()
            run()
            samples.append(time.perf_counter() - began)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="llama-3-8b")
    parser.add_argument("--seq", type=int, default=0, help="default: the preset's")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--gpu", default="H200", help="the planner's name for this GPU")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    model = model_from(args.preset)
    model = replace(model, seq=args.seq or model.seq)
    cluster = make_cluster(args.gpu, 8, 8)
    eff = efficiencies_for(args.gpu)
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else args.device
    print(f"{name}, torch {torch.__version__}; {args.preset} at seq {model.seq}, {args.layers} blocks, micro-batch 1")
    print(f"{'precision':10} {'measured fwd':>13} {'fwd+bwd':>9} | {'planner fwd':>12} {'fwd+bwd':>9} {'ratio':>6}")
    for precision in ("bf16", "fp8"):
        try:
            forward, both = layer_seconds(model, args.layers, precision == "fp8", args.device)
        except Exception as failed:  # noqa: BLE001 - torchao missing, or FP8 on a GPU without it
            print(f"{precision:10} not run: {str(failed).splitlines()[0][:100]}")
            continue
        # the block's wq, wk, wv and w1, w3 are its own linears, as torchtitan wrote them before fuse_qkv
        cfg = ParallelConfig(dp=8, mbs=1, flash_attention=True, precision=precision, projections="separate")
        cost = layer_cost(model, cluster, cfg, eff)
        print(
            f"{precision:10} {forward * 1e3:10.2f} ms {both * 1e3:6.2f} ms | {cost.forward * 1e3:9.2f} ms "
            f"{cost.seconds * 1e3:6.2f} ms {cost.seconds / both:6.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
