"""What a torchtitan run declares to the planner, read from torchtitan's own config: the model, the cluster, the
global batch and the layout, under the names ``bubblescope plan`` takes (docs/integrations.md), so that the run's
suggestions are priced by the same model as ``plan`` (``analysis/memory_fixes.declared_plan``).

Read off torchtitan 0.3.0's ``Trainer.Config`` (``model_spec.model``, ``training``, ``parallelism``,
``activation_checkpoint``, ``compile``) and the trainer's ``parallel_dims``:
- the model: a decoder whose blocks are alike (``dim``, ``vocab_size``, ``layers``; each block's attention heads,
  key/value heads and head width, and its feed-forward width, gated when it has a ``w3``, or its mixture of experts:
  their count, top-k, width and shared experts; rotary positions, no position table); blocks that differ, or that
  the planner cannot take (DeepSeek's latent attention, gpt-oss's and Muse Glimmer's sliding windows), declare no
  model;
- the cluster: the GPU ``BUBBLESCOPE_GPU`` names (the planner's name, or the device's as torch reports it), else the
  CUDA device's own name; the world size; ``LOCAL_WORLD_SIZE`` GPUs a node. No GPU, no cluster: nothing is priced;
- the global batch (``training.global_batch_size``, else the local batch times dp_replicate·dp_shard); with a
  pipeline, one accumulation step's (local batch times dp), as torchtitan flushes its pipeline once per accumulation
  step;
- the layout: tp, pp, cp, ep (its experts not tensor-parallel: etp 1; its dispatcher, all-to-all or DeepEP's) and
  the micro-batch (the pipeline's, else the local batch); ZeRO 3 where FSDP shards (the planner's ZeRO 3 with a
  pipeline is FSDP as torchtitan runs it there); torchtitan's selective activation checkpointing is per op (``op``),
  ``FullAC`` is ``full``; Float8 linears are ``fp8``; ``compile`` when the model is compiled; async TP is
  ``tp_comm_overlap``; CP gathers the keys and values (``allgather``: FlexAttention's ``flex_cp_allgather`` and SDPA's
  context-parallel dispatcher alike); fused attention priced as ``flash2``: torchtitan 0.3.0's language models run
  FlexAttention (its default), its FLASH backend or varlen (FlashAttention-2), and FlexAttention as torchtitan
  compiles it runs at FlashAttention-2's speed (1.0-1.2× it; 0.57-0.67 of cuDNN's, measured on an H200,
  docs/planner.md; the FLASH backend's price is unverified);
  gradients reduce in fp32 (``mixed_precision_reduce``); the pipeline's layers per stage as torchtitan's own split
  makes them; ``projections``: the MLP's w1 and w3 apart, as torchtitan runs them, and Q, K and V in one GEMM where
  the blocks' attention is ``FusedQKVLinear`` (``fuse_qkv``, its Llama 3 flavors' default: ``fused_qkv``), else
  apart (``QKVLinear``: ``separate``).

Nothing here raises into training: a config it cannot read declares nothing (``{}``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

from bubblescope.collector.config import env_setting

log = logging.getLogger("bubblescope.integrations.torchtitan")


def planner_declaration(trainer: Any) -> dict[str, Any]:
    """The run config's planner fields for a built torchtitan Trainer (module docstring); ``{}`` where unreadable."""
    try:
        return _declaration(trainer.config, trainer.parallel_dims)
    # torchtitan's config moves between releases: declare nothing rather than fail the training job
    except Exception as error:  # noqa: BLE001
        log.warning(
            "bubblescope: torchtitan's config not declared to the planner (%s: %s)", type(error).__name__, error
        )
        return {}


