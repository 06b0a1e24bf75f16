"""torchtitan 0.3.0's own trainer (llama3 debugmodel, 2 CPU ranks, gloo), run as its docs say but through
``-m bubblescope.integrations.torchtitan`` (and the CPU shims of ``titan_cpu.py``), into a real service:
FSDP (dp_shard 2) and PP 2 (1F1B). Compute is recorded, each step carries torchtitan's own number, each rank
its mesh coordinate, and the page tells the truth: a step split for FSDP, a pipeline analysis for PP."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bubblescope.analysis.memory_fixes import declared_plan
from tests.support import LiveServer, migrated_database, run_torchrun, start_server, wait_for_steps

pytestmark = [pytest.mark.slow, pytest.mark.timing]
STEPS = 6


def require_torchtitan() -> None:
    """Skip without torchtitan (``pip install -e '.[test]'`` installs it); in CI, fail instead."""
    import importlib.util
    import os

    if importlib.util.find_spec("torchtitan") is None:
        if os.environ.get("BUBBLESCOPE_REQUIRE_COMPONENTS"):
            pytest.fail("torchtitan is not installed: pip install -e '.[test]'")
        pytest.skip("torchtitan is not installed: pip install -e '.[test]'")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    require_torchtitan()
    with migrated_database("sqlite", tmp_path_factory.mktemp("db")) as url:
        live = start_server(url, tmp_path_factory.mktemp("server"))
        yield live
        live.stop()


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    require_torchtitan()
    from tests.integrations.titan_cpu import make_assets

    return make_assets(tmp_path_factory.mktemp("titan-assets"))


def run_titan(
    service: LiveServer, assets: tuple[Path, Path], tmp: Path, *parallelism: str, env: dict[str, str] | None = None
) -> str:
    tokenizer, dataset = assets
    run_key = f"titan-{uuid.uuid4().hex[:8]}"
    arguments = (
        "bubblescope.integrations.torchtitan",
        *("--module", "llama3", "--config", "llama3_debugmodel"),
        f"--hf_assets_path={tokenizer}",
        f"--dataloader.dataset_path={dataset}",
        f"--dump_folder={tmp}",
        f"--training.steps={STEPS}",
        *("--training.seq_len=128", "--training.local_batch_size=2", "--training.disable_cuda_graphs"),
        *("--checkpoint.no-enable", "--validator.no-enable", "--parallelism.spmd_backend=partial_dtensor"),
        *parallelism,
    )
    job = run_torchrun(
        service.url,
        "tests/integrations/titan_cpu.py",
        2,
        *arguments,
        run_key=run_key,
        extra_env={"BUBBLESCOPE_FULL_SPANS_EVERY": "1", **(env or {})},
    )
    assert job.returncode == 0, job.output[-4000:]
    return run_key


def answers(service: LiveServer, run_key: str, from_step: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The run and its analysis; ``from_step``: from that step on, warm-up included (a short run's steps past the
    warm-up are too few for a fix to be priced)."""
    with httpx.Client(base_url=service.url, timeout=60) as client:
        run = wait_for_steps(client, run_key, 2, STEPS)
        asked = {} if from_step is None else {"from_step": from_step}
        analysis = client.get(f"/api/v1/runs/{run_key}/analysis", params=asked)
        assert analysis.status_code == 200, analysis.text
        return run, analysis.json()


def test_torchtitan_fsdp_records_its_compute_under_its_own_step_numbers(
    service: LiveServer, assets: tuple[Path, Path], tmp_path: Path
) -> None:
    """With ``BUBBLESCOPE_MODEL_BLOCKS=1``: each of the model's ``layers`` priced as a block. With ``BUBBLESCOPE_GPU``
    (this CPU has none to name): the run's config declares torchtitan's model, cluster and layout as ``plan`` takes
    them."""
    env = {"BUBBLESCOPE_MODEL_BLOCKS": "1", "BUBBLESCOPE_GPU": "H100-SXM"}
    run_key = run_titan(service, assets, tmp_path, "--parallelism.data_parallel_shard_degree=2", env=env)
    run, analysis = answers(service, run_key)
    assert run["name"] == "torchtitan-llama3-debugmodel"
    declared = declared_plan(run["config"])  # as the service stored it
    assert declared is not None, run["config"]
    assert (declared.model.layers, declared.model.hidden, declared.model.seq) == (6, 256, 128)  # debugmodel, seq_len
    assert (declared.cluster.gpu.name, declared.cluster.gpus, declared.global_batch) == ("H100-SXM", 2, 4)
    assert (declared.config.zero, declared.config.mbs, declared.config.recompute) == (3, 2, "op")
    assert declared.config.projections == "fused_qkv"  # the debugmodel's one wqkv, its MLP's w1 and w3 apart
    assert [s["step"] for s in run["steps"]] == list(range(1, STEPS + 1))  # torchtitan counts from 1
    assert sorted(r["coords"]["dp"] for r in run["ranks"]) == [0, 1]  # dp_shard / fsdp read as dp
    split = analysis["step_split"]
    assert split is not None and split["compute_instrumented"], analysis
    assert analysis["attribution"] is None and analysis["pipeline_unavailable"] is None
    parts = {p["name"]: p["fraction_of_step"] for p in split["parts"]}
    assert parts["model_compute"] > 0.3, parts  # the training, not idle
    assert [g["group"] for g in split["groups"]][:1] == ["dp"], split["groups"]  # all-gathers, reduce-scatters
    blocks = analysis["block_costs"]
    assert [b["block"] for b in blocks] == [f"layers.{i}" for i in range(len(blocks))] and len(blocks) >= 2, blocks
    assert all(b["forward_ns"] > 0 and b["backward_ns"] > 0 for b in blocks), blocks


