"""How big a pipeline stage's module is: its layers and its parameters, read once when the stage is
instrumented, so that the service can rebalance stages without the job declaring its layer split.

Layers (``layer_groups``, also what the pipelining integration times layer by layer): a module's ``layers``
container (torchtitan's and Hugging Face's decoder stacks: a ModuleList or a ModuleDict, whose pruned entries a
pipeline split leaves as None) when it has one, each entry a layer; else its direct children that hold
parameters, each with the parameter-free children that follow it (an ``nn.Sequential`` of Linear and activation
blocks: a Linear and its activation are one layer); else 1 for a module with parameters of its own. What is not
in a layer (an embedding, a final norm, an output head beside the ``layers`` container) is the stage's own work,
which stays with it when layers move.
"""

from __future__ import annotations

from typing import Any

LayerGroup = tuple[str, list[Any]]
"""A layer's name in the stage's module and the modules it runs through, in order (first to last)."""


def layer_groups(module: Any) -> list[LayerGroup]:
    """The layers of ``module`` (module docstring), each as (name, modules); [] when it has none to time."""
    stack = getattr(module, "layers", None)
    if stack is not None and hasattr(stack, "__len__") and hasattr(stack, "named_children"):
        return [(f"layers.{name}", [child]) for name, child in stack.named_children() if child is not None]
    groups: list[LayerGroup] = []
    for name, child in module.named_children():
        if next(child.parameters(), None) is not None:
            groups.append((name, [child]))
        elif groups:
            groups[-1][1].append(child)
    return groups


def module_size(module: Any) -> tuple[int, int] | None:
    """(layers, parameters) of ``module``; None when it cannot be read (never raises)."""
    try:
        params = sum(int(p.numel()) for p in module.parameters())
        layers = len(layer_groups(module))
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
