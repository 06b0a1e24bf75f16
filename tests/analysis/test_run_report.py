"""The analysis' entry point on plain data, without a database: a run's steps built in the test (the
synthetic 1F1B job, 4 stages × 2 data-parallel replicas, rank 5 computing 1.3× its peers) go through
``choose_steps``, ``break_down_step``, ``straggler_report``, ``analyse_run`` and ``what_if``; and the
service, given the same run through its API, answers the same report."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bubblescope import analysis
from bubblescope.backend.analysis.service import analysis_out
from bubblescope.synthetic_run import SyntheticJob, aggregate, register_job, send_job
from tests.support import LiveServer

SLOW_RANK = 5  # replica 1, stage 1
JOB = SyntheticJob(stages=4, replicas=2, microbatches=8, steps=16, full_every=1, slow=((SLOW_RANK, 1.3),))


def places(job: SyntheticJob) -> list[analysis.RankPlace]:
    return [
        analysis.RankPlace(rank, job.host_of(rank), job.stage_of(rank), job.registration(rank)["coords"], 0)
        for rank in range(job.world_size)
    ]


def step_record(job: SyntheticJob, step: int) -> analysis.StepRecord:
    """One step as a source hands it over: spans on rank 0's clock in (rank, start) order, windows, totals."""
    offset = job.step_start(step)
    spans, windows, totals = [], {}, []
    for rank, rows in sorted(job.timeline(step).items()):
        summed = aggregate(job, step, rows)
        windows[rank] = (summed["start_ns"], summed["end_ns"])
        totals.append(
            analysis.RankTotals(
                rank, summed["compute_ns"], summed["comm_ns"], summed["exposed_comm_ns"], summed["idle_ns"]
            )
        )
        for _step, kind, start, end, stage, microbatch, peer, _bytes, group, name in sorted(rows, key=lambda r: r[2]):
            spans.append(
                analysis.TimedSpan(rank, kind, start + offset, end + offset, stage, microbatch, peer, name, group)
            )
    return analysis.StepRecord(step, spans, windows, totals)


def step_times(job: SyntheticJob, steps: range) -> list[analysis.RankStepTimes]:
    out = []
    for step in steps:
        for rank, rows in sorted(job.timeline(step).items()):
            s = aggregate(job, step, rows)
            window = s["end_ns"] - s["start_ns"]
            out.append(
                analysis.RankStepTimes(
                    rank, step, window, s["compute_ns"], s["comm_ns"], s["exposed_comm_ns"], s["idle_ns"]
                )
            )
    return out


def report_of(job: SyntheticJob) -> tuple[analysis.RunFacts, analysis.RunReport, list[analysis.BrokenDownStep]]:
    facts = analysis.RunFacts(job.world_size, job.config(), places(job))
    records = {step: step_record(job, step) for step in range(job.steps)}
    seen = [analysis.StepSeen(step, job.world_size, job.step_ns, True) for step in records]
    window = analysis.choose_steps(seen, job.world_size)
    broken = [analysis.break_down_step(records[step], facts.places) for step in window.steps]
    span = analysis.straggler_range(window)
    assert span is not None
    stragglers = analysis.straggler_report(step_times(job, range(span[0], span[1] + 1)), facts.places)
    return facts, analysis.analyse_run(facts, window, broken, (), stragglers), broken


def test_the_report_of_plain_steps_names_the_pipeline_its_causes_and_the_slow_rank() -> None:
    _, report, _ = report_of(JOB)
    assert report.steps == list(range(analysis.WARMUP_STEPS, JOB.steps))  # the warm-up left out, and said
    assert report.warmup_steps_left_out == list(range(analysis.WARMUP_STEPS)) and report.partial_steps_left_out == []
    assert report.step_ns == JOB.step_ns
    assert report.pipeline is not None and report.pipeline.setup.ranks == JOB.stages
    assert report.pipeline.setup.microbatches == JOB.microbatches
    attribution = report.attribution
    assert attribution is not None
    assert attribution.closed_form_fraction == pytest.approx(3 / (8 + 3))  # (p-1)/(m+p-1)
    causes = {cause.name: cause.ns for cause in attribution.causes}
    assert [c.name for c in attribution.causes] == [kind.name for kind in analysis.CAUSE_KINDS]
    # replica 0 waits in the dp all-reduce for replica 1, slowed by rank 5: a cause of its own
    assert causes["mesh_collective_wait"] > 0
    assert sum(causes.values()) == pytest.approx(attribution.measured_bubble_ns)
    by_stage = {stage.stage: stage for stage in report.stages}
    assert sorted(by_stage) == list(range(JOB.stages))
    assert max(by_stage.values(), key=lambda s: s.compute_ns).stage == JOB.stage_of(SLOW_RANK)
    assert set(report.exposed_comm_ns_by_group) == {"dp"}  # pipeline p2p is not counted there
    straggling = [s for s in report.suggestions if s.kind == "drain_straggler"]
    assert len(straggling) == 1 and f"rank {SLOW_RANK} is a persistent straggler" in straggling[0].title
    assert straggling[0].apply == {"exclude_hosts": [JOB.host_of(SLOW_RANK)]}


def test_a_healthy_job_has_no_straggler_and_no_mesh_wait_above_noise() -> None:
    healthy = replace(JOB, slow=())
    _, report, _ = report_of(healthy)
    _, slowed, _ = report_of(JOB)
    mesh = lambda r: {c.name: c.ns for c in r.attribution.causes}["mesh_collective_wait"]
    assert mesh(report) < mesh(slowed) / 3
    assert not [s for s in report.suggestions if s.kind == "drain_straggler"]


def test_what_if_replays_the_same_steps() -> None:
    facts, report, broken = report_of(JOB)
    more = analysis.what_if(facts, broken, analysis.Change(microbatches=16, microbatch_scale=0.5))
    assert more.measured_step_ns == report.pipeline.measured_step_ns
    assert (
        more.prediction.bubble_fraction < analysis.what_if(facts, broken, analysis.Change()).prediction.bubble_fraction
    )
    assert more.global_batch_held
    with pytest.raises(analysis.InputError) as refused:
        analysis.what_if(facts, broken, analysis.Change(schedule="no-such-schedule"))
    assert refused.value.field == "schedule"
    no_pipeline = replace(facts, config={})
    with pytest.raises(analysis.NotReplayable):
        analysis.what_if(no_pipeline, broken, analysis.Change())


def test_the_service_answers_the_same_report_for_the_same_run(sqlite_server: LiveServer) -> None:
    key = "entry-point-parity"
    with sqlite_server.client() as client:
        client.timeout = 60
        register_job(client, JOB, key, senders=2)
        send_job(client, JOB, key, steps_per_batch=4, senders=2)
        response = client.get(f"/api/v1/runs/{key}/analysis")
    assert response.status_code == 200, response.text
    _, report, _ = report_of(JOB)
    assert response.json() == analysis_out(key, report).model_dump(mode="json")
