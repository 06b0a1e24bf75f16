"""One plan request as plain data, shared by the CLI and the API so both mean the same thing.

A request is ``{"model": preset | {fields}, "cluster": preset | {"gpu", "gpus", "gpus_per_node"},
"global_batch": B, "config": {fields} | null, "fixed": {fields} | null, "top": N}``. With ``config``
the one configuration is evaluated (missing fields take ``ParallelConfig``'s defaults; sequence
parallelism defaults to on when tp > 1, the schedule to interleaved 1F1B when vpp > 1); without it
the space is searched, holding any ``fixed`` fields. Errors are ``PlanInputError`` naming the field.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from bubblescope.analysis.planner.efficiencies import constants_said
from bubblescope.analysis.planner.empty_answer import why_nothing_runs
from bubblescope.analysis.planner.evaluate import Plan, evaluate, structural_problems
from bubblescope.analysis.planner.search import (
    LONG_SEQUENCE,
    candidates,
    layouts,
    pipeline_fields_without_pipeline,
    search,
)
from bubblescope.analysis.planner.specs import (
    CHOICES,
    ClusterSpec,
    ModelSpec,
    ParallelConfig,
    PlanInputError,
    boolean,
    cluster_preset,
    fp8_all_gather_problem,
    make_cluster,
    model_from,
    one_of,
    overlap_param_gather_problem,
    positive_float,
    positive_int,
)
from bubblescope.analysis.planner.step_time import attention_kernel_share
from bubblescope.analysis.schedules import DEFAULT_SCHEDULE, INTERLEAVED_1F1B, ScheduleError, lookup

CONFIG_ALIASES = {
    "t": "tp",
    "p": "pp",
    "d": "dp",
    "v": "vpp",
    "microbatch": "mbs",
    "micro_batch_size": "mbs",
    "sp": "sequence_parallel",
    "flash": "flash_attention",
    "tp_overlap": "tp_comm_overlap",
    "expert_tensor_parallel_size": "etp",  # Megatron's
    "expert_tensor_parallel_degree": "etp",  # torchtitan's
    "expert_model_parallel_size": "ep",
    "expert_parallel_degree": "ep",  # torchtitan's: its experts' tp defaults to 1 (``TORCHTITAN_EP``)
    "enable_fsdp_float8_all_gather": "fp8_all_gather",
    "fp8_param_gather": "fp8_all_gather",
}
#: ep under torchtitan's name: without an etp, torchtitan's default expert_tensor_parallel_degree (1) holds, where
#: Megatron's (and the planner's, etp 0) is the layout's tp.
TORCHTITAN_EP = "expert_parallel_degree"
_INT_FIELDS = ("tp", "pp", "dp", "vpp", "mbs", "cp", "ep", "etp", "first_stage_layers", "last_stage_layers")
_BOOL_FIELDS = (
    "sequence_parallel",
    "flash_attention",
    "tp_comm_overlap",
    "compile",
    "fp8_all_gather",
    "kv_repeated",
    "overlap_param_gather",
)
#: Every field a configuration takes (``config`` and ``fixed``), in the order the unknown-field answer names them.
CONFIG_FIELDS = (
    "tp",
    "pp",
    "dp",
    "vpp",
    "mbs",
    "schedule",
    "zero",
    "recompute",
    "sequence_parallel",
    "flash_attention",
    "precision",
    "layers_per_stage",
    "first_stage_layers",
    "last_stage_layers",
    "tp_comm_overlap",
    "cp",
    "cp_comm",
    "ep",
    "etp",
    "dispatcher",
    "capacity_factor",
    "grad_reduce",
    "compile",
    "fp8_all_gather",
    "attention_kernel",
    "kv_repeated",
    "overlap_param_gather",
    "projections",
)
MAX_STAGES = 4096
#: What a configuration assumes where the request is silent, said in the answer (``assumed``).
DEFAULTS_SAID = {
    "flash_attention": "flash_attention: true (fused attention that stores no s×s scores, as every 2026 run uses)",
    "precision": "precision: bf16 (fp8 runs the linear GEMMs in FP8)",
    "sequence_parallel": "sequence_parallel: on when tp > 1",
    "grad_reduce": "grad_reduce: fp32 (gradients reduced in fp32, as Megatron-LM and torchtitan do by default)",
    "attention_kernel": "attention_kernel: cudnn (cuDNN's fused attention: Transformer Engine's, and torch's SDPA's on"
    " Hopper and Blackwell with a recent cuDNN; flash2's forward runs at 0.55 of it on Hopper)",
    "overlap_param_gather": "overlap_param_gather: false (ZeRO-1/2 gather the updated weights after the optimizer's"
    " step, in the open, as Megatron-LM and DeepSpeed do by default; true hides it under the next forward)",
    "compile": "compile: true (element-wise kernels fused: torch.compile, Megatron's fused kernels)",
    "tp_comm_overlap": "tp_comm_overlap: false (tensor-parallel collectives in the open between the GEMMs)",
    "projections": "projections: fused (Q, K and V in one GEMM and a gated MLP's w1 and w3 in one, as Megatron-LM and"
    " Transformer Engine run them; separate: torchtitan's Llama before fuse_qkv, Hugging Face's)",
}
#: The attention kernel's default where FlashAttention-2's forward is priced as cuDNN's (off Hopper).
ATTENTION_KERNEL_SAID_OFF_HOPPER = (
    "attention_kernel: cudnn (cuDNN's fused attention, Transformer Engine's; off Hopper flash2, FlashAttention-2, is"
    " priced alike forward, its backward 2.7× the forward where cuDNN's is 3.1×)"
)
#: Defaults said only where they bear on the request: context parallelism (a long sequence, or cp > 1), FP8, experts.
CONTEXT_DEFAULTS_SAID = {
    "cp_comm": "cp_comm: p2p (ring attention passing key/value blocks, Transformer Engine's; allgather is torch's)",
    "kv_repeated": "kv_repeated: false (keys and values travel at the KV heads' width, not repeated to every head)",
}
FP8_DEFAULTS_SAID = {"fp8_all_gather": "fp8_all_gather: false (ZeRO gathers the linear weights in bf16)"}
EXPERT_DEFAULTS_SAID = {
    "dispatcher": "dispatcher: alltoall (routed tokens travel by all-to-all, no node-level dedup)",
    "capacity_factor": "capacity_factor: 1.0 (an expert sized for an even share of the routed tokens)",
    "etp": "etp: tp (the experts split as the rest of the layer; torchtitan's expert_parallel_degree means etp 1)",
}
MAX_TOP = 1000
TP_OVERLAP_WITHOUT_TP = "tensor-parallel overlap needs tp > 1: at tp 1 there are no tensor-parallel collectives to hide"


class DuplicateKeyError(ValueError):
    """A JSON object names one key twice; which value a reader keeps is not said, so a plan refuses it. ``path``: the
    keys (and list indexes) from the document's top to the object holding it."""

    def __init__(self, key: str, path: tuple[str | int, ...] = ()) -> None:
        where = f" in {'.'.join(map(str, path))}" if path else ""
        super().__init__(f"{key!r} given twice in one object{where}")
        self.key = key
        self.path = path


