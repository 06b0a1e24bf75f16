// Why no fix is predicted, where the step is mostly overhead: a job whose stages do little work beside
// the pipelining runtime's cost per action and the work outside the pipeline (a CPU demo with small
// layers) has a bubble no schedule removes, and the page says so with the figures instead of
// "nothing to change".
import { ms } from "./format.js";

// The pipeline's overheads per rank and step against its stage work (analysis.pipeline, ns), or null.
function overheads(pipeline) {
  if (!pipeline) return null;
  const s = pipeline.setup;
  const perStage = s.stage_costs.reduce((sum, c) => sum + c.forward_ns + c.backward_ns, 0) / s.stage_costs.length;
  const work = perStage * s.microbatches * s.stages_per_rank;
  const actions = 2 * s.microbatches * s.stages_per_rank;
  return { work, actions, perAction: s.action_overhead_ns, outside: s.step_overhead_ns, total: actions * s.action_overhead_ns + s.step_overhead_ns };
}

// A sentence when one stage computes much longer outside the pipeline than the others (an optimizer, a
// metric, a slow rank's extra work before a collective): the others wait for it, and no schedule helps.
export function unevenOutsideWork(analysis) {
  const p = analysis.pipeline;
  if (!p || p.setup.stages_per_rank !== 1) return null;
  const m = p.setup.microbatches;
  const outside = analysis.stages.filter((s) => s.stage !== null && p.setup.stage_costs[s.stage])
    .map((s) => ({ stage: s.stage, ns: s.compute_ns - m * (p.setup.stage_costs[s.stage].forward_ns + p.setup.stage_costs[s.stage].backward_ns) }));
  if (outside.length < 2) return null;
  const most = outside.reduce((a, b) => (b.ns > a.ns ? b : a));
  const least = outside.reduce((a, b) => (b.ns < a.ns ? b : a));
  if (most.ns - least.ns < 0.2 * analysis.step_ns) return null;
  return `Stage ${most.stage} computes ${ms(most.ns)} ms a step outside the pipeline, ${ms(most.ns - least.ns)} ms more than stage ${least.stage}:`
    + " the other stages wait for it at the step's closing collective; spread or shorten that work.";
}

// A sentence when overheads outweigh the stage work, else null.
export function overheadsDominate(analysis) {
  const o = overheads(analysis.pipeline);
  if (!o || o.total <= o.work) return null;
  return `the step is mostly overhead, which no schedule removes: ${ms(o.perAction)} ms per action × ${o.actions} actions`
    + ` and ${ms(o.outside)} ms outside the pipeline, against ${ms(o.work)} ms of stage work a rank;`
    + " larger layers or micro-batches (as on a GPU) let the schedule matter";
}