def _declaration(config: Any, dims: Any) -> dict[str, Any]:
    training, parallelism = config.training, config.parallelism
    out: dict[str, Any] = {}
    model = model_fields(config.model_spec, training.seq_len)
    if model is not None:
        out["model"] = model
    gpu = gpu_name()
    if gpu is not None:
        out["cluster"] = {"gpu": gpu, "gpus": dims.world_size, "gpus_per_node": _gpus_per_node(dims.world_size)}
    data_parallel = dims.dp_replicate * dims.dp_shard
    local = training.local_batch_size
    # with a pipeline, torchtitan flushes it once per accumulation step: the planner prices one flush (its bubble is
    # the schedule's over local / micro-batch, not over the whole batch's micro-batches)
    accumulated = training.global_batch_size > 0 and dims.pp == 1
    out["global_batch"] = training.global_batch_size if accumulated else local * data_parallel
    out |= {"tp": dims.tp, "pp": dims.pp, "cp": dims.cp, "ep": dims.ep}
    if dims.ep > 1:
        out["etp"] = 1  # torchtitan's experts are not tensor-parallel (Megatron's, the planner's etp 0, follow tp)
    dispatcher = _dispatcher(config.model_spec.model)
    if dispatcher is not None:
        out["dispatcher"] = dispatcher
    out["microbatch_size"] = parallelism.pipeline_parallel_microbatch_size if dims.pp > 1 else local
    out["zero"] = _zero(dims)
    recompute = _recompute(config.activation_checkpoint)
    if recompute is not None:
        out["recompute"] = recompute
    out["sequence_parallel"] = dims.tp > 1 and bool(parallelism.enable_sequence_parallel)
    out["precision"] = "fp8" if _float8_linears(config.model_spec.model) else "bf16"
    out["compile"] = bool(config.compile.enable) and "model" in config.compile.components
    # FlexAttention autotuned as torchtitan compiles it ran at 1.0-1.2× FlashAttention-2's speed on an H200
    # (bench/gpu_attention_backends.py); torchtitan 0.3.0 refuses SDPA for a language model (its SDPA, cuDNN first,
    # is Flux's)
    out["attention_kernel"] = "flash2"
    out["tp_comm_overlap"] = dims.tp > 1 and bool(config.compile.enable_async_tensor_parallel)
    out["grad_reduce"] = "fp32" if training.mixed_precision_reduce == "float32" else "bf16"
    if dims.cp > 1:
        out["cp_comm"] = "allgather"
    if model is not None:
        out["projections"] = _projections(config.model_spec.model)
    if dims.pp > 1 and model is not None:
        split = layers_per_stage(config, dims)
        if split is not None:
            out["layers_per_stage"] = split
    return out


def model_fields(spec: Any, seq: int) -> dict[str, Any] | None:
    """The planner's model fields of a decoder whose blocks are alike (dense, or each a mixture of the same experts);
    None for blocks that differ or that it cannot read (DeepSeek's latent attention, dense first layers)."""
    model = spec.model
    blocks = list(model.layers)
    try:
        shapes = {tuple(sorted(_block_fields(block).items())) for block in blocks}
    except (AttributeError, TypeError, ValueError):
        return None
    if len(shapes) != 1:
        return None
    fields: dict[str, Any] = {
        "name": f"{spec.name}-{spec.flavor}",
        "layers": len(blocks),
        "hidden": model.dim,
        "vocab": model.vocab_size,
        "seq": seq,
        "tied_embeddings": bool(getattr(model, "enable_weight_tying", False)),
        "learned_positions": False,  # rotary positions in attention: torchtitan's decoders have no position table
        **dict(shapes.pop()),
    }
    head_dim = fields.pop("head_dim")
    if head_dim and head_dim * fields["heads"] != model.dim:
        fields["head_dim"] = head_dim
    return fields


def _block_fields(block: Any) -> dict[str, Any]:
    """One block's heads, key/value heads, head width and feed-forward: a dense MLP's width (gated with a ``w3``),
    or a mixture of experts' count, top-k, expert width and shared experts (in expert widths); raises where a field
    is missing or is not the planner's."""
    attention = block.attention
    if _windowed(attention):
        raise ValueError("sliding-window attention, which the planner prices as full")
    heads = int(attention.n_heads)
    fields: dict[str, Any] = {
        "heads": heads,
        "kv_heads": int(getattr(attention, "n_kv_heads", None) or heads),
        "head_dim": getattr(attention, "head_dim", None) or getattr(attention.qkv_linear, "head_dim", None),
    }
    moe = getattr(block, "moe", None)
    if moe is None:
        feed_forward = block.feed_forward
        return fields | {"ffn_hidden": int(feed_forward.w1.out_features), "gated_mlp": feed_forward.w3 is not None}
    experts = moe.routed_experts.inner_experts
    width = int(experts.hidden_dim)
    shared = moe.shared_experts
    shared_width = 0 if shared is None else int(shared.w1.out_features)
    if shared_width % width:
        raise ValueError(f"shared experts {shared_width} wide, not a whole number of {width}-wide experts")
    return fields | {
        "experts": int(moe.num_experts),
        "top_k": int(moe.router.top_k),
        "moe_ffn_hidden": width,
        "shared_experts": shared_width // width,
        "gated_mlp": True,  # torchtitan's grouped experts: w1, w2 and w3 (SwiGLU)
    }


