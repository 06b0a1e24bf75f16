"""torchtitan 0.3.0 on this CPU: the shims it needs beside torch 2.13 and gloo, then the command line given.

    torchrun --standalone --nproc-per-node 2 -m tests.integrations.titan_cpu <module> <arguments>

``<module>`` is the module whose ``main()`` runs next: ``torchtitan.train`` (plain) or
``bubblescope.integrations.torchtitan`` (instrumented). Each shim is for this machine only (torchtitan targets a
newer torch, on GPUs):
- the device type is ``cpu`` (torch.cuda is absent from the CPU build), and ``torch.cpu`` answers the few
  device-memory queries torchtitan's metrics make of a device (name, capacity, empty memory statistics);
- FlexAttention has no backward on CPU: its call runs ``scaled_dot_product_attention`` with the BlockMask's
  mask made dense (``create_mask``), the same attention, and the log-sum-exp where it is asked for;
- gloo has no ``PREMUL_SUM``: FSDP2's reduce-scatter with a divide factor of 1.0 (torchtitan normalises the loss
  by tokens itself) is a plain sum;
- torch 2.13 has no ``dist.set_timeout`` (and the CPU no device ids for a barrier): torchtitan's shortening of
  the process groups' timeouts after the first step is skipped (a barrier alone);
- torchtitan calls ``schedule.step(arg_mbs=..., kwarg_mbs=..., target_mbs=...)`` with its micro-batches made;
  torch 2.13's ``step`` splits a whole batch: those micro-batches are handed to its split, and the targets
  joined back (equal micro-batches split into the same ones).
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch._utils


def apply_shims() -> None:
    torch._utils._get_available_device_type = lambda: "cpu"
    cpu: Any = torch.cpu
    cpu.get_device_name = lambda *_args: "cpu"
    cpu.get_device_properties = lambda *_args: SimpleNamespace(
        total_memory=os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    )
    cpu.reset_peak_memory_stats = lambda *_args: None
    cpu.empty_cache = lambda *_args: None
    cpu.memory_stats = lambda *_args: {}
    from torchtitan.models.common.attention import FlexAttention

    FlexAttention.compiled_flex_attn = staticmethod(sdpa_with_dense_mask)
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives

    divide_factors = _fsdp_collectives._get_gradient_divide_factors

    def plain_sum_for_factor_one(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("factor", args[4] if len(args) > 4 else None) == 1.0:
            return None, None, torch.distributed.ReduceOp.SUM, torch.distributed.ReduceOp.SUM
        return divide_factors(*args, **kwargs)

    _fsdp_collectives._get_gradient_divide_factors = plain_sum_for_factor_one
    from torchtitan.distributed import utils as dist_utils

    dist_utils.set_pg_timeouts = lambda *_args, **_kwargs: torch.distributed.barrier()
    from torch.distributed.pipelining import schedules

    for schedule_class in (schedules.PipelineScheduleSingle, schedules.PipelineScheduleMulti):
        schedule_class.step = step_with_microbatches(schedule_class.step)  # type: ignore[method-assign]


def sdpa_with_dense_mask(
    q: Any,
    k: Any,
    v: Any,
    *,
    block_mask: Any = None,
    scale: Any = None,
    enable_gqa: bool = False,
    return_aux: Any = None,
    **_ignored: Any,
) -> tuple[Any, Any]:
    """FlexAttention's call, computed by SDPA over the block mask's dense mask (q, k, v: B, N, L, H)."""
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import create_mask

    mask = None
    if block_mask is not None:
        mask = create_mask(block_mask.mask_mod, None, None, q.shape[-2], k.shape[-2], device=q.device)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=enable_gqa)
    lse = None
    if return_aux is not None and getattr(return_aux, "lse", False):
        if enable_gqa and k.shape[1] != q.shape[1]:
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        scores = (q @ k.transpose(-2, -1)) * (scale if scale is not None else q.shape[-1] ** -0.5)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)
    return out, SimpleNamespace(lse=lse)


def step_with_microbatches(step: Any) -> Any:
    """``step`` taking torchtitan's ready-made micro-batches (arg_mbs, kwarg_mbs, target_mbs)."""

    def stepped(
        self: Any, *args: Any, arg_mbs: Any = None, kwarg_mbs: Any = None, target_mbs: Any = None, **kwargs: Any
    ) -> Any:
        if arg_mbs is None and kwarg_mbs is None and target_mbs is None:
            return step(self, *args, **kwargs)
        count = self._n_microbatches
        made = (arg_mbs if arg_mbs is not None else [()] * count, kwarg_mbs if kwarg_mbs is not None else [{}] * count)
        self._split_inputs = lambda _args, _kwargs: made
        try:
            target = torch.cat(target_mbs, dim=0) if target_mbs is not None else None
            return step(self, target=target, **kwargs)
        finally:
            del self._split_inputs

    return stepped


WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "a",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "they",
    "you",
    "were",
    "her",
    "she",
    "there",
    "one",
    "all",
    "we",
    "their",
]


def make_assets(folder: Path) -> tuple[Path, Path]:
    """A tiny byte-level BPE tokenizer (``tokenizer.json`` and its config) and a text dataset of JSON lines, made
    here: torchtitan's own test assets are not in its wheel, and the hub is not reachable. Returns their folders."""
    import json
    import random

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(400)) for _ in range(200)]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    special = ["<unk>", "<|begin_of_text|>", "<|end_of_text|>"]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tokenizer.train_from_iterator(
        texts, trainers.BpeTrainer(vocab_size=512, special_tokens=special, initial_alphabet=alphabet)
    )
    tokenizer_dir, dataset_dir = folder / "tokenizer", folder / "dataset"
    tokenizer_dir.mkdir(parents=True, exist_ok=True)
    dataset_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(tokenizer_dir / "tokenizer.json"))
    config = {"bos_token": special[1], "eos_token": special[2], "add_bos_token": True, "add_eos_token": True}
    (tokenizer_dir / "tokenizer_config.json").write_text(json.dumps(config))
    (dataset_dir / "data.json").write_text("".join(json.dumps({"text": text}) + "\n" for text in texts))
    return tokenizer_dir, dataset_dir


def main() -> None:
    apply_shims()
    target = sys.argv[1]
    sys.argv = [target, *sys.argv[2:]]
    importlib.import_module(target).main()


if __name__ == "__main__":
    main()
