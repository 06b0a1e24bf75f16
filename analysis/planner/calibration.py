"""The planner against published runs (``data/published_runs.csv``: Narayanan et al. 2021 Table 1,
Korthikanti et al. 2022 Table 5; each row's source in ``data/SOURCES.md``).

Rows give step time (Table 5) or hardware TFLOP/s per GPU (Table 1, counting the recomputed
forward pass: F = 96·B·s·l·h²·(1 + s/6h + V/16lh), the paper's Eq. 3). Table 1 does not publish the
micro-batch size nor the interleaving; ``UNKNOWN_MICROBATCH_RULE`` fills them the same way for
every row (no per-row tuning).
"""

from __future__ import annotations

import csv
import functools
import itertools
import random
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy

from bubblescope.analysis.planner.efficiencies import (
    DEFAULT_EFFICIENCIES,
    DEFAULTS_CHOSEN_ON,
    MIN_ROWS,
    Efficiencies,
    measured_on,
)
from bubblescope.analysis.planner.evaluate import evaluate
from bubblescope.analysis.planner.specs import ClusterSpec, ModelSpec, ParallelConfig, make_cluster, model_from
from bubblescope.analysis.schedules import DEFAULT_SCHEDULE, INTERLEAVED_1F1B

#: Rows that leave the micro-batch out (Table 1; Megatron-LM's README table). With a pipeline: micro-batch 1 and the
#: plain (non-interleaved) 1F1B schedule. Narayanan et al.'s own analysis (§3.3) favours small micro-batches once
#: pipelines are deep, and Korthikanti et al. ran the same models at micro-batch 1; interleaving is not assumed where
#: it is not published. Without a pipeline, micro-batches buy nothing but memory (smaller GEMMs, and the gradient
#: reduction hidden under the last one's backward only), so a rank's whole batch is one micro-batch, or the largest
#: part of it that fits: what the authors' own scripts chose for Table 1's rows (``examples/sc21/run_table_1.sh``:
#: 16 a micro-batch where a rank holds 16).
UNKNOWN_MICROBATCH_RULE = (
    "with a pipeline mbs=1, vpp=1 (1F1B); without, the largest mbs dividing a rank's batch that fits"
)
PUBLISHED_RUNS = Path(__file__).resolve().parent / "data" / "published_runs.csv"
#: H100 rows (Megatron-LM's README table, 2024) that no constant is fitted on: predicted with the constants the A100
#: rows choose, they say how the model does on a GPU generation it never saw.
PUBLISHED_RUNS_H100 = PUBLISHED_RUNS.with_name("published_runs_h100.csv")
#: NeMo's long-sequence table (Llama 2 7B, FP8, 4k-1M tokens, CP 1-32 on H100s): a check of the context-parallel
#: model, not calibration rows (micro-batch, recompute, TP overlap and gradient type unpublished); SOURCES.md.
NEMO_LONG_SEQUENCE_CHECKS = PUBLISHED_RUNS.with_name("checks_nemo_long_sequence_h100.csv")


@dataclass(frozen=True)
class CalibrationRow:
    source: str
    model: str
    metric: str  # "iter_s" or "tflops_per_gpu"
    measured: float
    predicted: float

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.predicted - self.measured) / self.measured

    @property
    def korthikanti(self) -> bool:
        return self.source.startswith("korthikanti")


def _int(value: str, default: int) -> int:
    return int(value) if value.strip() else default


def _flag(row: dict[str, str], key: str, default: bool = False) -> bool:
    """A true/false cell; blank is ``default``."""
    cell = row.get(key, "").strip().lower()
    return default if not cell else cell == "true"


def row_config(row: dict[str, str]) -> ParallelConfig:
    """The parallel configuration a row published; unpublished micro-batch and interleaving by the rule above."""
    published = _published_config(row, _int(row["microbatch"], 1))
    if row["microbatch"].strip() or published.pp > 1:
        return published
    return replace(published, mbs=_largest_fitting_microbatch(tuple(row.items())))


@functools.lru_cache(maxsize=256)
def _largest_fitting_microbatch(items: tuple[tuple[str, str], ...]) -> int:
    """The largest micro-batch that divides a rank's share of the global batch and fits in memory (1 if none does);
    memory does not depend on the efficiencies a calibration varies, so each row's is found once."""
    row = dict(items)
    model, cluster, batch = row_model(row), row_cluster(row), int(row["global_batch"])
    per_rank = batch // int(row["dp"])
    for mbs in sorted((d for d in range(1, per_rank + 1) if per_rank % d == 0), reverse=True):
        if evaluate(model, cluster, _published_config(row, mbs), batch).fits:
            return mbs
    return 1


