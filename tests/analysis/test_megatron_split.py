"""A suggested layer split written as Megatron-LM's flags gives exactly that split. Megatron cannot be installed
here, so its rule is restated from ``get_num_layers_to_build`` (megatron/core/transformer/transformer_block.py):
``--decoder-first-pipeline-num-layers`` and ``--decoder-last-pipeline-num-layers`` fix the first and last stage,
the other layers are split evenly over the stages between, and a remainder is refused."""

from __future__ import annotations

import re

import pytest

from bubblescope.analysis.suggestions import megatron_layer_split


def megatron_split(flags: list[str], num_layers: int, stages: int) -> list[int]:
    """The split Megatron builds from ``flags`` (its rule, restated)."""
    given = dict(re.findall(r"--decoder-(first|last)-pipeline-num-layers (\d+)", " ".join(flags)))
    first, last = (int(given[k]) if k in given else None for k in ("first", "last"))
    middle_stages = stages - (first is not None) - (last is not None)
    rest = num_layers - (first or 0) - (last or 0)
    assert (middle_stages == 0 and rest == 0) or rest % middle_stages == 0, "Megatron refuses an uneven middle"
    per = rest // middle_stages if middle_stages else 0
    return [first if first is not None else per] + [per] * (stages - 2) + [last if last is not None else per]


@pytest.mark.parametrize("split", [[1, 3, 3, 1], [2, 3, 3, 3, 1], [5, 3], [4, 4, 4, 4], [3, 4, 4, 2]])
def test_the_flags_give_exactly_the_suggested_split(split: list[int]) -> None:
    flags = megatron_layer_split(split)
    assert not any(flag.startswith("(") for flag in flags), flags
    assert megatron_split(flags, sum(split), len(split)) == split


def test_a_split_whose_middle_stages_differ_is_said_to_have_no_flags_not_given_wrong_ones() -> None:
    """3,3,1,1: first 3 and last 1 would give 3,2,2,1 (the middle 4 layers split evenly)."""
    (line,) = megatron_layer_split([3, 3, 1, 1])
    assert line.startswith("(") and "3,3,1,1" in line and "--decoder-first-pipeline-num-layers 3" not in line
