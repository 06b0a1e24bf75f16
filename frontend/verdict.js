// The glance card's first line: what the page shows, in one sentence of this run's own measured figures — a
// stopped run's culprit, a persistently slow rank, a late rank in the collectives, the bubble's largest cause
// against its textbook floor — then the first fix with its predicted step. Built from what the card already
// has (glance.js); null while nothing is known.
import { ms, percent } from "./format.js";

const WHY = { hung: "stopped; the others wait for it", failed: "failed first" };

// p and m with the closed form the analysis chose, e.g. "(p−1)/(m+p−1) = 33.3% for 2 stages and 2 micro-batches".
function floorText(attribution, config) {
  if (attribution.closed_form_fraction === null) return null;
  const p = config.num_stages || config.pp;
  const m = config.num_microbatches;
  const shape = [p && `${p} stages`, m && `${m} micro-batch${m > 1 ? "es" : ""}`].filter(Boolean).join(" and ");
  const formula = attribution.closed_form_formula.replaceAll("-", "−");
  return `${formula} = ${percent(attribution.closed_form_fraction)}${shape ? ` for ${shape}` : ""}`;
}

function pipelineSentence(analysis, config) {
  const a = analysis.attribution;
  const top = a.causes.reduce((x, y) => (y.ns > x.ns ? y : x), a.causes[0]);
  const bubble = `The bubble is ${percent(a.measured_bubble_fraction)} of the step`;
  const floor = floorText(a, config);
  if (config.schedule === "naive") {
    return `Layer-wise split: one stage works at a time. ${bubble}, against ${floor || "(p−1)/p"}.`;
  }
  if (!top) return `${bubble}.`;
  const share = `${ms(top.ns)} ms a rank a step (${percent(top.fraction_of_step)})`;
  if (top.name === "schedule_inherent") {
    const most = a.above_floor_fraction <= 0.05 ? "nearly all" : "most of it";
    return `${bubble}, ${most} the schedule's own fill and drain: ${floor || share}. More micro-batches or another schedule shrink it.`;
  }
  if (top.name === "stage_imbalance") {
    const stages = analysis.stages.filter((s) => s.compute_ns > 0);
    const slow = stages.reduce((x, y) => (y.compute_ns > x.compute_ns ? y : x), stages[0]);
    const fast = stages.reduce((x, y) => (y.compute_ns < x.compute_ns ? y : x), stages[0]);
    const ratio = slow && fast ? ` Stage ${slow.stage} computes ${(slow.compute_ns / fast.compute_ns).toFixed(1)}× stage ${fast.stage}'s work;` : "";
    return `Unequal stages.${ratio} the others wait for it: ${share}. ${bubble}${floor ? `, against ${floor} for equal stages` : ""}.`;
  }
  if (top.name === "communication_wait") return `Transfers between stages are exposed: ${share}. ${bubble}.`;
  return `${bubble}; its largest part is jitter (slow micro-batches, per-action overhead, other load): ${share}.`;
}

// The culprit of a run without a pipeline, where its lateness is worth a line: at least LATE_SHARE of the step
// (the analysis names one even when it kept its peers waiting a fraction of a millisecond).
const LATE_SHARE = 0.02;
export const lateCulprit = (split) => (split.culprit && split.culprit.lateness_ns >= LATE_SHARE * split.window_ns ? split.culprit : null);

function splitSentence(split) {
  const compute = split.parts.find((p) => p.name === "model_compute");
  const head = `Compute is ${percent(compute.fraction_of_step)} of the step`;
  const c = lateCulprit(split);
  if (c) {
    return `Rank ${c.rank} is late to the collectives: each of its peers waits ${ms(c.lateness_ns)} ms a step for it. ${head}.`;
  }
  const others = split.parts.filter((p) => !["model_compute", "optimizer"].includes(p.name) && p.ns > 0);
  if (!others.length) return `${head}.`;
  const top = others.reduce((x, y) => (y.ns > x.ns ? y : x));
  return `${head}; the largest other part is ${top.name.replaceAll("_", " ")}, ${percent(top.fraction_of_step)}.`;
}

function fixSentence(analysis) {
  const s = (analysis.suggestions || []).find((x) => !x.within_noise);
  return s ? ` Do first: ${s.title} (${ms(s.current_step_ns)} → ${ms(s.predicted_step_ns)} ms predicted).` : "";
}

// The sentence for `known` ({ run, analysis, stragglers }) and the stopped run's culprit `stopped` (glance.js), or null.
export function verdict(known, stopped) {
  if (stopped) { // the run's own account where its state says the same (step, how long, who), else the alert's culprit
    const detail = stopped.detail || (known.run.state === stopped.how ? known.run.state_detail : "");
    return `The run ${stopped.how}: ${detail || `${stopped.who} ${WHY[stopped.how]}`}.`;
  }
  const finding = known.stragglers ? known.stragglers.findings[0] : null;
  const analysis = known.analysis;
  if (finding && finding.verdict === "persistent" && finding.kind === "slow rank" && finding.ratio) {
    const rank = finding.ranks[0];
    const tail = analysis && !analysis.advice_withheld ? fixSentence(analysis) : "";
    return `Rank ${rank} of ${known.run.world_size} is ${finding.ratio.toFixed(2)}× ${finding.compared_with} on every step: the ranks it meets in the collectives wait for it.${tail}`;
  }
  if (!analysis || analysis.advice_withheld) return null;
  if (analysis.step_split) {
    return analysis.step_split.compute_instrumented ? splitSentence(analysis.step_split) + fixSentence(analysis) : null;
  }
  if (!analysis.attribution) return null;
  return pipelineSentence(analysis, known.run.config) + fixSentence(analysis);
}
