"""What the planner plans for: a model, a cluster, a parallel configuration; presets and GPU catalog.

Everything here is plain data. ``PlanInputError`` names the field that is wrong, so the CLI and the
API can both say which input to fix.
"""

from __future__ import annotations

import csv
import functools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bubblescope.analysis.errors import InputError
from bubblescope.analysis.schedules import DEFAULT_SCHEDULE, Schedule

#: Activation recomputation: ``selective`` is Megatron-LM's (the attention core: nothing more under fused attention),
#: ``op`` torchtitan's per-op selective checkpointing (``selective_ac_option = "op"``: every second matmul's output
#: and the other element-wise ops recomputed), ``full`` each layer from its input.
RECOMPUTE = ("none", "selective", "op", "full")
PRECISIONS = ("bf16", "fp8")
CP_COMMS = ("p2p", "allgather")
#: Fused attention kernels priced apart (``step_time.attention_kernel_share``).
ATTENTION_KERNELS = ("cudnn", "flash2")
#: How expert parallelism moves a token to its experts (``step_time.ep_seconds``): ``alltoall`` sends each routed copy
#: to its rank (NCCL's all-to-all, Megatron's ``alltoall`` dispatcher, torchtitan's); ``deepep`` and ``hybridep``
#: (Megatron's ``flex`` dispatcher backends) send a token once to each other node its experts sit on and fan it out
#: over NVLink there.
DISPATCHERS = ("alltoall", "deepep", "hybridep")
#: The data type gradients are reduced in, and its bytes: fp32 is what Megatron-LM (bf16 training, unless
#: --grad-reduce-in-bf16) and torchtitan (``mixed_precision_reduce``) do by default; fp16 training reduced in fp16.
GRAD_REDUCE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
GRAD_REDUCES = tuple(GRAD_REDUCE_BYTES)
#: How a layer's linear projections run (``step_time.linear_gemm_seconds``): ``fused``, Q, K and V in one GEMM and a
#: gated MLP's w1 and w3 in one (Megatron-LM, Transformer Engine); ``separate``, each its own GEMM (torchtitan's Llama
#: until 0.3's ``fuse_qkv``, Hugging Face's); ``fused_qkv``, Q, K and V in one and w1 and w3 apart (torchtitan 0.3's
#: Llama 3 and Qwen3 flavors).
PROJECTIONS = ("fused", "separate", "fused_qkv")
#: The configuration's fields of a few words, and the words each takes: the request and the evaluation read them here;
#: the API's schemas spell them as ``Literal``s, which a test holds equal to these.
CHOICES = {
    "recompute": RECOMPUTE,
    "cp_comm": CP_COMMS,
    "attention_kernel": ATTENTION_KERNELS,
    "precision": PRECISIONS,
    "grad_reduce": GRAD_REDUCES,
    "dispatcher": DISPATCHERS,
    "projections": PROJECTIONS,
}


