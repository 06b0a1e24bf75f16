"""What a torchtitan run declares to the planner, read from torchtitan's own config: the model, the cluster, the
global batch and the layout, under the names ``bubblescope plan`` takes (docs/collector.md), so that the run's
suggestions are priced by the same model as ``plan`` (``analysis/memory_fixes.declared_plan``).

Read off torchtitan 0.3.0's ``Trainer.Config`` (``model_spec.model``, ``training``, ``parallelism``,
``activation_checkpoint``, ``compile``) and the trainer's ``parallel_dims``:
- the model: a decoder whose blocks are alike (``dim``, ``vocab_size``, ``layers``; each block's attention heads,
  key/value heads and head width, its feed-forward width, gated when it has a ``w3``; rotary positions, no position
  table); a mixture of experts, or
  blocks that differ, declare no model (the planner's MoE fields are not read from torchtitan yet);
- the cluster: the GPU ``BUBBLESCOPE_GPU`` names (the planner's name, or the device's as torch reports it), else the
  CUDA device's own name; the world size; ``LOCAL_WORLD_SIZE`` GPUs a node. No GPU, no cluster: nothing is priced;
- the layout: tp, pp, cp, ep and the micro-batch (the pipeline's, else the local batch); ZeRO 3 where FSDP shards
  (the planner's ZeRO 3 with a pipeline is FSDP as torchtitan runs it there); torchtitan's selective activation checkpointing is per op (``op``), ``FullAC`` is ``full``; Float8
  linears are ``fp8``; ``compile`` when the model is compiled; CP gathers the keys and values (``allgather``:
  FlexAttention's ``flex_cp_allgather`` and SDPA's context-parallel dispatcher alike); its fused attention is priced
  as ``flash2`` (FlexAttention and SDPA as the calibration's torchtitan rows ran); gradients reduce in fp32
  (``mixed_precision_reduce``); the pipeline's layers per stage as torchtitan's own split makes them.

Nothing here raises into training: a config it cannot read declares nothing (``{}``).
"""

from __future__ import annotations

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
    out["global_batch"] = training.global_batch_size if training.global_batch_size > 0 else local * data_parallel
    out |= {"tp": dims.tp, "pp": dims.pp, "cp": dims.cp, "ep": dims.ep}
    out["microbatch_size"] = parallelism.pipeline_parallel_microbatch_size if dims.pp > 1 else local
    out["zero"] = _zero(dims)
    recompute = _recompute(type(config.activation_checkpoint).__qualname__)
    if recompute is not None:
        out["recompute"] = recompute
    out["sequence_parallel"] = dims.tp > 1 and bool(parallelism.enable_sequence_parallel)
    out["precision"] = "fp8" if _float8_linears(config.model_spec.model) else "bf16"
    out["compile"] = bool(config.compile.enable) and "model" in config.compile.components
    out["attention_kernel"] = "flash2"
    out["grad_reduce"] = "fp32" if training.mixed_precision_reduce == "float32" else "bf16"
    if dims.cp > 1:
        out["cp_comm"] = "allgather"
    if dims.pp > 1 and model is not None:
        split = layers_per_stage(config, dims)
        if split is not None:
            out["layers_per_stage"] = split
    return out


def model_fields(spec: Any, seq: int) -> dict[str, Any] | None:
    """The planner's model fields of a decoder whose blocks are alike; None for a mixture of experts or mixed blocks."""
    model = spec.model
    blocks = list(model.layers)
    shapes = {_block_shape(block) for block in blocks}
    if len(shapes) != 1 or None in shapes:
        return None
    heads, kv_heads, head_dim, ffn, gated = shapes.pop()  # type: ignore[misc]
    fields: dict[str, Any] = {
        "name": f"{spec.name}-{spec.flavor}",
        "layers": len(blocks),
        "hidden": model.dim,
        "heads": heads,
        "kv_heads": kv_heads,
        "ffn_hidden": ffn,
        "vocab": model.vocab_size,
        "seq": seq,
        "gated_mlp": gated,
        "tied_embeddings": bool(getattr(model, "enable_weight_tying", False)),
        "learned_positions": False,  # rotary positions in attention: torchtitan's decoders have no position table
    }
    if head_dim and head_dim * heads != model.dim:
        fields["head_dim"] = head_dim
    return fields


def _block_shape(block: Any) -> tuple[int, int, int | None, int, bool] | None:
    if getattr(block, "moe", None) is not None:
        return None
    attention, feed_forward = block.attention, block.feed_forward
    heads = attention.n_heads
    kv_heads = getattr(attention, "n_kv_heads", None) or heads
    head_dim = getattr(attention, "head_dim", None) or getattr(getattr(attention, "qkv_linear", None), "head_dim", None)
    gated = getattr(feed_forward, "w3", None) is not None
    return heads, kv_heads, head_dim, feed_forward.w1.out_features, gated


def _float8_linears(model: Any) -> bool:
    """Whether torchtitan's Float8 converter swapped the first block's linears (``Float8Linear.Config``): its
    attention's output projection, or its dense feed-forward's first."""
    block = model.layers[0]
    linears = (getattr(block.attention, "wo", None), getattr(getattr(block, "feed_forward", None), "w1", None))
    return any("Float8" in type(linear).__qualname__ for linear in linears if linear is not None)


def _zero(dims: Any) -> int:
    """FSDP over dp_shard (and cp) is the planner's ZeRO 3 (with a pipeline, its FSDP as torchtitan runs it: the
    weights gathered once a step); data parallelism by replicas alone is 0."""
    return 3 if dims.dp_shard * dims.cp > 1 else 0


def _recompute(policy: str) -> str | None:
    if policy.startswith("SelectiveAC"):
        return "op"
    if policy.startswith("FullAC"):
        return "full"
    if policy.startswith(("NoAC", "NoneType")):
        return "none"
    return None  # a memory budget, or a policy of the user's: the planner's default


def layers_per_stage(config: Any, dims: Any) -> list[int] | None:
    """Each pipeline stage's transformer blocks (every virtual stage, as the run's ``layers_per_stage`` counts them)
    as torchtitan splits them (its own ``module_fqns_per_model_part``,
    else its ``_generate_llm_fqn_per_model_part``), first stage first; None where it cannot be read."""
    parts = config.parallelism.module_fqns_per_model_part
    if parts is None:
        from torchtitan.distributed import pipeline_parallel

        stages, layers, first, last = pipeline_parallel._get_pipeline_metadata(
            dims, config.parallelism, config.model_spec.model
        )
        parts = pipeline_parallel._generate_llm_fqn_per_model_part(stages, layers, first, last)
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