class _KeyGivenTwice(dict[str, Any]):
    """An object the parser met with a key twice (``twice``), kept until the whole document is read, where its path is
    known (``json.loads`` builds the inner objects first)."""

    twice: str = ""


def unique_json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``' ``object_pairs_hook`` for a plan's documents (the API's body, the model and cluster files
    the command line reads): the object, marked where a key comes twice, as ``{"tp": 2, "tp": 4}``. It refuses
    nothing itself: a reader must call ``refuse_repeated_keys`` on the whole document, which names the key and where
    it sits (the path is known only once the parser is done)."""
    document: dict[str, Any] = {}
    for key, value in pairs:
        if key in document and not isinstance(document, _KeyGivenTwice):
            document = _KeyGivenTwice(document)
            document.twice = key
        document[key] = value
    return document


def refuse_repeated_keys(document: Any) -> None:
    """``DuplicateKeyError`` for the first object in ``document`` (read with ``unique_json_object``) that named a key
    twice, with the keys leading to it; without recursion, as deep as the parser went."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(document, ())]
    while stack:
        node, path = stack.pop()
        if isinstance(node, _KeyGivenTwice):
            raise DuplicateKeyError(node.twice, path)
        children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        stack.extend((value, (*path, key)) for key, value in reversed(list(children)))


