"""The planner's tuned constants: the defaults, chosen on the A100 rows, and the constants fitted on each newer GPU's
published runs (``data/efficiencies.csv``, written by ``python bench/planner_calibration.py --write-efficiencies``).

A GPU prices with its own constants where the repository holds at least ``MIN_ROWS`` published runs on it (H100 SXM:
Megatron-LM's README table and Megatron-Bridge's; torchtitan's 500 W HBM2e H100); the H200 with the H100 SXM's
(``calibration.PRICED_AS``: Trainy's two H200 runs are then a test of constants never fitted on them); every other GPU
(the A100s, H100 PCIe, the B200 with its two runs, and a GPU a request describes itself) with the defaults, chosen on
18 A100 runs. Several fitted values sit at an end of the grid (``calibration.GRID_EVERY_ROW``): boundary fits,
docs/planner.md. Left out per GPU in turn, every published row reads within the figures ``docs/planner.md`` gives
(``bench/planner_calibration.py``, "constants per GPU").
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, replace
from pathlib import Path

from bubblescope.analysis.planner.specs import GPU_CATALOG, GpuSpec


@dataclass(frozen=True)
class Efficiencies:
    """The planner's only tuned constants, the same for every model; these are the defaults (a GPU with published runs
    prices with its own fit of some of them, ``efficiencies_for``).

    Chosen by a coarse grid search over physically plausible ranges against the 18 published runs
    (``calibration``; in-sample, so the errors reported there are fit errors), then kept if they
    stay in those ranges:

    gemm 0.74: fraction of peak a bf16 GEMM of a transformer layer sustains (cuBLAS on A100: 70–85 %
      depending on shape; tile and wave quantisation make the layer average lower than the best).
    hbm 0.85: fraction of HBM bandwidth a streaming kernel sustains.
    nvlink 0.65, network 0.80: NCCL bus bandwidth over link peak for the 10–100 MB messages of
      tensor parallelism (nccl-tests on DGX A100 reach ≈ 230 of 300 GB/s only for GB messages) and
      for point-to-point and data-parallel traffic over one HDR NIC per GPU. On the H100's NVLink 4 and NVSwitch
      (the H100 SXM, the H200 and the 500 W HBM2e part) NVLink is NCCL's published figure, not fitted
      (``MEASURED_CONSTANTS``): its large-message peak, so an upper figure for smaller TP messages.
    collective_latency_s 10 µs: fixed cost of one NCCL collective or point-to-point transfer.
    elementwise_traffic 2.0: HBM bytes the memory-bound kernels of a layer move forward per byte of
      activation they leave stored (each written once and read about once more).
    dp_overlap 0.5: fraction of the last micro-batch's backward pass under which the data-parallel
      gradient reduction runs (bucketed reduction: PyTorch DDP, FSDP, Megatron's
      --overlap-grad-reduce); only the rest of the reduction is exposed.
    optimizer_bytes_per_param 36: Adam with fp32 master weights reads the gradient and 12 bytes of
      state, writes the state back and the bf16 copy of the weight.
    tp_overlap 0.8: with tensor-parallel communication overlap, the share of a layer's linear GEMM time under
      which its TP collectives can run (the chunked all-gather/reduce-scatter pipelines with the GEMMs it
      feeds; the first chunk and the GEMM-less gaps stay exposed), but for the backward reduce-scatters of projections
      run apart, which torch's async TP cannot pipeline (``step_time.unpipelined_reduce_scatter_seconds``). Not
      fitted on the A100 rows: none overlapped.

    Scale terms (not fitted: no published row isolates them; docs/planner.md):
    hop_latency_s 5 µs: each step of a collective's tree over the network (NCCL's tree at scale: log2(n) steps a
      pass, 2·log2(n) an all-reduce); every gradient bucket pays it, so a reduction over thousands of replicas
      costs more than its bytes.
    bucket_bytes 100 MB: gradients reduced per collective (Megatron's bucket is 40 M parameters; DDP's 25 MB).
    rank_jitter 0.2 %: the spread (σ) of one rank's step time around the mean from noise no schedule controls
      (clocks, the OS, the network); a synchronous step waits for the slowest of n ranks, about σ·√(2 ln n)
      above the mean. Chosen among 0, 0.1, 0.2 and 0.4 % by the A100 rows' leave-one-out error (3.31, 3.21, 3.19
      and 4.04 % mean); how it grows with n is the model's, not a fit.

    Chosen on the H100/H200 rows (the A100 rows never exercise them; ``calibration.GRID_EVERY_ROW``):
    attention 0.5: fraction of the bf16 peak fused (flash) attention sustains over the FLOPs a causal mask leaves
      (FlashAttention-2 reaches 50–73 % of an A100's forward peak, FlashAttention-3 75 % of an H100's); on the H100
      SXM and H200 measured, not fitted (``MEASURED_CONSTANTS``), on the 500 W H100 fitted (``data/efficiencies.csv``).
    eager_traffic 3.0: how many times the element-wise bytes eager PyTorch moves against fused kernels (each
      norm, activation and rotary embedding op its own kernel, the norms upcast to fp32); torchtitan's eager and
      compiled rows choose 3.
    """

    gemm: float = 0.74
    hbm: float = 0.85
    nvlink: float = 0.65
    network: float = 0.80
    collective_latency_s: float = 10e-6
    elementwise_traffic: float = 2.0
    dp_overlap: float = 0.5
    optimizer_bytes_per_param: float = 36.0
    tp_overlap: float = 0.8
    hop_latency_s: float = 5e-6
    bucket_bytes: float = 100e6
    rank_jitter: float = 0.002
    attention: float = 0.5
    eager_traffic: float = 3.0


DEFAULT_EFFICIENCIES = Efficiencies()


FITTED = Path(__file__).resolve().parent / "data" / "efficiencies.csv"
#: The constants a GPU's fit chooses (the rest stay the defaults): ``calibration.GRID_EVERY_ROW``'s names.
FITTED_NAMES = ("gemm", "nvlink", "network", "dp_overlap", "tp_overlap", "attention", "eager_traffic")
#: Fewer published runs than this on a GPU: it prices with the defaults. Constants fitted on k of the H100 SXM's runs
#: (a GPU whose datasheet the planner knows, as it knows the B200's) predicted its other runs worse than the defaults
#: for k ≤ 3 (mean |error| 8.7, 8.9, 7.8% against 7.4%, 2026-12-01) and better from 4 (6.5 against 7.3%; 6.3
#: against 7.3% at 5): ``calibration.fits_on_few_rows``, printed by bench/planner_calibration.py. Five keeps a margin.
MIN_ROWS = 5
#: NVLink's efficiency on an H100's 8-GPU NVSwitch board: NCCL reaches 370 of NVLink 4's 450 GB/s line rate one way
#: as bus bandwidth on collectives other than all-reduce, and on a ring all-reduce (~20% protocol overhead; NCCL's
#: maintainer, NVIDIA/nccl-tests issue 212, 2024-05-06; ``data/SOURCES.md``). The same board carries the H100 SXM
#: (DGX H100), the H200 and the 500 W HBM2e H100 of torchtitan's runs (Grand Teton's HGX H100). Fitted instead, each
#: family's NVLink rested on its few tensor-parallel runs: left out, torchtitan's 70B pair had the 500 W part's other
#: runs choose 0.55 and read 11.0 and 8.3% slow, Megatron-LM's 1.7B had the H100 SXM's choose 0.65 and read 13.2% fast.
HOPPER_NVLINK = round(370 / 450, 3)
#: Constants measured on a GPU's chip or its fabric (or published for it), which its fit keeps instead of choosing
#: (``calibration.family_grid``), by the GPU whose runs the fit reads (``calibration.constants_family``): NVLink on the
#: H100's NVSwitch board (``HOPPER_NVLINK``). Fused attention on the H100 SXM (and so the H200):
#: cuDNN's forward (Transformer Engine's kernel, and SDPA's) on an H200, the same GH100 chip at the same clocks, levels
#: off at 0.60-0.61 of the bf16 peak at 32k tokens (``data/measured_attention_h200.csv``); shorter launches run lower
#: (0.38-0.58 at 4k-8k tokens), which one constant does not price. Chosen by the fit instead, the H100 SXM's
#: attention rested on its two FP8 runs (the only ones with enough attention to weigh it): left out in turn,
#: Megatron-Bridge's 70B had the rest choose 0.2 and read 23.6% too slow. The shapes' median (0.52) would price the
#: 32k CP ranks of ``data/measured_cp_attention_h200.csv`` 14-22% slow.
MEASURED_CONSTANTS: dict[str, dict[str, float]] = {
    "H100-SXM": {"attention": 0.6, "nvlink": HOPPER_NVLINK},
    "H100-HBM2e-500W": {"nvlink": HOPPER_NVLINK},
}


def measured_on(gpu: str) -> dict[str, float]:
    """The constants measured on ``gpu``'s chip (``MEASURED_CONSTANTS``; any case), none where nothing was."""
    return next((found for name, found in MEASURED_CONSTANTS.items() if name.lower() == gpu.lower()), {})


