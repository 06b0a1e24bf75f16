"""API shapes of a plan request and answer (the planner itself takes plain dicts: see
``bubblescope.analysis.planner.request``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Strict, Tag

from bubblescope.analysis import MODEL_PRESETS, NAMES
from bubblescope.backend.fields import PositiveInt

PositiveFloat = Annotated[float, Field(gt=0, le=1e9)]  # far past any device; 1e308 would overflow the model


def preset_or_fields(value: Any) -> str | None:
    """Which form a ``model``, ``cluster`` or ``gpu`` was given in: a name (``"preset"``) or an object of fields
    (``"fields"``). Validated as that form alone, a bad object's 422 names its fields (``model.fields.head_dim``)
    without a second error saying it is not a string."""
    if isinstance(value, str):
        return "preset"
    return "fields" if isinstance(value, dict | BaseModel) else None


def named_or_given(what: str) -> Discriminator:
    """The ``Discriminator`` of a ``str | <fields>`` union named ``what``: anything but a string or an object is
    refused as neither, in one error."""
    return Discriminator(
        preset_or_fields,
        custom_error_type="preset_or_fields",
        custom_error_message=f"{what} must be a name or an object of fields",
    )


class ModelIn(BaseModel):
    """A transformer; ``preset`` names a base whose fields the others override."""

    model_config = ConfigDict(extra="forbid")

    preset: str | None = None
    name: str | None = None
    layers: PositiveInt | None = None
    hidden: PositiveInt | None = None
    heads: PositiveInt | None = None
    kv_heads: PositiveInt | None = Field(default=None, description="grouped-query attention (default: heads)")
    head_dim: PositiveInt | None = Field(
        default=None, description="a head's width where it is not hidden/heads (Qwen3: 128 over hidden 2048)"
    )
    ffn_hidden: PositiveInt | None = Field(default=None, description="default 4·hidden")
    seq: PositiveInt | None = None
    vocab: PositiveInt | None = None
    experts: PositiveInt | None = Field(default=None, description="routed experts per layer (mixture of experts)")
    top_k: PositiveInt | None = Field(default=None, description="experts each token is routed to")
    moe_ffn_hidden: PositiveInt | None = Field(default=None, description="an expert's MLP width (default ffn_hidden)")
    shared_experts: Annotated[int, Strict(), Field(ge=0, le=64)] | None = None
    gated_mlp: Annotated[bool, Strict()] | None = None
    tied_embeddings: Annotated[bool, Strict()] | None = None
    learned_positions: Annotated[bool, Strict()] | None = None


class GpuIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = "custom"
    peak_tflops: PositiveFloat = Field(description="dense bf16 TFLOP/s")
    memory_gib: PositiveFloat
    hbm_gbps: PositiveFloat
    nvlink_gbps: PositiveFloat = Field(description="one direction, per GPU, GB/s")
    network_gbps: PositiveFloat = Field(description="one direction, per GPU, GB/s")
    fp8_tflops: PositiveFloat | None = Field(default=None, description="dense FP8 TFLOP/s (none: no FP8)")


GpuGiven = Annotated[Annotated[str, Tag("preset")] | Annotated[GpuIn, Tag("fields")], named_or_given("gpu")]


class ClusterIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpu: GpuGiven = Field(
        description="catalog name (A100-40GB, A100-80GB, H100-SXM, H100-PCIe, H100-HBM2e-500W, H200, B200) or the "
        "GPU's fields"
    )
    gpus: Annotated[int, Strict(), Field(ge=1, le=2**20, description="at most 1,048,576")]
    gpus_per_node: PositiveInt = 8
    nodes_per_leaf: PositiveInt = Field(default=32, description="nodes under one leaf switch")
    oversubscription: Annotated[float, Field(ge=1, le=64)] = Field(
        default=1.0, description="leaf downlink over uplink bandwidth (1: full bisection)"
    )


class ConfigIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tp: PositiveInt | None = None
    pp: PositiveInt | None = None
    dp: PositiveInt | None = None
    vpp: PositiveInt | None = None
    mbs: PositiveInt | None = None
    schedule: str | None = Field(default=None, description=f"{', '.join(NAMES)}, or torch's class name")
    zero: Literal[0, 1, 2, 3] | None = None
    recompute: Literal["none", "selective", "op", "full"] | None = None
    sequence_parallel: Annotated[bool, Strict()] | None = None
    flash_attention: Annotated[bool, Strict()] | None = Field(default=None, description="default true")
    precision: Literal["bf16", "fp8"] | None = Field(default=None, description="fp8: the linear GEMMs at FP8")
    layers_per_stage: Annotated[list[PositiveInt], Field(min_length=1, max_length=4096)] | None = Field(
        default=None,
        description="each pipeline stage's layers, first stage first (with vpp > 1 split over its virtual stages, "
        "at least one layer each)",
    )
    first_stage_layers: PositiveInt | None = Field(default=None, description="Megatron's first-stage layers")
    last_stage_layers: PositiveInt | None = Field(default=None, description="Megatron's last-stage layers")
    cp: PositiveInt | None = Field(default=None, description="context parallel degree (sequence split)")
    cp_comm: Literal["p2p", "allgather"] | None = Field(default=None, description="ring attention (p2p) or allgather")
    attention_kernel: Literal["cudnn", "flash2"] | None = Field(
        default=None, description="fused attention: cudnn (default; Transformer Engine, SDPA on Hopper) or flash2"
    )
    ep: PositiveInt | None = Field(default=None, description="expert parallel degree (of dp·cp, or of tp·dp·cp/etp)")
    etp: PositiveInt | None = Field(
        default=None, description="the experts' own tensor-parallel degree, at most tp (default: tp)"
    )
    dispatcher: Literal["alltoall", "deepep", "hybridep"] | None = Field(
        default=None, description="how routed tokens travel: alltoall (default), or once a node (deepep, hybridep)"
    )
    capacity_factor: Annotated[float, Field(gt=0, le=16)] | None = Field(
        default=None, description="routed tokens an expert is sized for, over an even share (default 1.0)"
    )
    tp_comm_overlap: Annotated[bool, Strict()] | None = Field(
        default=None, description="TP collectives under the GEMMs (--tp-comm-overlap, async TP); default false"
    )
    compile: Annotated[bool, Strict()] | None = Field(
        default=None, description="element-wise kernels fused (torch.compile, Megatron's fused kernels); default true"
    )
    grad_reduce: Literal["fp32", "bf16", "fp16"] | None = Field(
        default=None, description="type gradients are reduced in over data parallelism (default fp32)"
    )
    fp8_all_gather: Annotated[bool, Strict()] | None = Field(
        default=None,
        description="with precision fp8 and zero ≥ 1, the linear weights gathered in FP8 (torchtitan's "
        "enable_fsdp_float8_all_gather, Megatron's --fp8-param-gather); default false",
    )
    kv_repeated: Annotated[bool, Strict()] | None = Field(
        default=None,
        description="keys and values repeated to every query head before attention (torchtitan's Llama before "
        "January 2026): context parallelism moves heads·head_dim a token, not kv_heads·head_dim; default false",
    )
    overlap_param_gather: Annotated[bool, Strict()] | None = Field(
        default=None,
        description="with zero 1 or 2, the updated weights' all-gather under the next step's first forward "
        "(Megatron's --overlap-param-gather, Megatron-Bridge's default with the distributed optimizer); default false",
    )
    projections: Literal["fused", "separate", "fused_qkv"] | None = Field(
        default=None,
        description="fused: Q, K, V in one GEMM and a gated MLP's w1, w3 in one (Megatron-LM, Transformer Engine; the "
        "default); separate: each its own GEMM (torchtitan's Llama before fuse_qkv, Hugging Face's); fused_qkv: Q, K, V "
        "in one, w1 and w3 apart (torchtitan 0.3's Llama 3)",
    )


ModelGiven = Annotated[Annotated[str, Tag("preset")] | Annotated[ModelIn, Tag("fields")], named_or_given("model")]
ClusterGiven = Annotated[Annotated[str, Tag("preset")] | Annotated[ClusterIn, Tag("fields")], named_or_given("cluster")]


class PlanRequestIn(BaseModel):
    """``config``: evaluate that one configuration; otherwise search (holding ``fixed``) and rank."""

    model_config = ConfigDict(extra="forbid")

    model: ModelGiven = Field(description=f"preset ({', '.join(MODEL_PRESETS)}) or fields")
    cluster: ClusterGiven = Field(description="preset <gpu>-x<count> (a100-80gb-x64) or fields")
    global_batch: PositiveInt
    config: ConfigIn | None = None
    fixed: ConfigIn | None = None
    top: Annotated[int, Strict(), Field(ge=1, le=1000)] = 10


class PlanItemOut(BaseModel):
    config: dict[str, Any]
    feasible: bool
    fits: bool
    problems: list[str]
    step_time_s: float | None
    mfu: float | None
    bubble_fraction: float | None
    microbatches: int | None
    memory_gib_per_gpu: float | None
    memory_gib: dict[str, float] | None
    step_time_parts_s: dict[str, float] | None


class PlanOut(BaseModel):
    mode: Literal["evaluate", "search"]
    model: dict[str, Any]
    cluster: dict[str, Any]
    global_batch: int
    assumed: list[str] = Field(
        description="the defaults the request relied on, and the constants its GPU prices with, in words"
    )
    plans: list[PlanItemOut]
    why_none: str | None = Field(
        default=None,
        description="a search that found nothing: why (the global batch no layout splits, the memory the leanest"
        " layout still needs, or the reason every layout is refused)",
    )
