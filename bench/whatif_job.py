"""One torchrun job that runs the base pipeline and every what-if target interleaved, step by step.

Each round runs one step of the base configuration (recorded by the collector, as the service's
replay needs) and then one step of each target (inside ``collector.paused()``: nothing recorded),
all ranks in lock-step, so a change in the machine's speed falls on all of them alike. Rank 0 times
every step the same way (its own wall time; every step ends with the clipping's all-reduce, which
joins the ranks) and writes ``{"base": [...], "<label>": [...]}`` to ``--times-file``.
``bench/simulator_validation.py`` starts it and compares the replay's predictions with these times.

    torchrun --standalone --nproc-per-node 2 bench/whatif_job.py --schedule 1f1b --microbatches 4 \\
        --layers 3,1 --microbatch-size 64 --hidden 768 --rounds 20 --times-file times.json \\
        --targets '[{"label": "gpipe", "schedule": "gpipe", "microbatches": 4, "layers": [3, 1], "microbatch_size": 64}]'
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
import torch.distributed as dist

from bubblescope import collector
from bubblescope.demo_job import PipelinePart, build_parser, clip_grad_norm_across_stages, pipeline_part


def main() -> None:
    parser = build_parser()
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument(
        "--targets", required=True, help="JSON list of {label, schedule, microbatches, layers, microbatch_size}"
    )
    args = parser.parse_args()
    args.microbatch_size = args.microbatch_size or args.batch_size // args.microbatches
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    collector.init(run=args.run_name or "whatif-validation", config={"microbatch_size": args.microbatch_size})
    base = pipeline_part(args.schedule, args.microbatches, args.layers, args.layers_per_stage, args)
    runs: list[tuple[str, PipelinePart, Any, int]] = [
        ("base", base, collector.instrument(base.make_schedule()), args.microbatch_size)
    ]
    for target in json.loads(args.targets):
        part = pipeline_part(target["schedule"], target["microbatches"], target["layers"], args.layers_per_stage, args)
        runs.append((target["label"], part, part.make_schedule(), target["microbatch_size"]))
    optimizers = [torch.optim.SGD(part.parameters, lr=1e-3) for _, part, _, _ in runs]
    generator = torch.Generator().manual_seed(1234)
    times: dict[str, list[float]] = {label: [] for label, *_ in runs}
    for _ in range(args.rounds):
        for (label, part, schedule, microbatch_size), optimizer in zip(runs, optimizers):
            batch = part.microbatches * microbatch_size
            started = time.perf_counter()
            with contextlib.nullcontext() if label == "base" else collector.paused(), collector.step():
                with collector.span("data_loading"):
                    inputs = torch.randn(batch, args.hidden, generator=generator)
                    targets = torch.randn(batch, args.hidden, generator=generator)
                optimizer.zero_grad(set_to_none=True)
                part.step(schedule, inputs, targets)
                clip_grad_norm_across_stages(part.parameters, max_norm=1.0)
                with collector.span("optimizer"):
                    optimizer.step()
            times[label].append(time.perf_counter() - started)
    run_key = collector.run_key()
    collector.shutdown()
    if dist.get_rank() == 0 and args.times_file:
        Path(args.times_file).write_text(json.dumps({"run_key": run_key, "times": times}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