def row_cluster(row: dict[str, str]) -> ClusterSpec:
    return make_cluster(row["gpu"], int(row["gpus"]), 8)


def _published_config(row: dict[str, str], mbs: int) -> ParallelConfig:
    vpp = _int(row["vpp"], 1)
    return ParallelConfig(
        tp=int(row["tp"]),
        pp=int(row["pp"]),
        dp=int(row["dp"]),
        vpp=vpp,
        mbs=mbs,
        schedule=INTERLEAVED_1F1B if vpp > 1 else DEFAULT_SCHEDULE,
        zero=_int(row.get("zero", ""), 0),
        recompute=row["recompute"],
        sequence_parallel=_flag(row, "sequence_parallel"),
        flash_attention=_flag(row, "flash_attention"),  # the papers' Megatron stored the attention scores
        precision=row.get("precision", "").strip() or "bf16",
        tp_comm_overlap=_flag(row, "tp_comm_overlap"),
        cp=_int(row.get("cp", ""), 1),
        cp_comm=row.get("cp_comm", "").strip() or "p2p",
        attention_kernel=row.get("attention_kernel", "").strip() or "cudnn",
        grad_reduce=row.get("grad_reduce", "").strip() or "fp32",
        compile=_flag(row, "compile", default=True),
        fp8_all_gather=_flag(row, "fp8_all_gather"),
        kv_repeated=_flag(row, "kv_repeated"),
        overlap_param_gather=_flag(row, "overlap_param_gather"),
        projections=row.get("projections", "").strip() or "fused",
        layers_per_stage=tuple(int(n) for n in row.get("layers_per_stage", "").split("/") if n.strip()),
    )


def row_model(row: dict[str, str]) -> ModelSpec:
    """A row's model: a planner preset at the row's sequence length (Llama rows), else a GPT of its shape."""
    if row.get("preset", "").strip():
        return replace(model_from(row["preset"]), seq=int(row["seq"]))
    return ModelSpec(
        row["model"], int(row["layers"]), int(row["hidden"]), int(row["heads"]), int(row["seq"]), int(row["vocab"])
    )


def model_flops(model: ModelSpec, batch: int) -> float:
    """Model FLOPs of a step, as Korthikanti et al. and Megatron-LM (``num_floating_point_operations``) count
    them for a GPT: 72·B·s·L·h²·(1 + s/6h + V/12Lh); no recompute."""
    s, h, layers, vocab = model.seq, model.hidden, model.layers, model.vocab
    return 72.0 * batch * s * layers * h * h * (1 + s / (6 * h) + vocab / (12 * layers * h))


def nemo_flops_per_token(model: ModelSpec) -> float:
    """Model FLOPs a token as NeMo counts them for Llama (``nemo/utils/flops_formulas.py``, ``llama2``/``llama3``):
    L·h²·(12 + 12·kv/heads + 18·ffn/h + 12·s/h + 6·V/(L·h)); attention's 12·s/h counts every query against every key,
    causal or not, so at long sequences it is twice what a causal kernel computes."""
    s, h, layers = model.seq, model.hidden, model.layers
    kv = model.kv_heads or model.heads
    terms = 12 + 12 * kv / model.heads + 18 * model.ffn_hidden / h + 12 * s / h + 6 * model.vocab / (layers * h)
    return layers * h * h * terms


def predict_row(row: dict[str, str], eff: Efficiencies = DEFAULT_EFFICIENCIES) -> CalibrationRow:
    model, cluster = row_model(row), row_cluster(row)
    batch = int(row["global_batch"])
    plan = evaluate(model, cluster, row_config(row), batch, eff)
    if plan.step is None:  # the run's layout itself is refused; a memory verdict alone does not stop a run that ran
        raise ValueError(f"{row['source']} {row['model']}: {'; '.join(plan.problems)}")
    seconds = plan.step.total
    if row["measured_iter_s"].strip():
        return CalibrationRow(row["source"], row["model"], "iter_s", float(row["measured_iter_s"]), seconds)
    if row.get("measured_tokens_per_gpu_s", "").strip():
        tokens = batch * model.seq / (seconds * cluster.gpus)
        return CalibrationRow(
            row["source"], row["model"], "tokens_gpu_s", float(row["measured_tokens_per_gpu_s"]), tokens
        )
    if row.get("measured_model_tflops_per_gpu", "").strip():
        tflops = model_flops(model, batch) / (seconds * cluster.gpus) / 1e12
        measured = float(row["measured_model_tflops_per_gpu"])
        return CalibrationRow(row["source"], row["model"], "model_tflops_gpu", measured, tflops)
    s, h, layers, vocab = model.seq, model.hidden, model.layers, model.vocab
    flops = 96.0 * batch * s * layers * h * h * (1 + s / (6 * h) + vocab / (16 * layers * h))
    tflops = flops / (seconds * cluster.gpus) / 1e12
    return CalibrationRow(row["source"], row["model"], "tflops_per_gpu", float(row["measured_tflops_per_gpu"]), tflops)


