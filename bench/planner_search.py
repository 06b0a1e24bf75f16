"""How long ``bubblescope plan``'s search takes on today's large runs, and what the fullest-rank memory shortcut saves.

For each case: the configurations the search makes, the seconds it takes (best of ``--repeat``), configurations a
second; then, over the pipelined configurations whose stages differ, the seconds ``memory_per_gpu`` takes (the
fullest middle rank found by its product, three ranks broken down) beside breaking down every rank and taking the
largest (``memory_per_pipeline_rank``), as a ratio, with the largest difference between the two answers.

    python bench/planner_search.py            # about a minute on a 2-core machine, idle
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from bubblescope.analysis.planner.memory import memory_per_gpu, memory_per_pipeline_rank
from bubblescope.analysis.planner.search import candidates, search
from bubblescope.analysis.planner.specs import MODEL_PRESETS, cluster_preset

CASES = (
    ("llama-3.1-405b", "h100-sxm-x16384", 2048),
    ("llama-3.1-405b", "h100-sxm-x1024", 512),
    ("qwen3-235b-a22b", "h100-sxm-x256", 2048),
    ("gpt-1t", "a100-80gb-x3072", 1536),
    ("llama-3-70b", "a100-80gb-x96", 1536),
)


def _search_seconds(model_name: str, cluster_name: str, batch: int, repeat: int) -> tuple[int, float]:
    model, cluster = MODEL_PRESETS[model_name], cluster_preset(cluster_name)
    made = sum(1 for _ in candidates(model, cluster, batch))
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        search(model, cluster, batch, top=10)
        best = min(best, time.perf_counter() - start)
    return made, best


def _memory_seconds(model_name: str, cluster_name: str, batch: int) -> tuple[int, float, float, float]:
    """(configurations, shortcut seconds, every-rank seconds, largest relative difference)."""
    model, cluster = MODEL_PRESETS[model_name], cluster_preset(cluster_name)
    shapes = []
    for config in candidates(model, cluster, batch):
        cfg = config.with_dp(cluster.gpus)
        if cfg.pp > 1 and batch % (cfg.dp * cfg.mbs) == 0:
            split = cfg.layers_per_stage or cfg.stage_layers(model.layers)
            shapes.append((replace(cfg, layers_per_stage=split), batch // (cfg.dp * cfg.mbs)))
    for cfg, microbatches in shapes:  # warm the schedules' cached chunk counts (built from action orders) for both
        memory_per_pipeline_rank(model, cluster, cfg, microbatches)
    start = time.perf_counter()
    fast = [memory_per_gpu(model, cluster, cfg, m).total for cfg, m in shapes]
    shortcut = time.perf_counter() - start
    start = time.perf_counter()
    full = [max(part.total for part in memory_per_pipeline_rank(model, cluster, cfg, m)) for cfg, m in shapes]
    every = time.perf_counter() - start
    apart = max((abs(a - b) / b for a, b in zip(fast, full, strict=True)), default=0.0)
    return len(shapes), shortcut, every, apart


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    print(f"{'model':<16} {'cluster':<17} {'batch':>5} {'configs':>8} {'search s':>9} {'configs/s':>9}")
    for name, cluster, batch in CASES:
        made, seconds = _search_seconds(name, cluster, batch, args.repeat)
        print(f"{name:<16} {cluster:<17} {batch:>5} {made:>8} {seconds:>9.2f} {made / seconds:>9.0f}")
    print()
    print(
        f"{'model':<16} {'cluster':<17} {'pipelined':>9} {'shortcut s':>10} {'every rank s':>12} {'ratio':>6} {'apart':>8}"
    )
    for name, cluster, batch in CASES:
        count, shortcut, every, apart = _memory_seconds(name, cluster, batch)
        ratio = every / shortcut if shortcut else float("nan")
        print(f"{name:<16} {cluster:<17} {count:>9} {shortcut:>10.2f} {every:>12.2f} {ratio:>6.1f} {apart:>8.1e}")


if __name__ == "__main__":
    main()
