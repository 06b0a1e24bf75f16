"""Which fused attention torchtitan's SDPA call runs on this GPU, and how fast, against each backend forced.

torchtitan 0.3.0 (``models/common/attention.py``, ``ScaledDotProductAttention``) calls
``F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)`` under
``sdpa_kernel([CUDNN_ATTENTION, FLASH_ATTENTION, MATH], set_priority=True)``, its keys and values no longer repeated
to every head. The planner prices it as FlashAttention-2 (``attention_kernel=flash2``) unless this says otherwise.
Here: that call, forward and backward, its kernels named by torch.profiler, beside cuDNN and FlashAttention forced
(grouped keys and values) and FlashAttention with the keys and values repeated (torchtitan before 2026-01-27). Needs
a CUDA GPU; imports nothing but torch.

    python bench/gpu_sdpa_backend.py
"""

from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

TORCHTITAN_PRIORITY = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]


def attention_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gqa: bool) -> None:
    F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa).sum().backward()


def seconds(backends: list[SDPBackend], q, k, v, gqa: bool, repeats: int = 5) -> float:
    """Median seconds of a forward and backward under ``backends`` (in that priority)."""
    with sdpa_kernel(backends, set_priority=True):
        attention_step(q, k, v, gqa)
        samples = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            attention_step(q, k, v, gqa)
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
    return statistics.median(samples)


def kernels_run(backends: list[SDPBackend], q, k, v, gqa: bool) -> list[str]:
    """The CUDA kernels whose names say attention (fmha, flash, cudnn, sdpa), forward and backward."""
    with (
        sdpa_kernel(backends, set_priority=True),
        torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile,
    ):
        attention_step(q, k, v, gqa)
        torch.cuda.synchronize()
    names = {e.key for e in profile.key_averages()}
    return sorted(n[:70] for n in names if any(w in n.lower() for w in ("fmha", "flash", "cudnn", "sdpa", "attn")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shapes", default="32:8:8192,64:8:8192,32:8:32768", help="heads:kv_heads:seq, comma-separated"
    )
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    for shape in args.shapes.split(","):
        heads, kv_heads, seq = (int(x) for x in shape.split(":"))
        q, k, v = (
            torch.randn(1, n, seq, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for n in (heads, kv_heads, kv_heads)
        )
        kr, vr = (t.detach().repeat_interleave(heads // kv_heads, dim=1).requires_grad_() for t in (k, v))
        flops = 3.5 * 2.0 * seq * seq * 128 * heads  # causal: half of 4·s²·d, backward 2.5× the forward
        print(f"\n{heads} heads, {kv_heads} key-value heads, seq {seq}")
        print("  torchtitan's call runs:", ", ".join(kernels_run(TORCHTITAN_PRIORITY, q, k, v, True)) or "(none named)")
        cases = {
            "torchtitan's call (cuDNN > flash > math, grouped)": (TORCHTITAN_PRIORITY, q, k, v, True),
            "cuDNN forced, grouped": ([SDPBackend.CUDNN_ATTENTION], q, k, v, True),
            "FlashAttention-2 forced, grouped": ([SDPBackend.FLASH_ATTENTION], q, k, v, True),
            "FlashAttention-2, keys and values repeated": ([SDPBackend.FLASH_ATTENTION], q, kr, vr, False),
            "cuDNN, keys and values repeated": ([SDPBackend.CUDNN_ATTENTION], q, kr, vr, False),
        }
        for label, (backends, *tensors, gqa) in cases.items():
            try:
                took = seconds(backends, *tensors, gqa)
            except RuntimeError as refused:
                print(f"  {label:52} not run: {str(refused).splitlines()[0][:90]}")
                continue
            print(f"  {label:52} {took * 1e3:8.2f} ms fwd+bwd  {flops / took / 1e12:6.1f} TFLOP/s")


if __name__ == "__main__":
    main()