def config_fields(raw: Mapping[str, Any], where: str = "config") -> dict[str, Any]:
    """Validated, canonical configuration fields (aliases such as t, p, d, v, sp accepted)."""
    if not isinstance(raw, Mapping):
        raise PlanInputError(where, "expected an object of configuration fields")
    fields: dict[str, Any] = {}
    given: dict[str, object] = {}  # each field's key as given: one field under two names (sp, sequence_parallel)
    for key, value in raw.items():
        name = CONFIG_ALIASES.get(str(key).lower(), str(key).lower())
        at = f"{where}.{key}"
        if name in given:
            raise PlanInputError(f"{where}.{name}", f"given twice (as {given[name]} and {key}); give it once")
        given[name] = key
        if name in _INT_FIELDS:
            fields[name] = positive_int(value, at)
        elif name == "zero":
            zero = int(value) if isinstance(value, str) and value.strip().isdigit() else value
            if isinstance(zero, bool) or zero not in (0, 1, 2, 3):
                raise PlanInputError(at, f"expected 0, 1, 2 or 3, got {value!r}")
            fields[name] = int(zero)
        elif name in CHOICES:
            fields[name] = one_of(value, CHOICES[name], at)
        elif name == "schedule":
            try:
                fields[name] = lookup(value, at)
            except ScheduleError as error:
                raise PlanInputError(at, error.message) from None
        elif name in _BOOL_FIELDS:
            fields[name] = boolean(value, at)
        elif name == "capacity_factor":
            fields[name] = positive_float(value, at)
        elif name == "layers_per_stage":
            if isinstance(value, str):  # the command line's 7/8/8/7
                value = [part.strip() for part in value.replace(":", "/").split("/")]
            if not isinstance(value, (list, tuple)) or not value or len(value) > MAX_STAGES:
                raise PlanInputError(at, f"expected a list of 1 to {MAX_STAGES} layer counts, first stage first")
            fields[name] = tuple(positive_int(count, f"{at}[{i}]") for i, count in enumerate(value))
        else:
            raise PlanInputError(at, f"unknown field; expected {', '.join(CONFIG_FIELDS[:-1])} or {CONFIG_FIELDS[-1]}")
    fields = with_framework_etp(fields, raw)
    if ("first_stage_layers" in fields or "last_stage_layers" in fields) and "layers_per_stage" in fields:
        raise PlanInputError(f"{where}.layers_per_stage", "give layers_per_stage or first/last_stage_layers, not both")
    return fields


def with_framework_etp(fields: dict[str, Any], given: Iterable[object]) -> dict[str, Any]:
    """``fields`` with etp 1 where ep > 1 came under torchtitan's name (one of the ``given`` keys) and no etp did:
    torchtitan's default, where Megatron's is the layout's tp (the planner's etp 0)."""
    if "etp" in fields or fields.get("ep", 1) <= 1 or all(str(key).lower() != TORCHTITAN_EP for key in given):
        return fields
    return {**fields, "etp": 1}