def calibrate(csv_path: Path, eff: Efficiencies = DEFAULT_EFFICIENCIES) -> list[CalibrationRow]:
    with csv_path.open(newline="") as handle:
        return [predict_row(row, eff) for row in csv.DictReader(handle)]


@dataclass(frozen=True)
class ErrorSummary:
    median_abs_pct: float
    mean_abs_pct: float
    max_abs_pct: float


def summarize(rows: Iterable[CalibrationRow]) -> ErrorSummary:
    errors = [abs(row.error_pct) for row in rows]
    return ErrorSummary(statistics.median(errors), statistics.fmean(errors), max(errors))


#: The constants a calibration chooses, each over its physically plausible range (``Efficiencies`` says why);
#: the others keep their values. The defaults are among the choices.
GRID: dict[str, tuple[float, ...]] = {
    "gemm": tuple(round(0.64 + 0.02 * i, 2) for i in range(11)),  # 0.64 ... 0.84
    "nvlink": (0.55, 0.65, 0.75),
    "network": (0.6, 0.7, 0.8, 0.9),
    "dp_overlap": (0.25, 0.5, 0.75),
}
#: The grid for every published row at once (A100, H100, H200): the GEMM efficiency reaches down to 0.32 (the
#: torchtitan rows' 500 W H100s, whose peak is not published, sit below the SXM figure), NVLink up to 0.85 (the A100 and
#: B200 defaults' range; on an H100 board NVLink is held at NCCL's published 0.822, ``efficiencies.HOPPER_NVLINK``), and the constants only the newer rows exercise are chosen too: the
#: tensor-parallel overlap (the A100 rows did not overlap; torchtitan's async TP of December 2024 gained 5.7% on its
#: 70B run, where hiding 40% of the GEMM time under the collectives would gain 17-19%: 0.2 is in), fused attention's
#: efficiency (the A100 rows stored the scores) and eager PyTorch's element-wise traffic (every A100 row ran Megatron's
#: fused kernels).
GRID_EVERY_ROW: dict[str, tuple[float, ...]] = {
    **GRID,
    "gemm": tuple(round(0.32 + 0.04 * i, 2) for i in range(14)),  # 0.32 ... 0.84
    "nvlink": (0.55, 0.65, 0.75, 0.85),
    "dp_overlap": (0.5, 0.75),
    "tp_overlap": (0.2, 0.4, 0.8),
    "attention": (0.2, 0.25, 0.3, 0.4, 0.5, 0.6),
    "eager_traffic": (2.0, 3.0, 4.0, 6.0),
}


@dataclass(frozen=True)
class HeldOut:
    """A row predicted with the constants fitted on every other row: how the model does on a run it never saw."""

    row: CalibrationRow
    fitted: Efficiencies


def candidates(grid: Mapping[str, Sequence[float]] = GRID) -> list[Efficiencies]:
    names = list(grid)
    return [replace(DEFAULT_EFFICIENCIES, **dict(zip(names, values))) for values in itertools.product(*grid.values())]


def published_rows(sources: Path | Sequence[Path]) -> list[dict[str, str]]:
    """The rows of one published-runs file, or of several in turn."""
    paths = [sources] if isinstance(sources, Path) else list(sources)
    rows: list[dict[str, str]] = []
    for path in paths:
        with path.open(newline="") as handle:
            rows.extend(csv.DictReader(handle))
    return rows


def _predictions(
    sources: Path | Sequence[Path], grid: Mapping[str, Sequence[float]]
) -> tuple[list[Efficiencies], list[list[CalibrationRow]]]:
    """Each candidate's prediction of each row, computed once (the table every fit picks from)."""
    paths = (sources,) if isinstance(sources, Path) else tuple(sources)
    return _prediction_table(paths, tuple((name, tuple(values)) for name, values in grid.items()))


