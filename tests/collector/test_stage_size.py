"""The layers and parameters of a pipeline stage's module, as the collector counts them."""

from __future__ import annotations

from torch import nn

from bubblescope.collector.stage_size import layer_groups, module_size, stage_sizes


def test_a_sequential_stage_counts_its_parametrised_blocks() -> None:
    stage = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 4))
    assert module_size(stage) == (3, 2 * (64 + 8) + 32 + 4)


def test_a_decoder_stack_counts_its_layers_not_its_embedding_and_skips_pruned_ones() -> None:
    class Part(nn.Module):  # a torchtitan-style model part after the pipeline split
        def __init__(self) -> None:
            super().__init__()
            self.tok_embeddings = nn.Embedding(10, 4)
            self.layers = nn.ModuleDict({"0": nn.Linear(4, 4), "1": nn.Linear(4, 4), "2": nn.Linear(4, 4)})

    part = Part()
    assert module_size(part) == (3, 40 + 3 * 20)
    del part.layers["2"]  # a pipeline split prunes the layers of other stages
    assert module_size(part)[0] == 2  # type: ignore[index]


def test_a_module_with_only_its_own_parameters_is_one_layer_and_junk_is_no_answer() -> None:
    assert module_size(nn.Linear(2, 2)) == (1, 6)
    assert module_size(object()) is None
    assert stage_sizes([nn.Linear(2, 2), object()]) == {}  # all or nothing: counts line up with stages
    assert stage_sizes([nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))]) == {
        "stage_layers": [1, 2],
        "stage_params": [6, 12],
    }


def test_a_layer_is_a_parametrised_block_with_the_activation_after_it_and_the_stack_leaves_the_head_out() -> None:
    """What the pipelining integration times layer by layer: a Sequential's Linear with its GELU (one layer, so
    that moving it moves both); a decoder stack's entries, without the embedding or head beside them."""
    stage = nn.Sequential(nn.GELU(), nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8), nn.Dropout(), nn.GELU())
    groups = layer_groups(stage)
    assert [name for name, _ in groups] == ["1", "3"]
    assert [len(modules) for _, modules in groups] == [2, 3]  # the leading GELU is the stage's own work

    class Part(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleDict({"4": nn.Linear(4, 4), "5": nn.Linear(4, 4)})
            self.output = nn.Linear(4, 10)

    assert [name for name, _ in layer_groups(Part())] == ["layers.4", "layers.5"]