def stage_layout(fields: dict[str, Any], layers: int, where: str = "config") -> dict[str, Any]:
    """Megatron's ``--decoder-first/last-pipeline-num-layers``: first and last stage given, the rest split evenly
    over the middle stages, as ``layers_per_stage``; the other fields as they were."""
    first, last = fields.pop("first_stage_layers", None), fields.pop("last_stage_layers", None)
    if first is None and last is None:
        return fields
    pp = fields.get("pp", 1)
    given = "last_stage_layers" if last is not None else "first_stage_layers"
    if pp < 2:
        raise PlanInputError(f"{where}.{given}", f"{given} needs a pipeline: give pp ≥ 2 with it")
    middle_stages = pp - (first is not None) - (last is not None)
    rest = layers - (first or 0) - (last or 0)
    held = " + ".join(f"{name}_stage_layers {count}" for name, count in (("first", first), ("last", last)) if count)
    if middle_stages == 0:
        if rest:
            raise PlanInputError(f"{where}.{given}", f"the two stages hold {layers - rest} of {layers} layers")
        return {**fields, "layers_per_stage": (first, last)}
    if rest < middle_stages:
        why = (
            f"{held}: {layers - rest} layers, more than the model's {layers}"
            if rest < 0
            else f"{held}: {rest} of the model's {layers} layers left for {middle_stages} other stages; every stage"
            " needs at least one"
        )
        raise PlanInputError(f"{where}.{given}", why)
    if rest % middle_stages:
        raise PlanInputError(
            f"{where}.{given}",
            f"the other {rest} layers do not split evenly over the {middle_stages} other stages (Megatron's rule)",
        )
    per = rest // middle_stages
    stages = ([first] if first is not None else []) + [per] * middle_stages + ([last] if last is not None else [])
    return {**fields, "layers_per_stage": tuple(stages)}


def config_from(fields: Mapping[str, Any]) -> ParallelConfig:
    values = dict(fields)
    values.setdefault("schedule", INTERLEAVED_1F1B if values.get("vpp", 1) > 1 else DEFAULT_SCHEDULE)
    values.setdefault("vpp", values["schedule"].default_stages_per_rank)
    values.setdefault("sequence_parallel", values.get("tp", 1) > 1)
    return ParallelConfig(**values)


def cluster_from(value: Any, where: str = "cluster") -> ClusterSpec:
    """A preset name (``a100-80gb-x64``) or ``{"gpu": name | {fields}, "gpus": n, "gpus_per_node": k}``."""
    if isinstance(value, str):
        return cluster_preset(value)
    if not isinstance(value, Mapping):
        raise PlanInputError(where, "expected a cluster preset name or an object with gpu, gpus, gpus_per_node")
    known = ("gpu", "gpus", "gpus_per_node", "nodes_per_leaf", "oversubscription")
    extra = sorted(set(value) - set(known))
    if extra:
        raise PlanInputError(f"{where}.{extra[0]}", f"unknown field; expected {', '.join(known)}")
    for key in ("gpu", "gpus"):
        if key not in value:
            raise PlanInputError(f"{where}.{key}", "field required")
    return make_cluster(
        value["gpu"],
        value["gpus"],
        value.get("gpus_per_node", 8),
        where,
        value.get("nodes_per_leaf", 32),
        value.get("oversubscription", 1.0),
    )


@dataclass(frozen=True)
class PlanOutcome:
    model: ModelSpec
    cluster: ClusterSpec
    global_batch: int
    searched: bool
    plans: list[Plan]
    assumed: tuple[str, ...] = ()
    why_none: str | None = None  # a search that found nothing: why (``empty_answer.why_nothing_runs``)

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": "search" if self.searched else "evaluate",
            "model": {
                "name": self.model.name,
                "params": self.model.params,
                "layers": self.model.layers,
                "hidden": self.model.hidden,
                "ffn_hidden": self.model.ffn_hidden,
                "heads": self.model.heads,
                "kv_heads": self.model.kv_heads,
                "head_dim": self.model.head_dim,
                "experts": self.model.experts,
                "top_k": self.model.top_k,
                "active_params": self.model.active_params,
                "seq": self.model.seq,
                "vocab": self.model.vocab,
            },
            "cluster": {
                "gpu": self.cluster.gpu.name,
                "gpus": self.cluster.gpus,
                "gpus_per_node": self.cluster.gpus_per_node,
                "nodes_per_leaf": self.cluster.nodes_per_leaf,
                "oversubscription": self.cluster.oversubscription,
                "peak_tflops": self.cluster.gpu.peak_tflops,
                "memory_gib": self.cluster.gpu.memory_gib,
            },
            "global_batch": self.global_batch,
            "assumed": list(self.assumed),
            "plans": [plan.as_dict() for plan in self.plans],
            **({"why_none": self.why_none} if self.why_none else {}),
        }