@functools.lru_cache(maxsize=8)
def _prediction_table(
    paths: tuple[Path, ...], grid: tuple[tuple[str, tuple[float, ...]], ...]
) -> tuple[list[Efficiencies], list[list[CalibrationRow]]]:
    """The table for one set of files and one grid (a bench leaves rows out twice from the same one)."""
    options = candidates(dict(grid))
    published = published_rows(list(paths))
    return options, [[predict_row(row, eff) for row in published] for eff in options]


def _best(table: list[list[CalibrationRow]], rows: Sequence[int]) -> int:
    """The candidate with the least mean |error| over ``rows`` (the first of equals)."""
    return min(range(len(table)), key=lambda c: statistics.fmean(abs(table[c][r].error_pct) for r in rows))


def fit(sources: Path | Sequence[Path], grid: Mapping[str, Sequence[float]] = GRID) -> Efficiencies:
    """The grid's constants with the least mean |error| over every row (in-sample)."""
    options, table = _predictions(sources, grid)
    return options[_best(table, range(len(table[0])))]


def leave_one_out(
    sources: Path | Sequence[Path],
    grid: Mapping[str, Sequence[float]] = GRID,
    group: str | None = None,
) -> list[HeldOut]:
    """Each row (of one file, or of several together) predicted with the grid's constants fitted on the other rows
    alone. With ``group`` (a column, e.g. ``gpu``), only on the other rows that share the held-out row's value there
    (constants per GPU: the rows of the GPU it prices as, ``constants_family``, as ``fit_per_gpu`` fits what the
    planner prices with); on every other row where none does. Per GPU, a row whose GPU keeps fewer than ``MIN_ROWS``
    other rows is predicted with the defaults, as the planner would price that GPU without it (``fit_per_gpu``), and a
    constant the other rows do not pin keeps its default, as there (``defaults_where_unpinned``)."""
    options, table = _predictions(sources, grid)
    published = published_rows(sources)
    held: list[HeldOut] = []
    for index, row in enumerate(published):
        others = [other for other in range(len(published)) if other != index]
        if group is not None:  # a GPU's constants are fitted on the rows of the GPU it prices as (``constants_family``)
            wanted = constants_family(row[group]) if group == "gpu" else row[group]
            alike = [other for other in others if published[other][group] == wanted]
            if group == "gpu" and len(alike) < MIN_ROWS:
                held.append(HeldOut(predict_row(row, DEFAULT_EFFICIENCIES), DEFAULT_EFFICIENCIES))
                continue
            others = alike or others
            if group == "gpu":  # as ``fit_per_gpu`` fits what the planner prices with, its tie rule included
                options, table = _predictions(sources, family_grid(wanted, grid))
                chosen = _best(table, others)
                fitted = defaults_where_unpinned(options[chosen], [published[o] for o in others], grid, wanted)
                same = fitted == options[chosen]
                held.append(HeldOut(table[chosen][index] if same else predict_row(row, fitted), fitted))
                continue
        chosen = _best(table, others)
        held.append(HeldOut(table[chosen][index], options[chosen]))
    return held


#: GPUs priced with another's constants, fitted on that one's rows alone: the H200 is the H100 SXM's GH100 chip at the
#: same clocks (989 dense bf16 TFLOP/s both, ``data/gpus.csv``) with more and faster HBM, which the model reads as such.
#: Its own published rows are then a test of constants never fitted on them.
PRICED_AS = {"H200": "H100-SXM"}


def constants_family(gpu: str) -> str:
    """The GPU whose fitted constants ``gpu`` prices with (itself, unless ``PRICED_AS`` names another; any case)."""
    return next((other for name, other in PRICED_AS.items() if name.lower() == gpu.lower()), gpu)


def family_grid(family: str, grid: Mapping[str, Sequence[float]]) -> dict[str, Sequence[float]]:
    """``grid`` for the constants of ``family``'s GPU, with what was measured on its chip fixed at the measure
    (``efficiencies.measured_on``), chosen by no fit."""
    measured = measured_on(family)
    return {**grid, **{name: (value,) for name, value in measured.items()}}