def _projections(model: Any) -> str:
    """``fused_qkv`` where the first block's attention projects Q, K and V in one GEMM (``FusedQKVLinear``'s ``wqkv``),
    else ``separate`` (``QKVLinear``'s wq, wk and wv); torchtitan's MLPs run w1 and w3 apart either way."""
    attention = model.layers[0].attention
    return "fused_qkv" if hasattr(getattr(attention, "qkv_linear", attention), "wqkv") else "separate"


def _windowed(config: Any) -> bool:
    """Whether an attention config, or one nested in it, sets a window (gpt-oss's ``sliding_window_size``, an inner
    attention's ``window_size`` other than unlimited ``(-1, ...)``)."""
    for item in dataclasses.fields(config):
        value = getattr(config, item.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            if _windowed(value):
                return True
            continue
        unlimited = value in (None, 0, -1) or (isinstance(value, tuple) and bool(value) and value[0] == -1)
        if "window" in item.name and not unlimited:
            return True
    return False


def _float8_linears(model: Any) -> bool:
    """Whether torchtitan's Float8 converter swapped the first block's linears (``Float8Linear.Config``): its
    attention's output projection, or its dense feed-forward's first."""
    block = model.layers[0]
    linears = (getattr(block.attention, "wo", None), getattr(getattr(block, "feed_forward", None), "w1", None))
    return any("Float8" in type(linear).__qualname__ for linear in linears if linear is not None)


def _dispatcher(model: Any) -> str | None:
    """How the routed tokens of the first mixture of experts travel (its ``token_dispatcher``): DeepEP's or
    HybridEP's kernels, else all-to-all; None for a dense model."""
    moe = next((block.moe for block in model.layers if getattr(block, "moe", None) is not None), None)
    if moe is None:
        return None
    kind = type(getattr(getattr(moe, "routed_experts", None), "token_dispatcher", None)).__qualname__.lower()
    return "hybridep" if "hybridep" in kind else "deepep" if "deepep" in kind else "alltoall"


def _zero(dims: Any) -> int:
    """FSDP over dp_shard (and cp) is the planner's ZeRO 3 (with a pipeline, its FSDP as torchtitan runs it: the
    weights gathered once a step); data parallelism by replicas alone is 0. HSDP (replicas of FSDP groups) is read
    as ZeRO 3 over every data-parallel rank: the planner has no shard group smaller than dp."""
    return 3 if dims.dp_shard * dims.cp > 1 else 0


def _recompute(policy: Any) -> str | None:
    """torchtitan's activation-checkpointing policy (its config; ``None`` for none) as the planner's recompute: a
    ``SelectiveAC`` (or a subclass of it) per op, ``FullAC`` full; a memory budget is not the planner's (None)."""
    if policy is None:
        return "none"
    names = {cls.__qualname__ for cls in type(policy).__mro__}
    if "SelectiveAC.Config" in names:
        return "op"
    if "FullAC.Config" in names:
        return "full"
    return None


def layers_per_stage(config: Any, dims: Any) -> list[int] | None:
    """Each pipeline stage's transformer blocks (every virtual stage, as the run's ``layers_per_stage`` counts them),
    first stage first, as torchtitan splits them: its own ``module_fqns_per_model_part``, else its
    ``_generate_llm_fqn_per_model_part`` (private: None where this torchtitan has no such function)."""
    parts = config.parallelism.module_fqns_per_model_part
    if parts is None:
        try:
            from torchtitan.distributed import pipeline_parallel

            stages, layers, first, last = pipeline_parallel._get_pipeline_metadata(
                dims, config.parallelism, config.model_spec.model
            )
            parts = pipeline_parallel._generate_llm_fqn_per_model_part(stages, layers, first, last)
        except (ImportError, AttributeError, TypeError, ValueError):
            return None
    counts = [sum(1 for name in part if str(name).startswith("layers.")) for part in parts]
    return counts if counts and all(counts) else None


def gpu_name() -> str | None:
    """``BUBBLESCOPE_GPU``, else the CUDA device's name as torch reports it; None without a GPU."""
    named = env_setting("gpu")
    if named:
        return str(named)
    import torch

    if not torch.cuda.is_available():
        return None
    return str(torch.cuda.get_device_name(torch.cuda.current_device()))


def _gpus_per_node(world_size: int) -> int:
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    return int(local) if local.isdigit() and int(local) > 0 else min(8, world_size)