def plan_document(document: Mapping[str, Any]) -> PlanOutcome:
    """Run one request (see the module docstring)."""
    if not isinstance(document, Mapping):
        raise PlanInputError("body", "expected an object")
    extra = sorted(set(document) - {"model", "cluster", "global_batch", "config", "fixed", "top"})
    if extra:
        raise PlanInputError(extra[0], "unknown field; expected model, cluster, global_batch, config, fixed, top")
    for key in ("model", "cluster", "global_batch"):
        if document.get(key) is None:
            raise PlanInputError(key, "field required")
    model = model_from(document["model"])
    cluster = cluster_from(document["cluster"])
    batch = positive_int(document["global_batch"], "global_batch")
    top = 10 if document.get("top") is None else positive_int(document["top"], "top")
    if top > MAX_TOP:
        raise PlanInputError("top", f"at most {MAX_TOP}")
    if document.get("config") is not None:
        if document.get("fixed") is not None:
            raise PlanInputError("fixed", "give either config (evaluate one) or fixed (search), not both")
        given = config_fields(document["config"])
        split_named = _split_named(given)
        fields = stage_layout(given, model.layers)
        config = config_from(fields).with_dp(cluster.gpus)
        if "sequence_parallel" not in fields and not config.splits_sequence(model.seq):
            config = replace(config, sequence_parallel=False)  # on by default only where the sequence splits over tp
        pipeline_only = pipeline_fields_without_pipeline(fields, config.pp)
        if pipeline_only:
            raise PlanInputError(f"config.{pipeline_only[0]}", pipeline_only[1])
        if config.tp_comm_overlap and config.tp == 1:
            raise PlanInputError("config.tp_comm_overlap", TP_OVERLAP_WITHOUT_TP)
        for field_name, message in structural_problems(model, cluster, config, batch):
            raise PlanInputError(f"config.{split_named.get(field_name, field_name)}", message)
        plans = [evaluate(model, cluster, config, batch)]
        return PlanOutcome(model, cluster, batch, False, plans, _assumed(fields, cluster, model))
    held = config_fields(document.get("fixed") or {}, "fixed")
    split_named = _split_named(held)
    fixed = stage_layout(held, model.layers, "fixed")
    if "layers_per_stage" in fixed and "pp" not in fixed:
        raise PlanInputError("fixed.pp", "give pp with layers_per_stage (or first/last_stage_layers)")
    fp8_gathers = (
        fp8_all_gather_problem(fixed.get("precision"), fixed.get("zero")) if fixed.get("fp8_all_gather") else None
    )
    if fp8_gathers:
        raise PlanInputError("fixed.fp8_all_gather", fp8_gathers)
    if fixed.get("tp_comm_overlap") and fixed.get("tp") == 1:
        raise PlanInputError("fixed.tp_comm_overlap", TP_OVERLAP_WITHOUT_TP)
    hidden_gather = overlap_param_gather_problem(fixed.get("zero")) if fixed.get("overlap_param_gather") else None
    if hidden_gather:
        raise PlanInputError("fixed.overlap_param_gather", hidden_gather)
    if "dp" in fixed and cluster.gpus % fixed["dp"]:
        raise PlanInputError("fixed.dp", f"dp={fixed['dp']} does not divide the {cluster.gpus} GPUs")
    plans = search(model, cluster, batch, top, fixed)
    blamed = None if plans or not fixed else fixed_field_refused(model, cluster, batch, fixed)
    if blamed:
        raise PlanInputError(f"fixed.{split_named.get(blamed[0], blamed[0])}", blamed[1])
    why_none = None if plans else why_nothing_runs(model, cluster, batch, fixed)
    return PlanOutcome(model, cluster, batch, True, plans, _assumed(fixed, cluster, model), why_none)


def _split_named(fields: Mapping[str, Any]) -> dict[str, str]:
    """{"layers_per_stage": the first/last-stage field given} where the split was given that way: a refusal names
    the field the request holds."""
    named = [key for key in ("last_stage_layers", "first_stage_layers") if key in fields]  # as stage_layout names them
    return {"layers_per_stage": named[0]} if named else {}


