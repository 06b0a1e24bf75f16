"""How big a pipeline stage's module is: its layers and its parameters, read once when the stage is
instrumented, so that the service can rebalance stages without the job declaring its layer split.

Layers: a module's ``layers`` container (torchtitan's and Hugging Face's decoder stacks: a ModuleList
or a ModuleDict, whose pruned entries a pipeline split leaves as None) when it has one, else its
direct children that hold parameters (an ``nn.Sequential`` of Linear and activation blocks counts
its Linears), else 1 for a module with parameters of its own.
"""

from __future__ import annotations

from typing import Any


def module_size(module: Any) -> tuple[int, int] | None:
    """(layers, parameters) of ``module``; None when it cannot be read (never raises)."""
    try:
        params = sum(int(p.numel()) for p in module.parameters())
        stack = getattr(module, "layers", None)
        if stack is not None and hasattr(stack, "__len__") and hasattr(stack, "children"):
            layers = sum(1 for child in stack.children() if child is not None)
        else:
            layers = sum(1 for child in module.children() if next(child.parameters(), None) is not None)
        if layers == 0 and params:
            layers = 1
        return layers, params
    except Exception:  # noqa: BLE001 - an unusual module: no sizes, nothing else lost
        return None


def stage_sizes(modules: list[Any]) -> dict[str, list[int]]:
    """The registration fields for a rank's stage modules, in its stage order ({} if any is unreadable)."""
    sizes = [module_size(module) for module in modules]
    if not sizes or any(size is None or size[0] < 1 for size in sizes):
        return {}
    return {
        "stage_layers": [size[0] for size in sizes if size is not None],
        "stage_params": [size[1] for size in sizes if size is not None],
    }
