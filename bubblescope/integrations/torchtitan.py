"""torchtitan's trainer, instrumented: compute, communication per mesh dimension, the optimizers, the data loader
and each step under torchtitan's own step number.

    torchrun --nproc-per-node 8 -m bubblescope.integrations.torchtitan --module llama3 --config llama3_8b ...

takes torchtitan's own arguments and runs ``torchtitan.train``; ``instrument(trainer)`` does the same for a
Trainer built by hand, before ``trainer.train()``. What it does, once the trainer has set up the process group:
- ``collector.init`` (run name: ``BUBBLESCOPE_RUN``, else ``torchtitan-<model>-<flavor>``; the run's config holds
  the model, cluster, global batch and layout as the planner takes them, ``torchtitan_plan``, and with pipeline
  parallelism the micro-batch size);
- ``register_mesh(trainer.parallel_dims)``: each rank's coordinate in pp / dp / tp / cp / ep, torchtitan's
  data-parallel meshes (fsdp, dp_shard, dp_replicate, ...) as ``dp`` (``collector.mesh_dimensions``);
- compute: the pipeline schedule (``instrument``) where pipeline parallelism is on, else ``instrument_model``
  on each model part (with ``BUBBLESCOPE_MODEL_BLOCKS=1``, each of its ``layers`` priced as a block);
- ``instrument_optimizer`` on each optimizer of the container, ``timed_batches`` around the data iterator, and
  ``collector.step(trainer.step)`` around each ``train_step``;
- ``collector.shutdown()`` when training ends.
"""

from __future__ import annotations

import functools
import os
from typing import Any

from bubblescope import collector
from bubblescope.collector.config import env_setting
from bubblescope.integrations.torchtitan_plan import planner_declaration


def run_name(trainer: Any) -> str:
    spec = getattr(getattr(trainer, "config", None), "model_spec", None)
    name = os.environ.get("BUBBLESCOPE_RUN")
    if name:
        return name
    return f"torchtitan-{getattr(spec, 'name', 'model')}-{getattr(spec, 'flavor', 'run')}"


def run_config(trainer: Any) -> dict[str, Any]:
    """What the run registers of torchtitan's config: the model, cluster, global batch and layout as the planner
    takes them (``torchtitan_plan``), so its suggestions are priced as ``bubblescope plan`` prices; with pipeline
    parallelism the micro-batch size (the suggestions' micro-batch changes are said in it,
    ``--parallelism.pipeline_parallel_microbatch_size``) whatever else could be read."""
    declared = planner_declaration(trainer)
    config = getattr(trainer, "config", None)
    parallelism = getattr(config, "parallelism", None)
    micro = getattr(parallelism, "pipeline_parallel_microbatch_size", None)
    if getattr(trainer.parallel_dims, "pp_enabled", False) and isinstance(micro, int) and micro > 0:
        declared["microbatch_size"] = micro
    return declared


def instrument(trainer: Any) -> Any:
    """Instrument a built torchtitan Trainer (module docstring); returns it."""
    collector.init(run=run_name(trainer), config=run_config(trainer))
    collector.register_mesh(trainer.parallel_dims)
    schedule = getattr(trainer, "pp_schedule", None)
    if getattr(trainer.parallel_dims, "pp_enabled", False) and schedule is not None:
        collector.instrument(schedule)
    else:
        blocks = bool(env_setting("model_blocks"))
        for part in trainer.model_parts:
            collector.instrument_model(part, blocks=getattr(part, "layers", None) if blocks else None)
    for optimizer in getattr(trainer.optimizers, "optimizers", [trainer.optimizers]):
        collector.instrument_optimizer(optimizer)
    batches = trainer.batch_generator
    trainer.batch_generator = lambda dataloader: collector.timed_batches(batches(dataloader))
    train_step = trainer.train_step

    @functools.wraps(train_step)
    def timed_step(*args: Any, **kwargs: Any) -> Any:
        with collector.step(trainer.step):
            return train_step(*args, **kwargs)

    trainer.train_step = timed_step
    return trainer


def main() -> None:
    """``torchtitan.train``'s main, its Trainer instrumented before training."""
    from torchtitan import train as titan_train
    from torchtitan.trainer import Trainer

    train = Trainer.train

    def instrumented_train(self: Any) -> Any:
        instrument(self)
        try:
            return train(self)
        finally:
            collector.shutdown()

    Trainer.train = instrumented_train  # type: ignore[method-assign]
    titan_train.main()


if __name__ == "__main__":
    main()
