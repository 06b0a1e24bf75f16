"""The wire format shared by the collector and the service (stdlib only).

A batch is one JSON object, optionally gzip-compressed (``Content-Encoding: gzip``)::

    {
      "run_key": "...", "rank": 0, "seq": 7, "dropped_spans": 0,
      "steps": [{"step": 3, "start_ns": ..., "end_ns": ..., "compute_ns": ...,
                 "comm_ns": ..., "idle_ns": ..., "span_count": 12, "peak_rss_bytes": ...}],
      "spans": {"step": [...], "kind": [...], "start_ns": [...], "end_ns": [...],
                "stage": [...], "microbatch": [...], "peer": [...], "bytes": [...],
                "group": [...], "name": [...]}
    }

A batch may also carry ``"in_flight"``: the collector's watchdog report of a step running far
past its usual length, sent every few seconds with no steps while it lasts (a rank's silence is
then a death, not a hang)::

    "in_flight": {"step": 5, "in_step": true, "elapsed_s": 41.2,
                  "op": {"kind": "recv", "name": "bwd", "group": "pp", "peer": 1,
                         "bytes": 4096, "elapsed_s": 40.9}}

``op`` is null when the rank is not blocked in a communication op (computing, or stuck in its
own code); ``in_step`` false means between steps (after step ``step - 1``). A batch with steps
and no ``in_flight`` means the rank is moving again.

``seq`` numbers a process's batches, increasing, from the process's clock in microseconds (so a
worker restarted under the same run key never repeats its predecessor's): the service stores a
(run, rank, seq) once, which makes a retry harmless.

The service answers ``{"stored_spans", "stored_steps", "duplicate", "captures": [{"id",
"steps", "from_step"}]}``; a capture asks for full spans of steps [from_step, from_step+steps).

Spans travel column-wise: one list per field, all of one length. That is about half the size
of row objects and lets the service validate and insert 100k+ spans/s without a per-span object.
Times are integer nanoseconds on the sending rank's clock, expressed as Unix epoch time; the
rank's offset to rank 0 is registered separately and applied by every cross-rank view.
"""

from __future__ import annotations

import gzip
import json
from typing import Any, Final

API_PREFIX: Final = "/api/v1"
MAX_BATCH_STEPS: Final = 10_000
"""Step aggregates in one batch: the collector flushes at this many, the service refuses more by default."""

COMPUTE_KINDS: Final = frozenset(
    {"forward", "backward", "backward_input", "backward_weight", "optimizer", "data_loading"}
)
COMMUNICATION_KINDS: Final = frozenset(
    {"send", "recv", "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"}
)
SPAN_KINDS: Final = COMPUTE_KINDS | COMMUNICATION_KINDS

# Column order of a span on the wire and in the collector's buffers.
SPAN_FIELDS: Final = (
    "step",
    "kind",
    "start_ns",
    "end_ns",
    "stage",
    "microbatch",
    "peer",
    "bytes",
    "group",
    "name",
)
REQUIRED_SPAN_FIELDS: Final = ("step", "kind", "start_ns", "end_ns")

MEMORY_FIELDS: Final = ("peak_rss_bytes", "gpu_peak_allocated_bytes", "gpu_peak_reserved_bytes", "gpu_alloc_retries")
"""A step aggregate's optional memory readings, each the step's own peak (reset at every step's
end): the process's peak resident set, and on a CUDA job the caching allocator's peak allocated and
reserved bytes and its allocation retries in the step."""

LAYERWISE_SCHEDULE: Final = "naive"
"""The schedule name a hand-written layer-wise split reports (``collector.LayerwiseStage``); torch's schedules
report their class names. The analysis' registry (``analysis.schedules.NAIVE``) carries it."""
WORLD_GROUP: Final = "world"
"""The group label of spans on the default process group (every rank takes part)."""
PIPELINE_GROUP: Final = "pp"
"""The group label of pipeline point-to-point transfers (and of a mesh's pipeline dimension)."""

BLOCK_SEPARATOR: Final = "/"
"""Joins a model's name and one of its blocks' in a block's compute spans (``instrument_model(model,
blocks=...)``): ``Transformer/layers.0``. The model's own spans carry its name alone."""


def block_span_name(model: str, block: str) -> str:
    """The name a block's forward and backward spans carry."""
    return f"{model}{BLOCK_SEPARATOR}{block}"


def block_of(span_name: str | None) -> str | None:
    """The block a compute span's name names (``layers.0`` of ``Transformer/layers.0``); None for a model's own."""
    if not span_name or BLOCK_SEPARATOR not in span_name:
        return None
    return span_name.split(BLOCK_SEPARATOR, 1)[1] or None


STAGE_LAYERS_MODEL: Final = "pipeline"
"""The model name of a pipeline stage's per-layer spans (the pipelining integration times each layer of a stage on
detailed steps): ``pipeline/stage1:layers.12``, the block naming the stage and the layer, so that blocks of
different stages never share a name."""


def stage_layer_span_name(stage: int, layer: str) -> str:
    """The name of the compute spans of layer ``layer`` (its name in the stage's module) of pipeline stage ``stage``."""
    return block_span_name(STAGE_LAYERS_MODEL, f"stage{stage}:{layer}")


def stage_layer_of(span_name: str | None) -> tuple[int, str] | None:
    """(stage, layer) of a stage layer's span name; None for any other name."""
    if not span_name or not span_name.startswith(STAGE_LAYERS_MODEL + BLOCK_SEPARATOR + "stage"):
        return None
    block = span_name[len(STAGE_LAYERS_MODEL) + len(BLOCK_SEPARATOR) + len("stage") :]
    stage, separator, layer = block.partition(":")
    if not separator or not stage.isdigit() or not layer:
        return None
    return int(stage), layer


IMPORTED_FROM: Final = "imported_from"
"""The run config key of a run imported from profiler traces (``bubblescope import-trace``): the format, each
rank's file, the job's world size, the profiler and the steps. Such a run is finished once its imported ranks
are, whatever the job's world size."""

# Names of pipeline point-to-point transfers: activations go forward, gradients backward.
P2P_FORWARD: Final = "fwd"
P2P_BACKWARD: Final = "bwd"

MAX_FLUSH_INTERVAL_S: Final = 60.0
"""The longest flush interval the service asks of a collector (``IngestResult.flush_interval_s``)."""


def flush_interval_for(world_size: int, batches_per_s: float) -> float:
    """The shortest interval between a rank's flushes for a run of ``world_size`` ranks to send at most
    ``batches_per_s`` batches a second in all (a collector that flushes less often keeps its own)."""
    return min(MAX_FLUSH_INTERVAL_S, world_size / batches_per_s)


GZIP_LEVEL: Final = 1  # fast; spans compress ~8x even at level 1


def spans_to_columns(rows: list[tuple[Any, ...]]) -> dict[str, list[Any]]:
    """Turn span tuples (in ``SPAN_FIELDS`` order) into the column-wise wire form."""
    if not rows:
        return {field: [] for field in SPAN_FIELDS}
    return {field: list(column) for field, column in zip(SPAN_FIELDS, zip(*rows))}


def encode_batch(batch: dict[str, Any]) -> bytes:
    """JSON-encode and gzip a batch for the wire."""
    body = json.dumps(batch, separators=(",", ":")).encode()
    return gzip.compress(body, compresslevel=GZIP_LEVEL)