def test_torchtitan_pp_is_analysed_as_its_pipeline(
    service: LiveServer, assets: tuple[Path, Path], tmp_path: Path
) -> None:
    pp = ("--parallelism.pipeline_parallel_degree=2", "--parallelism.pipeline_parallel_schedule=1F1B")
    # A local batch of 8 in 2 micro-batches of 4: 1F1B's bubble (p-1)/(m+p-1) is a third of the step, past the 15%
    # at which more micro-batches are suggested, and 8 splits into 4 and 8 (a batch of 2 in micro-batches of 1 left
    # no larger count to suggest, and a suggestion hung on the stages' timing: one CI run had none)
    micro = ("--training.local_batch_size=8", "--parallelism.pipeline_parallel_microbatch_size=4")
    run_key = run_titan(service, assets, tmp_path, *pp, *micro)
    run, analysis = answers(service, run_key, from_step=2)  # steps 2-6: step 1 builds the schedule
    assert (run["config"]["schedule"], run["config"]["num_stages"]) == ("Schedule1F1B", 2)
    assert run["config"]["microbatch_size"] == 4
    assert (run["config"]["pp"], run["config"]["layers_per_stage"]) == (2, [3, 3])  # torchtitan's own split
    assert {r["rank"]: r["coords"] for r in run["ranks"]} == {0: {"pp": 0}, 1: {"pp": 1}}
    assert {r["rank"]: r["stage_layers"] for r in run["ranks"]} == {0: [3], 1: [3]}
    assert analysis["step_split"] is None and analysis["attribution"] is not None, analysis
    assert analysis["attribution"]["measured_bubble_fraction"] > 0
    # Each stage's 3 transformer blocks timed one by one; the last stage's own work (final norm, output head,
    # loss) is more than the first's (token embedding): what a rebalance leaves on each stage
    timed = analysis["pipeline"]["stage_layers"]
    assert timed is not None and [len(stage) for stage in timed["layers"]] == [3, 3], timed
    own = [c["forward_ns"] + c["backward_ns"] for c in timed["own"]]
    assert own[1] > own[0], own
    assert "more_microbatches" in {s["kind"] for s in analysis["suggestions"]}, analysis
    for suggestion in analysis["suggestions"]:
        assert_torchtitan_takes(suggestion["torchtitan"])
        if "num_microbatches" in suggestion["apply"]:  # said in torchtitan's own flag, which sets the count
            assert "parallelism.pipeline_parallel_microbatch_size" in suggestion["torchtitan"], suggestion


def torchtitan_parses(snippet: dict[str, Any], flavor: str = "llama3_debugmodel") -> Any:
    """A suggestion's torchtitan snippet given to torchtitan's own config parser as its command line spells it,
    on llama3's ``flavor``: the config it builds (a split into model parts, which the command line cannot spell,
    left out)."""
    from torchtitan.config import ConfigManager

    base = ["--module", "llama3", "--config", flavor]
    flags, choices = [], []
    for key, value in snippet.items():
        if key == "parallelism.module_fqns_per_model_part":
            continue
        if ":" in key:  # a choice (activation-checkpoint:full), given bare and after the flags, as tyro parses it
            choices.append(key)
        else:
            flags.append(f"--{key}" if value is True else f"--{key}={value}")
    return ConfigManager().parse_args([*base, *flags, *choices])


def assert_torchtitan_takes(snippet: dict[str, Any]) -> None:
    """Each key of a suggestion's torchtitan snippet, given to torchtitan's own config parser, holds the value
    given; a split into model parts, checked against the model's own module names: every part's names exist and
    together hold every module once."""
    import torch

    config = torchtitan_parses(snippet)
    for key, value in snippet.items():
        if ":" in key:  # the choice made: activation-checkpoint:full is a FullAC policy
            section, choice = key.split(":")
            chosen = type(getattr(config, section.replace("-", "_"))).__qualname__.lower()
            assert chosen.startswith(choice.replace("-", "")), (key, chosen)
            continue
        section, field = key.split(".")
        if key != "parallelism.module_fqns_per_model_part":
            assert getattr(getattr(config, section), field) == value, (key, value)
    parts = snippet.get("parallelism.module_fqns_per_model_part")
    if parts is not None:
        with torch.device("meta"):
            model = config.model_spec.model.build()
        names = [name for part in parts for name in part]
        for name in names:
            model.get_submodule(name)  # raises for a name the model does not have
        expected = ["tok_embeddings", *(f"layers.{i}" for i in range(len(model.layers))), "norm", "lm_head"]
        assert sorted(names) == sorted(expected), parts
