"""Which fused attention each of torchtitan's attention backends runs on this GPU, and how fast, against
FlashAttention-2 and cuDNN forced through SDPA.

torchtitan 0.3.0 (``models/common/attention.py``, ``config_utils.get_attention_config``) trains a language model
with ``flex`` (the default: ``flex_attention`` compiled with max-autotune and coordinate-descent tuning, a block
mask, grouped keys and values; here one document a sequence, so a causal mask), ``flex_flash`` (the same on
FlexAttention's FLASH backend, Hopper and Blackwell) or ``varlen`` (``torch.nn.attention.varlen.varlen_attn``,
causal window (-1, 0)); its ``ScaledDotProductAttention`` (Flux, and a model a user writes on SDPA) calls
``F.scaled_dot_product_attention(..., enable_gqa=True)`` under ``sdpa_kernel([CUDNN_ATTENTION, FLASH_ATTENTION,
MATH], set_priority=True)``. The planner prices torchtitan's attention as FlashAttention-2 (``attention_kernel=
flash2``) unless this says otherwise. Each runs forward and backward at Llama 3 8B's heads (32 query, 8 key-value,
width 128); the SDPA call's kernels are named by torch.profiler. Needs a CUDA GPU and the package installed (its timer
is ``gpu_layer_step``'s).

    python bench/gpu_attention_backends.py
    python bench/gpu_attention_backends.py --shapes 32:8:8192 --only FLASH     # flex_flash alone
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from bench.gpu_layer_step import timed

TORCHTITAN_SDPA_PRIORITY = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]
#: torchtitan 0.3.0's ``FlexAttention.inductor_configs`` (less ``wrap_inductor_compiled_regions``, which only
#: matters inside a compiled model)
TORCHTITAN_FLEX_OPTIONS = {"max_autotune": True, "coordinate_descent_tuning": True, "triton.cudagraphs": False}


def sdpa_step(backends: list[SDPBackend], q, k, v, gqa: bool) -> Callable[[], None]:
    def step() -> None:
        with sdpa_kernel(backends, set_priority=True):
            F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa).sum().backward()

    return step


def flex_step(q, k, v, flash_backend: bool = False) -> Callable[[], None]:
    """torchtitan's ``flex`` (Triton), or with ``flash_backend`` its ``flex_flash`` (FlexAttention's FLASH backend,
    Hopper and Blackwell: blocks of 256 × 128, ``kernel_options={"BACKEND": "FLASH"}``). One document a sequence: a
    causal mask (torchtitan's document masks skip more blocks where a sequence packs several)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    seq = q.shape[2]
    block = {"BLOCK_SIZE": (256, 128)} if flash_backend else {}
    mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, seq, seq, device=q.device, **block)
    options = {"kernel_options": {"BACKEND": "FLASH"}} if flash_backend else {}
    compiled = torch.compile(flex_attention, options=TORCHTITAN_FLEX_OPTIONS)

    def step() -> None:
        compiled(q, k, v, block_mask=mask, enable_gqa=True, **options).sum().backward()

    return step


def varlen_step(q, k, v) -> Callable[[], None]:
    from torch.nn.attention.varlen import varlen_attn

    seq = q.shape[2]
    packed = [t.detach().transpose(1, 2).reshape(seq, t.shape[1], t.shape[3]).requires_grad_() for t in (q, k, v)]
    cu_seq = torch.tensor([0, seq], device=q.device, dtype=torch.int32)

    def step() -> None:
        varlen_attn(*packed, cu_seq, cu_seq, seq, seq, window_size=(-1, 0), enable_gqa=True).sum().backward()

    return step


def seconds(step: Callable[[], None], repeats: int = 5) -> float:
    """Median seconds of a forward and backward, after two warm-ups (compilation and autotuning in the first)."""
    step()
    step()
    return timed(step, "cuda", repeats)


def kernels_run(step: Callable[[], None]) -> list[str]:
    """The CUDA kernels whose names say attention (fmha, flash, cudnn, sdpa, attn), forward and backward."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        step()
        torch.cuda.synchronize()
    names = {e.key for e in profile.key_averages()}
    words = ("fmha", "flash", "cudnn", "sdpa", "attn", "triton_tem")
    return sorted(n[:70] for n in names if any(w in n.lower() for w in words))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="32:8:8192,32:8:32768", help="heads:kv_heads:seq, comma-separated")
    parser.add_argument(
        "--only",
        default="SDPA,varlen,flex",
        help="cases whose label holds one of these words (flex: autotuned, minutes)",
    )
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    for shape in args.shapes.split(","):
        heads, kv_heads, seq = (int(x) for x in shape.split(":"))
        run_shape(heads, kv_heads, seq, args.only.split(","))


def run_shape(heads: int, kv_heads: int, seq: int, only: list[str]) -> None:
    """Every backend's forward and backward at one shape, printed."""
    q, k, v = (
        torch.randn(1, n, seq, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for n in (heads, kv_heads, kv_heads)
    )
    kr, vr = (t.detach().repeat_interleave(heads // kv_heads, dim=1).requires_grad_() for t in (k, v))
    flops = 3.5 * 2.0 * seq * seq * 128 * heads  # causal: half of 4·s²·d, backward 2.5× the forward
    print(f"\n{heads} heads, {kv_heads} key-value heads, seq {seq}")
    titan = sdpa_step(TORCHTITAN_SDPA_PRIORITY, q, k, v, True)
    print("  torchtitan's SDPA call runs:", ", ".join(kernels_run(titan)) or "(none named)")
    cases: dict[str, Callable[[], Callable[[], None]]] = {
        "SDPA, torchtitan's priority (cuDNN > flash > math)": lambda: titan,
        "SDPA, cuDNN forced": lambda: sdpa_step([SDPBackend.CUDNN_ATTENTION], q, k, v, True),
        "SDPA, FlashAttention-2 forced": lambda: sdpa_step([SDPBackend.FLASH_ATTENTION], q, k, v, True),
        "SDPA, FlashAttention-2, keys and values repeated": lambda: sdpa_step(
            [SDPBackend.FLASH_ATTENTION], q, kr, vr, False
        ),
        "varlen_attn (torchtitan's varlen)": lambda: varlen_step(q, k, v),
        "flex_attention (torchtitan's flex, autotuned)": lambda: flex_step(q, k, v),
        "flex_attention, FLASH backend (torchtitan's flex_flash)": lambda: flex_step(q, k, v, flash_backend=True),
    }
    cases = {label: make for label, make in cases.items() if any(word in label for word in only)}
    for label, make in cases.items():
        try:
            took = seconds(make())
        except Exception as refused:  # noqa: BLE001 - a backend this torch or GPU lacks: say so, go on
            print(f"  {label:52} not run: {type(refused).__name__}: {str(refused).splitlines()[0][:90]}")
            continue
        print(f"  {label:52} {took * 1e3:8.2f} ms fwd+bwd  {flops / took / 1e12:6.1f} TFLOP/s", flush=True)


if __name__ == "__main__":
    main()