class PlanInputError(InputError):
    """A bad planner input; ``field`` is a dotted path such as ``model.hidden`` or ``config.tp``."""


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer. ``ffn_hidden`` defaults to 4·hidden, ``kv_heads`` to ``heads``.

    ``gated_mlp``: SwiGLU-style MLP (three weight matrices). ``tied_embeddings``: the output layer
    shares the input embedding (GPT); ``learned_positions``: a learned s×h position table (GPT).

    Mixture of experts (``experts`` > 0): every layer's MLP is ``experts`` expert MLPs of width ``moe_ffn_hidden``
    (default ``ffn_hidden``), each token routed to ``top_k`` of them, plus ``shared_experts`` every token passes
    through, and a router (h × experts).

    ``head_width``: a head's width where the model's config sets it apart from hidden/heads (Hugging Face's
    ``head_dim``, Megatron's ``--kv-channels``: Qwen3's 32 heads of 128 over a hidden size of 2,048); 0, the
    default, is hidden/heads. ``head_dim`` reads it either way.
    """

    name: str
    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    ffn_hidden: int = 0
    kv_heads: int = 0
    gated_mlp: bool = False
    tied_embeddings: bool = True
    learned_positions: bool = True
    experts: int = 0
    top_k: int = 0
    moe_ffn_hidden: int = 0
    shared_experts: int = 0
    head_width: int = 0

    def __post_init__(self) -> None:
        if self.ffn_hidden == 0:
            object.__setattr__(self, "ffn_hidden", 4 * self.hidden)
        if self.kv_heads == 0:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.experts and self.moe_ffn_hidden == 0:
            object.__setattr__(self, "moe_ffn_hidden", self.ffn_hidden)
        if self.experts and self.top_k == 0:
            object.__setattr__(self, "top_k", 1)

    @property
    def moe(self) -> bool:
        return self.experts > 0

    @functools.cached_property
    def expert_mlp_params(self) -> int:
        """One expert's MLP weights (0 for a dense model)."""
        return (3 if self.gated_mlp else 2) * self.hidden * self.moe_ffn_hidden if self.moe else 0

    @functools.cached_property
    def layer_expert_params(self) -> int:
        """A layer's routed experts' weights: what expert parallelism splits (0 for a dense model)."""
        return self.experts * self.expert_mlp_params

    @functools.cached_property
    def layer_dense_matmul_params(self) -> int:
        """A layer's GEMM weights every rank of a tensor-parallel group holds a slice of: attention, and the dense
        MLP, or the shared experts and the router."""
        attention = 2 * self.hidden * self.q_dim + 2 * self.hidden * self.kv_dim
        if self.moe:
            return attention + self.shared_experts * self.expert_mlp_params + self.hidden * self.experts
        return attention + (3 if self.gated_mlp else 2) * self.hidden * self.ffn_hidden

    @functools.cached_property
    def active_params(self) -> int:
        """Parameters one token passes through: all of a dense model; a mixture of experts' ``top_k`` routed
        experts, not all of them (model FLOPs count these)."""
        unused = self.layers * (self.experts - self.top_k) * self.expert_mlp_params
        return self.params - unused

    @functools.cached_property
    def head_dim(self) -> int:
        return self.head_width or self.hidden // self.heads

    @functools.cached_property
    def q_dim(self) -> int:
        """Width of the queries and of the attention's output: heads · head_dim (hidden, unless ``head_width`` sets
        the heads apart from it)."""
        return self.heads * self.head_dim

    @functools.cached_property
    def kv_dim(self) -> int:
        """Width of K (and of V): kv_heads · head_dim; equals hidden without grouped-query attention."""
        return self.kv_heads * self.head_dim

    @functools.cached_property
    def layer_matmul_params(self) -> int:
        """Weights of one layer's GEMMs: Q, K, V, output projection and the MLP matrices (every expert's)."""
        return self.layer_dense_matmul_params + self.layer_expert_params

    @functools.cached_property
    def layer_params(self) -> int:
        """GEMM weights plus biases and two norms (GPT: 12h² + 13h)."""
        if self.gated_mlp:  # Llama style: no biases, RMSNorm weights only
            return self.layer_matmul_params + 2 * self.hidden
        biases = self.q_dim + 2 * self.kv_dim + self.hidden + self.ffn_hidden + self.hidden
        return self.layer_matmul_params + biases + 4 * self.hidden

    @functools.cached_property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden + (self.seq * self.hidden if self.learned_positions else 0)

    @functools.cached_property
    def output_params(self) -> int:
        """Output-layer weights not shared with the embedding (0 when tied)."""
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    @functools.cached_property
    def params(self) -> int:
        return self.layers * self.layer_params + self.embedding_params + self.output_params + 2 * self.hidden


@dataclass(frozen=True)
class GpuSpec:
    """Peak dense bf16 (and fp8) TFLOP/s, memory, HBM bandwidth, NVLink and network bandwidth per GPU.

    Bandwidths are one direction per GPU, in GB/s (10⁹ bytes): NVLink as NVIDIA quotes it halved
    (A100: 600 GB/s bidirectional → 300), network as the GPU's own NIC (DGX A100: 200 Gb/s HDR → 25).
    ``fp8_tflops`` 0: no FP8 tensor cores. ``source``: where the figures come from (``data/gpus.csv``).
    """

    name: str
    peak_tflops: float
    memory_gib: float
    hbm_gbps: float
    nvlink_gbps: float
    network_gbps: float
    fp8_tflops: float = 0.0
    source: str = ""


#: Kept free of model state and activations: CUDA context, NCCL buffers, allocator fragmentation and
#: temporary buffers (logits, communication staging). 10 % of the GPU, at least 4 GiB.
RESERVE_FRACTION, RESERVE_MIN_GIB = 0.10, 4.0

GPUS = Path(__file__).resolve().parent / "data" / "gpus.csv"


