"""What each published run's GEMMs and fused attention reach on this GPU, beside the planner's constants.

For every calibration row of an H100-class GPU (``calibration.published_rows``), a layer's linear GEMMs as the planner
prices them (``step_time.linear_shapes``: QKV, projection, the MLP's two, at the row's micro-batch, sequence share and
TP degree; wq, wk, wv and w1, w3 each its own GEMM where the row runs them apart, ``step_time.projection_shares``: a TP 8
rank's wk of Llama 3 is 128 columns wide) are timed forward and backward (input and weight gradients: three products
of the same FLOPs), in bf16, and in FP8 (``torch._scaled_mm``, tensor-wise scales) where the row ran FP8; and causal
flash attention (``scaled_dot_product_attention``) at the row's heads per GPU, head width and sequence share, forward
and forward + backward. Each is printed as the fraction of this GPU's peak (the planner's ``GpuSpec`` for ``--gpu``)
that the planner's own FLOP count reaches, so it reads directly against the fitted ``gemm`` and ``attention``
constants, and the GEMMs also as measured over planned seconds (``step_time.gemm_seconds``' roofline with this GPU's
own constants, the backward at twice the forward as ``layer_cost`` charges it): above 1 where the planner prices a
shape faster than it runs. A grid of GEMM shapes follows, for a shape
model. Needs a CUDA GPU; the figures go to stdout and, with ``--json``, to a file.

    python bench/gpu_kernel_efficiency.py --gpu H200 --json $OUT/kernels.json
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from bubblescope.analysis.planner import calibration
from bubblescope.analysis.planner.efficiencies import efficiencies_for
from bubblescope.analysis.planner.specs import GpuSpec, ModelSpec, ParallelConfig, make_cluster
from bubblescope.analysis.planner.step_time import (
    HOPPER,
    fp8_cast_seconds,
    gemm_seconds as planned_gemm_seconds,
    linear_gemms,
    linear_peak_tflops,
)


def seconds(run: Callable[[], object], budget_s: float = 0.05) -> float:
    """Median seconds of one call: three warm-ups, then enough back-to-back calls between two events to fill
    ``budget_s``, five times."""
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    end.record()
    end.synchronize()
    reps = max(1, min(200, int(budget_s / max(start.elapsed_time(end) / 1e3, 1e-6))))
    samples = []
    for _ in range(5):
        start.record()
        for _ in range(reps):
            run()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / reps)
    return statistics.median(samples)


@functools.cache
def gemm_seconds(m: int, k: int, n: int, fp8: bool) -> float:
    """One (m×k)·(k×n) product: bf16 with torch.matmul, or e4m3 with ``torch._scaled_mm`` (its second operand
    column-major, as cuBLASLt's FP8 kernels need)."""
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    if not fp8:
        bt = b.t()
        return seconds(lambda: torch.matmul(a, bt))
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t()
    one = torch.ones((), device="cuda")
    return seconds(lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))


def layer_gemms(m: int, k: int, n: int, fp8: bool) -> float:
    """Forward, input gradient and weight gradient of one linear GEMM: (m,k,n), (m,n,k), (k,m,n)."""
    return gemm_seconds(m, k, n, fp8) + gemm_seconds(m, n, k, fp8) + gemm_seconds(k, m, n, fp8)


@functools.cache
def attention_seconds(batch: int, heads: int, seq: int, head_dim: int, backend: SDPBackend) -> tuple[float, float]:
    """Causal fused attention at ``seq`` queries and keys: forward, and forward + backward."""
    shape = (batch, heads, seq, head_dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    grad = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    with sdpa_kernel(backend):
        forward = seconds(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))

        def both() -> None:
            F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)

        return forward, seconds(both)


def row_layer(row: dict[str, str]) -> tuple[ModelSpec, ParallelConfig, int, tuple[tuple[int, int, int], ...]]:
    """A published row's model, configuration, queries a GPU holds (sequence over CP) and its layer's linear GEMMs
    (rows, depth, width) at the row's micro-batch, as the planner prices them (``step_time.linear_gemms``)."""
    model, cfg = calibration.row_model(row), calibration.row_config(row)
    local = model.seq // cfg.cp
    gemms = linear_gemms(model, cfg, cfg.mbs * local)
    shapes = tuple((int(r), int(k), round(n)) for parts in gemms for r, k, n in parts)
    return model, cfg, local, shapes