#: The GPU the defaults were chosen on, and on how many of its published runs (``data/published_runs.csv``).
DEFAULTS_CHOSEN_ON = ("A100-80GB", 18)


@dataclass(frozen=True)
class GpuConstants:
    """A GPU's fitted constants, how many published runs they were fitted on, and which GPUs' runs, how and when."""

    efficiencies: Efficiencies
    rows: int
    fitted: str


def read_fitted(path: Path = FITTED) -> dict[str, GpuConstants]:
    """The fitted constants by GPU name (lower case), from ``path``."""
    with path.open(newline="") as handle:
        table = list(csv.DictReader(handle))
    out: dict[str, GpuConstants] = {}
    for row in table:
        values = {name: float(row[name]) for name in FITTED_NAMES}
        out[row["gpu"].lower()] = GpuConstants(replace(DEFAULT_EFFICIENCIES, **values), int(row["rows"]), row["fitted"])
    return out


FITTED_BY_GPU = read_fitted()


def _described_by_request(gpu: GpuSpec | str) -> bool:
    """A ``GpuSpec`` that is not the catalog's: a GPU a request describes itself, whatever it is called."""
    return not isinstance(gpu, str) and GPU_CATALOG.get(gpu.name.lower()) != gpu


def _fit(gpu: GpuSpec | str) -> GpuConstants | None:
    """The fit ``gpu`` prices with: by name, none for a GPU a request describes itself (it keeps the defaults)."""
    name = gpu if isinstance(gpu, str) else gpu.name
    return None if _described_by_request(gpu) else FITTED_BY_GPU.get(name.lower())


def efficiencies_for(gpu: GpuSpec | str) -> Efficiencies:
    """The constants ``gpu`` (a catalog name, or a ``GpuSpec``) prices with: its own fit, else the defaults."""
    found = _fit(gpu)
    return DEFAULT_EFFICIENCIES if found is None else found.efficiencies


def constants_said(gpu: GpuSpec | str) -> str:
    """Which constants a plan on ``gpu`` used, in words (the answer's ``assumed``)."""
    found, name = _fit(gpu), gpu if isinstance(gpu, str) else gpu.name
    chosen_on, rows = DEFAULTS_CHOSEN_ON
    defaults = f"constants: the defaults, chosen on {rows} published {chosen_on} runs"
    if found is not None:
        return f"constants: fitted on {found.rows} published {found.fitted} (analysis/planner/data/efficiencies.csv)"
    if _described_by_request(gpu):
        return f"{defaults} (the request's own GPU figures)"
    if name.lower() == chosen_on.lower():
        return defaults
    return (
        f"{defaults} (fewer than {MIN_ROWS} published {name} runs in analysis/planner/data: only its datasheet "
        "figures are its own)"
    )