def fixed_field_refused(
    model: ModelSpec, cluster: ClusterSpec, batch: int, fixed: Mapping[str, Any]
) -> tuple[str, str] | None:
    """Where a search holding ``fixed`` found nothing: (field, why) for a fixed field that every configuration of the
    space is refused for, memory aside (FP8 on an A100, ep on a dense model, a cp the GPUs or the sequence do not
    split into); with no configuration at all, the fixed fields with the rest at their defaults. None: memory is
    what stops them."""
    blamed: dict[str, str] | None = None
    for cfg in candidates(model, cluster, batch, fixed):
        named = _fixed_problems(model, cluster, cfg.with_dp(cluster.gpus), batch, fixed)
        blamed = named if blamed is None else {field: why for field, why in blamed.items() if field in named}
        if not blamed:
            return None
    if blamed is None:
        dps = [dp for *_, dp in layouts(model, cluster, fixed)]
        if dps and all(batch % (dp * fixed.get("mbs", 1)) for dp in dps):
            return _batch_refused_by(fixed, batch)  # else the answer's why_none says no layout splits it
        probe = dict(fixed)
        pipelines = [p for p in range(2, model.layers + 1) if cluster.gpus % p == 0]
        if "pp" not in fixed and ("vpp" in fixed or "schedule" in fixed) and pipelines:
            probe["pp"] = pipelines[0]  # the search picks pp: what the held schedule or vpp meets on a pipeline
        blamed = _fixed_problems(model, cluster, config_from(probe).with_dp(cluster.gpus), batch, fixed)
    return next(iter(blamed.items()), None)


def _batch_refused_by(fixed: Mapping[str, Any], batch: int) -> tuple[str, str] | None:
    """(field, why) where a held dp is what leaves the global batch unsplit (a held mbs is named by the configurations
    made with it); None where no layout's replicas split it whatever is held."""
    if "dp" not in fixed:
        return None
    return "dp", f"global batch {batch} is not divisible by dp = {fixed['dp']} (each replica takes whole sequences)"


def _fixed_problems(
    model: ModelSpec, cluster: ClusterSpec, cfg: ParallelConfig, batch: int, fixed: Mapping[str, Any]
) -> dict[str, str]:
    """Each fixed field ``cfg``'s structural problems name, with the first reason given for it."""
    named: dict[str, str] = {}
    pipeline_only = pipeline_fields_without_pipeline(fixed, cfg.pp)
    for field, why in [*structural_problems(model, cluster, cfg, batch), *([pipeline_only] if pipeline_only else [])]:
        if field == "vpp" and "vpp" not in fixed and "schedule" in fixed:
            field = "schedule"  # the interleaved schedule held: the virtual stages the search tries are its
        if field == "schedule" and "schedule" not in fixed and "vpp" in fixed:
            field = "vpp"  # the virtual stages held: the interleaved schedule the search runs them with is theirs
        if field == "mbs" and batch % fixed.get("dp", 1):
            field = "dp"  # a held dp the batch does not split over, whatever the micro-batch
        if field in fixed:
            named.setdefault(field, why)
    return named


def _assumed(given: Mapping[str, Any], cluster: ClusterSpec, model: ModelSpec) -> tuple[str, ...]:
    """The defaults a request relied on, and the constants its GPU prices with, in words (the answer says them):
    context parallelism's where the sequence is long enough for the search to try it or cp > 1 is given, FP8's with
    precision fp8, the experts' on a mixture of experts."""
    said = dict(DEFAULTS_SAID)
    if attention_kernel_share(cluster.gpu, "flash2") == 1.0:
        said["attention_kernel"] = ATTENTION_KERNEL_SAID_OFF_HOPPER
    if given.get("cp", 1) > 1 or (model.seq >= LONG_SEQUENCE and "cp" not in given):
        said |= CONTEXT_DEFAULTS_SAID
    if given.get("precision") == "fp8":
        said |= FP8_DEFAULTS_SAID
    if model.moe:
        said |= EXPERT_DEFAULTS_SAID
    defaults = tuple(words for field, words in said.items() if field not in given)
    return (*defaults, constants_said(cluster.gpu))