def planned_layer_seconds(shapes: tuple[tuple[int, int, int], ...], gpu: GpuSpec, precision: str) -> float:
    """What the planner charges for these GEMMs on ``gpu`` with its own constants: each forward on the roofline
    (``step_time.gemm_seconds``), its backward twice that (``layer_cost``)."""
    eff, peak = efficiencies_for(gpu), linear_peak_tflops(gpu, precision)
    return sum(3.0 * planned_gemm_seconds(r, n, k, gpu, eff, peak_tflops=peak) for r, k, n in shapes)


def row_figures(row: dict[str, str], gpu: GpuSpec) -> dict[str, object]:
    model, cfg, local, shapes = row_layer(row)
    peak_bf16, peak_fp8 = gpu.peak_tflops, gpu.fp8_tflops
    fp8 = cfg.precision == "fp8"
    flops = sum(6.0 * r * k * n for r, k, n in shapes)
    bf16_s = sum(layer_gemms(r, k, n, False) for r, k, n in shapes)
    figures: dict[str, object] = {
        "model": row["model"],
        "gpu": row["gpu"],
        "shapes": shapes,
        "gemm_bf16": flops / bf16_s / (peak_bf16 * 1e12),
        "gemm_bf16_over_planned": bf16_s / planned_layer_seconds(shapes, gpu, "bf16"),
    }
    if fp8:
        fp8_s = sum(layer_gemms(r, k, n, True) for r, k, n in shapes)
        figures["gemm_fp8"] = flops / fp8_s / (peak_fp8 * 1e12)
        figures["gemm_fp8_over_planned"] = fp8_s / planned_layer_seconds(shapes, gpu, "fp8")
    heads = model.heads // cfg.tp
    attention_flops = 2.0 * local * local * model.head_dim * heads * cfg.mbs  # the planner's causal count, forward
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        try:
            forward, both = attention_seconds(cfg.mbs, heads, local, model.head_dim, backend)
        except RuntimeError as refused:  # a backend this torch or GPU lacks
            figures[f"attention_{name}"] = f"not run: {str(refused).splitlines()[0][:80]}"
            continue
        figures[f"attention_{name}"] = [
            attention_flops / forward / (peak_bf16 * 1e12),
            3.5 * attention_flops / both / (peak_bf16 * 1e12),
        ]
    return figures


def grid(peak_bf16: float) -> list[dict[str, object]]:
    """bf16 GEMM efficiency over a grid of shapes (rows × depth × width)."""
    out = []
    for m in (2048, 4096, 8192, 16384):
        for k in (1024, 2048, 4096, 8192, 16384):
            for n in (512, 1024, 2048, 4096, 8192, 16384):
                out.append(
                    {"m": m, "k": k, "n": n, "eff": 2.0 * m * k * n / gemm_seconds(m, k, n, False) / peak_bf16 / 1e12}
                )
    return out


def fp8_layer_seconds(m: int, k: int, n: int) -> tuple[float, float]:
    """Forward + backward of one bias-free linear layer: bf16 ``nn.Linear`` (eager: its three GEMMs), and the same
    converted by torchao's ``convert_to_float8_training`` (tensor-wise dynamic scaling, torchtitan's default) under
    ``torch.compile`` (the casts fused within the layer, not into the op before it)."""
    from torchao.float8 import convert_to_float8_training

    torch._dynamo.reset()  # each shape compiles afresh: past dynamo's recompile limit it would run eager
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    plain = torch.nn.Sequential(torch.nn.Linear(k, n, bias=False)).to("cuda", torch.bfloat16)
    converted = convert_to_float8_training(
        torch.nn.Sequential(torch.nn.Linear(k, n, bias=False)).to("cuda", torch.bfloat16)
    )
    compiled = torch.compile(converted)
    return seconds(lambda: plain(x).backward(grad)), seconds(lambda: compiled(x).backward(grad))