def fit_per_gpu(
    sources: Sequence[Path], grid: Mapping[str, Sequence[float]] = GRID_EVERY_ROW
) -> dict[str, tuple[Efficiencies, list[str], int]]:
    """Each GPU's constants, fitted on the published rows of the GPU it prices as (``constants_family``: itself, or
    the H100 SXM for the H200; in-sample), with that GPU's name and the number of rows; not for the GPU the defaults
    were chosen on, nor where there are fewer than ``MIN_ROWS`` rows (``efficiencies.efficiencies_for``). A constant
    the rows do not pin (the fit's mean error the same with the default value: eager traffic where every row is
    compiled) keeps its default."""
    published = published_rows(sources)
    out: dict[str, tuple[Efficiencies, list[str], int]] = {}
    for gpu in dict.fromkeys(row["gpu"] for row in published):
        family = [i for i, row in enumerate(published) if row["gpu"] == constants_family(gpu)]
        if gpu == DEFAULTS_CHOSEN_ON[0] or len(family) < MIN_ROWS:
            continue
        options, table = _predictions(sources, family_grid(constants_family(gpu), grid))
        rows = [published[i] for i in family]
        chosen = defaults_where_unpinned(options[_best(table, family)], rows, grid, constants_family(gpu))
        out[gpu] = (chosen, sorted({published[i]["gpu"] for i in family}), len(family))
    return out


def defaults_where_unpinned(
    chosen: Efficiencies, rows: Sequence[dict[str, str]], grid: Mapping[str, Sequence[float]], family: str
) -> Efficiencies:
    """``chosen`` with each constant of ``grid`` that ``rows`` do not pin (their mean error the same with the
    default value: eager traffic where every row is compiled) at its default; one measured on ``family``'s chip
    stays at its measure."""
    error = _mean_abs_error(rows, chosen)
    measured = measured_on(family)
    for name in [name for name in grid if name not in measured]:
        unpinned = replace(chosen, **{name: getattr(DEFAULT_EFFICIENCIES, name)})
        if unpinned != chosen and abs(_mean_abs_error(rows, unpinned) - error) < 1e-9:
            chosen = unpinned
    return chosen


def _mean_abs_error(rows: Sequence[dict[str, str]], eff: Efficiencies) -> float:
    return statistics.fmean(abs(predict_row(row, eff).error_pct) for row in rows)


@dataclass(frozen=True)
class FewRowsFit:
    """How constants fitted on ``rows`` of a GPU's published runs predict that GPU's other runs, against the
    defaults on the same runs (means over ``subsets`` subsets of that size)."""

    rows: int
    subsets: int
    fit_error_pct: float  # mean |error| on the other rows, constants fitted on the subset
    defaults_error_pct: float  # mean |error| on the same rows, the defaults
    fit_better: int  # subsets whose fit beat the defaults


def fits_on_few_rows(
    sources: Sequence[Path],
    gpu: str,
    sizes: Sequence[int],
    grid: Mapping[str, Sequence[float]] = GRID_EVERY_ROW,
    samples: int = 150,
    seed: int = 0,
) -> list[FewRowsFit]:
    """For each size k, constants fitted on k of ``gpu``'s rows (every such subset, or ``samples`` of them drawn
    with ``seed``) predict its other rows: the evidence for ``MIN_ROWS``, the fewest runs a GPU's own fit needs to
    beat the defaults. What was measured on the GPU's chip is kept, as ``fit_per_gpu`` keeps it (``family_grid``)."""
    _, table = _predictions(sources, family_grid(constants_family(gpu), grid))
    published = published_rows(sources)
    family = [i for i, row in enumerate(published) if row["gpu"].lower() == gpu.lower()]
    errors = numpy.array([[abs(table[c][i].error_pct) for i in family] for c in range(len(table))])
    defaults = [abs(predict_row(published[i], DEFAULT_EFFICIENCIES).error_pct) for i in family]
    draw = random.Random(seed)
    out: list[FewRowsFit] = []
    for size in sizes:
        subsets = list(itertools.combinations(range(len(family)), size))
        if len(subsets) > samples:
            subsets = draw.sample(subsets, samples)
        fitted, kept, better = [], [], 0
        for subset in subsets:
            chosen = int(errors[:, list(subset)].mean(axis=1).argmin())  # ``_best``'s rule, on an array
            rest = [i for i in range(len(family)) if i not in subset]
            fit_error = float(errors[chosen, rest].mean())
            default_error = statistics.fmean(defaults[i] for i in rest)
            fitted.append(fit_error)
            kept.append(default_error)
            better += fit_error < default_error
        out.append(FewRowsFit(size, len(subsets), statistics.fmean(fitted), statistics.fmean(kept), better))
    return out