def _catalog(path: Path) -> dict[str, GpuSpec]:
    """The GPU catalog, each row with its source (``data/gpus.csv``)."""
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    return {
        row["name"].lower(): GpuSpec(
            row["name"],
            float(row["bf16_tflops"]),
            float(row["memory_gib"]),
            float(row["hbm_gbps"]),
            float(row["nvlink_gbps"]),
            float(row["network_gbps"]),
            float(row["fp8_tflops"]),
            row["source"],
        )
        for row in rows
    }


GPU_CATALOG: dict[str, GpuSpec] = _catalog(GPUS)


def _device_names(path: Path) -> dict[str, str]:
    """Each catalog GPU's name as torch reports the device (``torch.cuda.get_device_name``, the ``device_names``
    column, ``;`` between two), lower-cased, to its catalog key: what an integration declares for its cluster."""
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    return {
        device.strip().lower(): row["name"].lower()
        for row in rows
        for device in row["device_names"].split(";")
        if device.strip()
    }


GPU_DEVICE_NAMES: dict[str, str] = _device_names(GPUS)


@dataclass(frozen=True)
class ClusterSpec:
    """GPUs in nodes, nodes under leaf switches. ``oversubscription``: a leaf's uplink bandwidth is its downlink's
    over this (1.0: full bisection), which traffic between leaves shares."""

    gpu: GpuSpec
    gpus: int
    gpus_per_node: int = 8
    nodes_per_leaf: int = 32
    oversubscription: float = 1.0

    @property
    def nodes(self) -> int:
        return max(1, -(-self.gpus // self.gpus_per_node))

    @property
    def name(self) -> str:
        return f"{self.gpu.name.lower()}-x{self.gpus}"


@dataclass(frozen=True)
class ParallelConfig:
    """One way to run the job. ``dp`` 0 means "the rest": gpus / (tp·cp·pp).

    ``vpp`` is the number of virtual stages (model chunks) per rank, used by interleaved 1F1B.
    ``zero`` 0–3 shards optimizer (1), +gradients (2), +weights (3) over the data-parallel group.
    ``flash_attention``: fused attention that never stores the s×s scores (FlashAttention), on by default as in
    every 2026 run; the calibration papers' Megatron stored them (their rows turn it off).
    ``precision``: ``fp8`` runs each layer's linear GEMMs at the GPU's FP8 peak (Transformer Engine, torchtitan's
    Float8 linears); attention, the output layer and the element-wise kernels stay bf16.
    ``layers_per_stage``: each pipeline stage's layers, first to last (empty: as even as the layers allow, the
    first stages one more); the embedding sits on the first stage, the output layer and the loss on the last.
    ``tp_comm_overlap``: tensor-parallel communication split into chunks that run under the layer's GEMMs
    (Megatron's ``--tp-comm-overlap``, torchtitan's async TP), but for the backward reduce-scatters of projections run
    apart, which torch's async TP cannot pipeline with a matmul; off, every TP collective is exposed.
    ``cp``: context parallelism, each sequence split over ``cp`` ranks (``dp`` 0 is then gpus / (tp·cp·pp));
    ``cp_comm`` how attention sees the other ranks' keys and values: ``p2p`` (ring attention, Megatron's default:
    each block passed on while the previous one is attended, so the transfer hides under attention) or
    ``allgather`` (gathered before attention, torchtitan's default rotate method: exposed).
    ``ep``: expert parallelism, a mixture of experts' routed experts split over ``ep`` of the dp·cp ranks that
    hold the same dense weights (their expert weights replicated over the other dp·cp/ep; with ``etp`` below tp, of
    the tp·dp·cp ranks, replicated over tp·dp·cp/(etp·ep)); ``capacity_factor``:
    the routed tokens an expert is sized for, over an even share (1.0: balanced and dropless). ``etp``: the experts'
    own tensor-parallel degree (0: ``tp``; Megatron's ``--expert-tensor-parallel-size``): a stage's tp·cp·dp ranks
    are laid out again for the expert layers as etp × ep × (expert replicas), so ep·etp must divide tp·cp·dp; each
    expert's weights are split over etp ranks, and the routed copies' tensor-parallel all-gather and reduce-scatter run
    over etp's group (none at 1: a rank dispatches its sequence-parallel share of the tokens itself). ``dispatcher``:
    how the routed tokens travel (``DISPATCHERS``).
    ``grad_reduce``: the type gradients are reduced (and reduce-scattered) in over data parallelism
    (``GRAD_REDUCE_BYTES``).
    ``compile``: the element-wise kernels (norms, activations, residual adds, rotary embeddings) fused, by
    ``torch.compile`` or by hand as Megatron-LM's and Transformer Engine's are; off, eager PyTorch runs each as its
    own kernel and moves ``Efficiencies.eager_traffic`` times the bytes.
    ``fp8_all_gather``: with ``precision="fp8"``, the layers' linear weights are gathered over data parallelism in
    FP8, one byte a weight (torchtitan's ``enable_fsdp_float8_all_gather``, Megatron-LM's ``--fp8-param-gather``); the
    embedding, the output layer and the norms still travel in bf16. It needs weights to gather (zero ≥ 1).
    ``overlap_param_gather``: with ZeRO 1 or 2 (the distributed optimizer), the updated weights' all-gather runs under
    the next step's first forward, bucket by bucket, instead of after the optimizer's step (Megatron's
    ``--overlap-param-gather``, which Megatron-Bridge sets with the distributed optimizer; DeepSpeed's ZeRO-1/2 gather
    in the open). It needs zero 1 or 2: at 0 nothing is gathered, at 3 FSDP gathers each layer under the forward
    already (``overlap_param_gather_problem``).
    ``attention_kernel``: which fused attention runs: ``cudnn`` (cuDNN's, what Transformer Engine runs and torch's
    SDPA prefers on Hopper and Blackwell with a recent cuDNN) or ``flash2`` (FlashAttention-2, torch's SDPA default
    before that, and the ``flash-attn`` package's v2); priced apart on Hopper only.
    ``kv_repeated``: the keys and values are repeated to every query head before attention (torchtitan's Llama from
    its start until 2026-01-27, ff0829c, which passes ``enable_gqa`` to SDPA instead), so context parallelism moves
    heads·head_dim a token where grouped-query attention has kv_heads·head_dim (``step_time.cp_seconds``).
    ``projections``: which of a layer's linear projections run as one GEMM (``PROJECTIONS``): apart, each reads the
    whole input, a narrow one runs on the roofline's memory side, and the backward sums the input's gradients
    (``step_time.linear_gemm_seconds``, ``step_time.input_gradient_sum_bytes``).
    """

    tp: int = 1
    pp: int = 1
    dp: int = 0
    vpp: int = 1
    mbs: int = 1
    schedule: Schedule = DEFAULT_SCHEDULE
    zero: int = 0
    recompute: str = "none"
    sequence_parallel: bool = False
    flash_attention: bool = True
    precision: str = "bf16"
    layers_per_stage: tuple[int, ...] = ()
    tp_comm_overlap: bool = False
    cp: int = 1
    cp_comm: str = "p2p"
    ep: int = 1
    capacity_factor: float = 1.0
    grad_reduce: str = "fp32"
    compile: bool = True
    fp8_all_gather: bool = False
    attention_kernel: str = "cudnn"
    etp: int = 0
    dispatcher: str = "alltoall"
    kv_repeated: bool = False
    overlap_param_gather: bool = False
    projections: str = "fused"

    def with_dp(self, gpus: int) -> ParallelConfig:
        return self if self.dp else replace(self, dp=gpus // (self.tp * self.cp * self.pp))

    @property
    def replicas(self) -> int:
        """Ranks holding the same weights, over which gradients are reduced and ZeRO shards: dp·cp."""
        return self.dp * self.cp

    @property
    def expert_tp(self) -> int:
        """The experts' tensor-parallel degree: ``etp``, else ``tp``."""
        return self.etp or self.tp

    @property
    def expert_replicas(self) -> int:
        """Ranks holding the same routed experts' weights (Megatron's expert data parallelism): tp·cp·dp / (etp·ep);
        dp·cp / ep when etp is tp."""
        return self.tp * self.replicas // (self.expert_tp * self.ep)

    @property
    def output_rank(self) -> int:
        """The pipeline rank running the last stage, with the output layer and the loss: p − 1, or rank 0 for a
        V-shaped schedule (ZB-V, DualPipeV: stages r and 2p − 1 − r on rank r)."""
        stages = self.pp * (1 if self.schedule.placement == "single" else self.vpp)
        return self.schedule.stage_rank(self.pp, stages - 1)

    def splits_sequence(self, seq: int) -> bool:
        """Whether a ``seq``-token sequence splits over this layout's cp·tp ranks, as sequence parallelism needs
        (Megatron scatters each context rank's share over tp)."""
        return seq % (self.cp * self.tp) == 0

    def stage_layers(self, layers: int) -> tuple[int, ...]:
        """Each pipeline rank's layers: as given; else even where ``pp`` divides ``layers``; else the search's
        ``two_ended_split`` where it leaves every rank a layer for each of its ``vpp`` virtual stages, or as even as
        they go (the first ranks one more); either way the fewer on the rank that also runs the output layer (the
        last, or the first under a V-shaped schedule)."""
        if self.layers_per_stage:
            return self.layers_per_stage
        if layers % self.pp == 0:
            return (layers // self.pp,) * self.pp
        two_ended = two_ended_split(layers, self.pp)
        split = two_ended if two_ended and min(two_ended) >= self.vpp else as_even(layers, self.pp)
        return split[::-1] if self.output_rank == 0 else split

    def as_dict(self) -> dict[str, Any]:
        return {
            "tp": self.tp,
            "pp": self.pp,
            "dp": self.dp,
            "vpp": self.vpp,
            "mbs": self.mbs,
            "schedule": self.schedule.name,
            "zero": self.zero,
            "recompute": self.recompute,
            "sequence_parallel": self.sequence_parallel,
            "flash_attention": self.flash_attention,
            "precision": self.precision,
            "layers_per_stage": list(self.layers_per_stage) or None,
            "tp_comm_overlap": self.tp_comm_overlap,
            "cp": self.cp,
            "cp_comm": self.cp_comm,
            "attention_kernel": self.attention_kernel,
            "ep": self.ep,
            "etp": self.etp or None,  # null: as tp
            "dispatcher": self.dispatcher,
            "capacity_factor": self.capacity_factor,
            "grad_reduce": self.grad_reduce,
            "compile": self.compile,
            "fp8_all_gather": self.fp8_all_gather,
            "kv_repeated": self.kv_repeated,
            "overlap_param_gather": self.overlap_param_gather,
            "projections": self.projections,
        }


def _gpt(name: str, layers: int, hidden: int, heads: int) -> ModelSpec:
    return ModelSpec(name, layers, hidden, heads, seq=2048, vocab=51200)


def _llama(name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, seq: int, vocab: int) -> ModelSpec:
    return ModelSpec(
        name,
        layers,
        hidden,
        heads,
        seq,
        vocab,
        ffn_hidden=ffn,
        kv_heads=kv,
        gated_mlp=True,
        tied_embeddings=False,
        learned_positions=False,
    )


def _qwen3_moe(name: str, layers: int, hidden: int, heads: int, expert_width: int) -> ModelSpec:
    """A Qwen3 mixture of experts: every layer 128 experts of ``expert_width``, 8 a token, 4 key-value heads, heads
    128 wide whatever the hidden size, vocabulary 151,936, untied output layer (its QK norms, 2·128 weights a layer,
    left out). ``ffn_hidden`` (3·hidden, its dense MLP width) is unused: no layer is dense."""
    dense = _llama(name, layers, hidden, heads, 4, 3 * hidden, 4096, 151936)
    return replace(dense, experts=128, top_k=8, moe_ffn_hidden=expert_width, head_width=128)


MODEL_PRESETS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        # Narayanan et al. 2021, Table 1, and Korthikanti et al. 2022, Table 5
        _gpt("gpt-1.7b", 24, 2304, 24),
        _gpt("gpt-3.6b", 30, 3072, 32),
        _gpt("gpt-7.5b", 36, 4096, 32),
        _gpt("gpt-18.4b", 40, 6144, 48),
        _gpt("gpt-22b", 48, 6144, 64),
        _gpt("gpt-39.1b", 48, 8192, 64),
        _gpt("gpt-76.1b", 60, 10240, 80),
        _gpt("gpt-145.6b", 80, 12288, 96),
        _gpt("gpt-175b", 96, 12288, 96),
        _gpt("gpt-310.1b", 96, 16384, 128),
        _gpt("gpt-529.6b", 105, 20480, 128),
        _gpt("gpt-530b", 105, 20480, 128),
        _gpt("gpt-1008b", 128, 25600, 160),
        _gpt("gpt-1t", 128, 25600, 160),
        _llama("llama-2-7b", 32, 4096, 32, 32, 11008, 4096, 32000),
        _llama("llama-2-70b", 80, 8192, 64, 8, 28672, 4096, 32000),
        _llama("llama-3-8b", 32, 4096, 32, 8, 14336, 8192, 128256),
        _llama("llama-3-70b", 80, 8192, 64, 8, 28672, 8192, 128256),
        # Llama 3.1 405B (Llama 3 herd paper, Table 3; torchtitan's llama3 "405B" flavor)
        _llama("llama-3.1-405b", 126, 16384, 128, 8, 53248, 8192, 128256),
        # Mixtral of Experts (Jiang et al. 2024, arXiv:2401.04088, Table 1): 8 experts, 2 per token
        replace(_llama("mixtral-8x7b", 32, 4096, 32, 8, 14336, 4096, 32000), experts=8, top_k=2),
        # Qwen3 MoE (Hugging Face Qwen/Qwen3-30B-A3B and Qwen/Qwen3-235B-A22B config.json; Qwen3 Technical Report,
        # arXiv:2505.09388, Table 2)
        _qwen3_moe("qwen3-30b-a3b", 48, 2048, 32, 768),
        _qwen3_moe("qwen3-235b-a22b", 94, 4096, 64, 1536),
    )
}

_CLUSTER_NAME = re.compile(r"^(?P<gpu>.+)-x(?P<count>\d+)$")


def cluster_preset(name: str, gpus_per_node: int = 8) -> ClusterSpec:
    """``<gpu>-x<count>``, e.g. ``a100-80gb-x8`` or ``h100-sxm-x1024`` (8 GPUs per node)."""
    found = _CLUSTER_NAME.match(name.strip().lower())
    if not found or found["gpu"] not in GPU_CATALOG:
        raise PlanInputError(
            "cluster",
            f"unknown cluster {name!r}; use <gpu>-x<count> with gpu one of "
            f"{', '.join(sorted(GPU_CATALOG))} (e.g. a100-80gb-x8)",
        )
    return make_cluster(found["gpu"], int(found["count"]), gpus_per_node, "cluster")


def make_cluster(
    gpu: str | Mapping[str, Any],
    gpus: Any,
    gpus_per_node: Any = 8,
    where: str = "cluster",
    nodes_per_leaf: Any = 32,
    oversubscription: Any = 1.0,
) -> ClusterSpec:
    """A cluster from a catalog GPU name (or a dict of GpuSpec fields), a GPU count and GPUs per node."""
    gpu_spec = gpu_from(gpu, f"{where}.gpu")
    count = positive_int(gpus, f"{where}.gpus")
    per_node = positive_int(gpus_per_node, f"{where}.gpus_per_node")
    if count > per_node and count % per_node:
        raise PlanInputError(f"{where}.gpus", f"{count} GPUs is not a whole number of {per_node}-GPU nodes")
    leaf = positive_int(nodes_per_leaf, f"{where}.nodes_per_leaf")
    ratio = positive_float(oversubscription, f"{where}.oversubscription")
    if ratio < 1 or ratio > 64:
        raise PlanInputError(f"{where}.oversubscription", f"expected 1 (full bisection) to 64, got {ratio}")
    return ClusterSpec(gpu_spec, count, min(per_node, count), leaf, ratio)


def _named_or_fields(table: Mapping[str, Any], value: Any, where: str, what: str) -> Any:
    """The table's entry for a name; the value itself if it is a mapping of fields; else an error."""
    if isinstance(value, str):
        spec = table.get(value.strip().lower())
        if spec is None:
            known = ", ".join(getattr(entry, "name", key) for key, entry in table.items())
            raise PlanInputError(where, f"unknown {what} {value!r}; known: {known}")
        return spec
    if not isinstance(value, Mapping):
        raise PlanInputError(where, f"expected a {what} name or an object of {what} fields")
    return value


def gpu_from(value: str | Mapping[str, Any], where: str) -> GpuSpec:
    """A catalog GPU by its name or by the device's name as torch reports it (``NVIDIA H100 80GB HBM3``), or a dict
    of GpuSpec fields."""
    if isinstance(value, str):
        value = GPU_DEVICE_NAMES.get(value.strip().lower(), value)
    found = _named_or_fields(GPU_CATALOG, value, where, "GPU")
    if isinstance(found, GpuSpec):
        return found
    fields = dict(found)
    known = {"name", "peak_tflops", "memory_gib", "hbm_gbps", "nvlink_gbps", "network_gbps", "fp8_tflops"}
    _no_extra(fields, known, where)
    missing = [key for key in sorted(known - {"name", "fp8_tflops"}) if fields.get(key) is None]
    if missing:  # every one at once, as a model object's
        also = f" (also missing: {', '.join(missing[1:])})" if missing[1:] else ""
        raise PlanInputError(f"{where}.{missing[0]}", f"field required{also}")
    numbers = {  # within a GPU's reach: a figure past it would price a step at no time, or at infinite time
        key: _gpu_figure(fields.get(key), f"{where}.{key}") for key in sorted(known - {"name", "fp8_tflops"})
    }
    if numbers["memory_gib"] <= RESERVE_MIN_GIB:
        raise PlanInputError(
            f"{where}.memory_gib",
            f"more than the {RESERVE_MIN_GIB:g} GiB kept free on every GPU (CUDA context, NCCL buffers, allocator), "
            f"got {fields['memory_gib']!r}",
        )
    fp8 = _gpu_figure(fields["fp8_tflops"], f"{where}.fp8_tflops") if fields.get("fp8_tflops") is not None else 0.0
    given = str(fields.get("name") or "custom")
    name = given if given == "custom" else f"{given} (given figures)"  # not to be read as the catalog's part
    return GpuSpec(name=name, fp8_tflops=fp8, source="given in the request", **numbers)


GPU_FIGURE_RANGE = (1e-3, 1e9)


def _gpu_figure(value: Any, where: str) -> float:
    number = positive_float(value, where, most=GPU_FIGURE_RANGE[1])
    if number < GPU_FIGURE_RANGE[0]:
        raise PlanInputError(where, f"at least {GPU_FIGURE_RANGE[0]:g}, got {value!r}")
    return number


def as_even(count: int, parts: int) -> tuple[int, ...]:
    """``count`` layers over ``parts`` stages as evenly as they go, the first ones a layer more."""
    return tuple(count // parts + (1 if part < count % parts else 0) for part in range(parts))


def two_ended_split(layers: int, pp: int) -> tuple[int, ...] | None:
    """The split a search gives ``pp`` stages that do not divide ``layers``: the middle stages ceil(layers/pp) each
    and the rest shared by the first and the last (the last the fewer: it also runs the output layer and the loss;
    80 over 3: 27, 27, 26), as Megatron's
    ``--decoder-first/last-pipeline-num-layers`` and torchtitan's first/last-stage-less-layers express it (126 over
    16: 7, 8 × 14, 7). None where that leaves the first or last stage no layer or more than a middle one."""
    if not 2 <= pp <= layers or layers % pp == 0:
        return None
    middle = -(-layers // pp)
    rest = layers - middle * (pp - 2)
    first, last = rest - rest // 2, rest // 2
    return (first, *[middle] * (pp - 2), last) if last >= 1 and first <= middle else None


#: What a model object must give (or take from its ``preset``); the rest have defaults.
REQUIRED_MODEL_FIELDS = ("layers", "hidden", "heads", "seq", "vocab")


def model_from(value: str | Mapping[str, Any], where: str = "model") -> ModelSpec:
    """A preset name, or a dict of ModelSpec fields (``preset`` may name a base to override)."""
    found = _named_or_fields(MODEL_PRESETS, value, where, "model")
    if isinstance(found, ModelSpec):
        return found
    fields = dict(found)
    base = model_from(fields.pop("preset"), f"{where}.preset") if "preset" in fields else None
    ints = ("layers", "hidden", "heads", "seq", "vocab", "ffn_hidden", "kv_heads", "experts", "top_k", "moe_ffn_hidden")
    counts = ("shared_experts",)  # may be 0
    flags = ("gated_mlp", "tied_embeddings", "learned_positions")
    _no_extra(fields, {"preset", "name", "head_dim", *ints, *counts, *flags}, where)  # preset: popped above
    values: dict[str, Any] = {} if base is None else {k: getattr(base, k) for k in ("name", *ints, *counts, *flags)}
    if base is not None:
        values["head_width"] = base.head_width
    if "head_dim" in fields:  # the config's own name for it
        values["head_width"] = positive_int(fields["head_dim"], f"{where}.head_dim")
    values.setdefault("name", "custom")
    missing = [key for key in REQUIRED_MODEL_FIELDS if key not in fields and key not in values]
    if missing:  # every one at once: a model file is not fixed one round trip a field
        also = f" (also missing: {', '.join(missing[1:])})" if missing[1:] else ""
        raise PlanInputError(f"{where}.{missing[0]}", f"field required{also}; or give a preset to start from")
    for key in ints:
        if key in fields:
            values[key] = positive_int(fields[key], f"{where}.{key}")
    for key in counts:
        if key in fields:
            values[key] = (
                0
                if fields[key] == 0 and not isinstance(fields[key], bool)
                else positive_int(fields[key], f"{where}.{key}")
            )
    for key in flags:
        if key in fields:
            if not isinstance(fields[key], bool):
                raise PlanInputError(f"{where}.{key}", "expected true or false")
            values[key] = fields[key]
    if "name" in fields:
        values["name"] = str(fields["name"])
    if values.get("experts") and not values.get("top_k"):  # no default a user would not have to be told
        raise PlanInputError(
            f"{where}.top_k", "a mixture of experts needs top_k: how many experts a token is routed to"
        )
    spec = ModelSpec(**values)
    if spec.hidden % spec.heads and not spec.head_width:
        raise PlanInputError(
            f"{where}.heads", f"hidden {spec.hidden} is not divisible by heads {spec.heads} (or give head_dim)"
        )
    if spec.heads % spec.kv_heads:
        raise PlanInputError(f"{where}.kv_heads", f"heads {spec.heads} is not divisible by kv_heads {spec.kv_heads}")
    if spec.top_k > spec.experts and spec.experts:
        raise PlanInputError(f"{where}.top_k", f"top_k {spec.top_k} is more than the {spec.experts} experts")
    if not spec.experts and (fields.get("top_k") or fields.get("moe_ffn_hidden") or fields.get("shared_experts")):
        raise PlanInputError(f"{where}.experts", "top_k, moe_ffn_hidden and shared_experts need experts > 0")
    return spec


def positive_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        else:
            raise PlanInputError(where, f"expected a positive integer, got {value!r}")
    if value < 1:
        raise PlanInputError(where, f"must be at least 1, got {value}")
    return int(value)


def positive_float(value: Any, where: str, most: float = math.inf) -> float:
    """A number above 0 and at most ``most``; a numeric string (the command line's) is read as its number."""
    if value is None:
        raise PlanInputError(where, "field required")
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise PlanInputError(where, f"expected a positive number, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value != value:
        raise PlanInputError(where, f"expected a positive number, got {value!r}")
    if value > most:
        raise PlanInputError(where, f"at most {most:g}, got {value!r}")
    return float(value)


def fp8_all_gather_problem(precision: str | None, zero: int | None) -> str | None:
    """Why the FP8 weight gathers (``ParallelConfig.fp8_all_gather``) cannot act, or None: they gather the FP8 linears'
    weights, so they need FP8, and weights that ZeRO shards (``zero`` None: not known yet, as in a search)."""
    if precision != "fp8":
        return "gathers the FP8 linears' weights: needs precision fp8 (precision=fp8)"
    if zero == 0:
        return "without ZeRO no weights are gathered: needs zero ≥ 1"
    return None


def overlap_param_gather_problem(zero: int | None) -> str | None:
    """Why hiding the weights' all-gather under the next forward (``ParallelConfig.overlap_param_gather``) cannot act,
    or None: only the distributed optimizer (ZeRO 1 or 2) gathers the weights once a step after the optimizer's
    (``zero`` None: not known yet, as in a search, which sets it on its ZeRO-1/2 layouts alone)."""
    if zero == 0:
        return "without ZeRO no weights are gathered: needs zero 1 or 2 (the distributed optimizer)"
    if zero == 3:
        return "ZeRO-3 (FSDP) gathers each layer under the forward already: needs zero 1 or 2"
    return None


def one_of(value: Any, choices: tuple[str, ...], where: str) -> str:
    """One of ``choices``, in any case."""
    if not isinstance(value, str) or value.lower() not in choices:
        raise PlanInputError(where, f"expected one of {', '.join(choices)}, got {value!r}")
    return value.lower()


def boolean(value: Any, where: str) -> bool:
    """true/false, or the command line's words for them (on, off, yes, no, 1, 0)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on", "false", "0", "no", "off"):
        return value.lower() in ("true", "1", "yes", "on")
    raise PlanInputError(where, f"expected true or false, got {value!r}")


def _no_extra(fields: Mapping[str, Any], known: set[str], where: str) -> None:
    extra = sorted(set(fields) - known)
    if extra:
        raise PlanInputError(f"{where}.{extra[0]}", f"unknown field; expected one of {', '.join(sorted(known))}")