def fp8_layers(rows: list[dict[str, str]], gpu_name: str, budget_s: float, skip: int = 0) -> list[dict[str, object]]:
    """Each distinct FP8 torchtitan layer: its linears (``row_layer``) in bf16 and in torchao FP8, beside the FP8 GEMMs alone
    (``torch._scaled_mm``) and what the planner charges for the casts (``step_time.fp8_cast_seconds``) on this GPU."""
    import time

    gpu = make_cluster(gpu_name, 8, 8).gpu
    hbm = gpu.hbm_gbps * 1e9 * efficiencies_for(gpu_name).hbm
    began, out, seen = time.monotonic(), [], set()
    for row in rows:
        model, cfg, local, shapes = row_layer(row)
        if cfg.precision != "fp8" or not row["source"].startswith("torchtitan") or shapes in seen:
            continue
        if time.monotonic() - began > budget_s:
            print(f"fp8 layers: stopped at {budget_s:.0f} s, before {row['model']}")
            break
        seen.add(shapes)
        if len(seen) <= skip:
            continue
        layers = [fp8_layer_seconds(r, k, n) for r, k, n in shapes]
        bf16_s, fp8_s = sum(b for b, _ in layers), sum(f for _, f in layers)
        gemms_s = sum(layer_gemms(r, k, n, True) for r, k, n in shapes)
        planned = sum(fp8_cast_seconds(model, cfg, hbm, cfg.mbs * local))
        out.append(
            {
                "model": row["model"],
                "shapes": shapes,
                "bf16_layers_s": bf16_s,
                "fp8_layers_s": fp8_s,
                "fp8_gemms_s": gemms_s,
                "planner_casts_s": planned,
            }
        )
        print(
            f"fp8 layers {row['model'][:40]:40} bf16 {bf16_s * 1e3:7.2f} ms  fp8 {fp8_s * 1e3:7.2f} ms "
            f"({bf16_s / fp8_s:.2f}x)  fp8 GEMMs alone {gemms_s * 1e3:7.2f} ms  casts measured "
            f"{(fp8_s - gemms_s) * 1e3:6.2f} ms, planner {planned * 1e3:6.2f} ms",
            flush=True,
        )
    return out


def pair(figures: dict[str, object], key: str) -> str:
    value = figures.get(key)
    return f"{value[0]:.2f}/{value[1]:.2f}" if isinstance(value, list) else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", default="H200", help="the planner's name for this GPU (its peaks)")
    parser.add_argument("--json", help="write every figure here too")
    parser.add_argument("--no-grid", action="store_true")
    parser.add_argument("--skip-rows", type=int, default=0, help="only the FP8 layers, past this many distinct ones")
    parser.add_argument(
        "--fp8-layers",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="also time torchtitan's FP8 linear layers with torchao (needs torchao), for at most this long",
    )
    args = parser.parse_args()
    gpu = make_cluster(args.gpu, 8, 8).gpu
    print(
        f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}; peaks from the planner's {gpu.name}: "
        f"bf16 {gpu.peak_tflops:.0f}, fp8 {gpu.fp8_tflops:.0f} TFLOP/s"
    )
    rows = [
        r for r in calibration.published_rows(calibration.PUBLISHED_RUNS_H100) if r["gpu"].upper().startswith(HOPPER)
    ]
    if args.skip_rows:
        fp8_layers(rows, args.gpu, args.fp8_layers, args.skip_rows)
        return
    results = []
    print(
        f"{'row':52} {'gpu':12} {'fit gemm':>8} {'bf16':>6} {'fp8':>6} {'/plan':>11} {'fit attn':>8} "
        f"{'flash f/fb':>11} {'cudnn f/fb':>11}"
    )
    for row in rows:
        fig = row_figures(row, gpu)
        fit = efficiencies_for(row["gpu"])
        fig["fit_gemm"], fig["fit_attention"] = fit.gemm, fit.attention
        results.append(fig)

        fp8 = f"{fig['gemm_fp8']:.2f}" if "gemm_fp8" in fig else "-"
        planned = "/".join(
            f"{fig[key]:.2f}" for key in ("gemm_bf16_over_planned", "gemm_fp8_over_planned") if key in fig
        )
        print(
            f"{row['model'][:52]:52} {row['gpu'][:12]:12} {fit.gemm:8.2f} {fig['gemm_bf16']:6.2f} {fp8:>6} "
            f"{planned:>11} {fit.attention:8.2f} {pair(fig, 'attention_flash'):>11} {pair(fig, 'attention_cudnn'):>11}",
            flush=True,
        )
    layers = fp8_layers(rows, args.gpu, args.fp8_layers) if args.fp8_layers else []
    shapes = [] if args.no_grid else grid(gpu.peak_tflops)
    for cell in shapes:
        print(f"grid m={cell['m']} k={cell['k']} n={cell['n']} eff={cell['eff']:.3f}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(
                {
                    "device": torch.cuda.get_device_name(0),
                    "torch": torch.__version__,
                    "rows": results,
                    "fp8_layers": layers,
                    "grid": shapes,
                },
                out,
            )


if __name__ == "__main__":
    main()
