"""torchtitan's ``ParallelDims`` as the analysis reads a mesh: one coordinate and one group label per dimension.

torchtitan names many one-dimensional meshes, several over the same ranks: the data-parallel ones (``dp_shard``,
``fsdp``, ``dp_replicate``, ``dp``, ``batch``, ``loss``, ``dp_cp``, ...) overlap, and ``world`` holds every rank.
The analysis wants independent dimensions: each rank's coordinate in them tells which of its peers share a
group. So:
- ``pp``, ``tp``, ``cp``, ``ep`` keep their names;
- of the data-parallel meshes, the largest (every data-parallel replica) is ``dp``, and every data-parallel
  group over exactly those ranks is labelled ``dp`` too; a smaller one (``dp_shard`` inside a replicated job)
  keeps its own name and gives no coordinate (its waits are not split, its time is);
- ``world`` and meshes of one rank are left out.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

MODEL_PARALLEL = ("pp", "tp", "cp", "ep")
DATA_PARALLEL_GROUP = "dp"


def _ranks(mesh: Any) -> tuple[int, ...]:
    return tuple(int(rank) for rank in mesh.mesh.flatten().tolist())


def parallel_dims_dimensions(parallel_dims: Any) -> Iterator[tuple[str, Any, int | None]]:
    """(label, process group, this rank's coordinate or None) for each dimension to register."""
    meshes = {name: mesh for name, mesh in parallel_dims.get_all_one_dimensional_meshes().items() if mesh.size() > 1}
    data = {name: mesh for name, mesh in meshes.items() if name not in (*MODEL_PARALLEL, "world")}
    largest = max(data.values(), key=lambda mesh: mesh.size(), default=None)
    replicas = _ranks(largest) if largest is not None else ()
    for name, mesh in meshes.items():
        if name == "world":
            continue
        coordinate = (mesh.get_coordinate() or [None])[0]
        if name in MODEL_PARALLEL:
            yield name, mesh.get_group(), coordinate
        elif _ranks(mesh) == replicas or sorted(_ranks(mesh)) == sorted(replicas):
            yield DATA_PARALLEL_GROUP, mesh.get_group(), coordinate
        else:
            yield name, mesh.get_group(), None
