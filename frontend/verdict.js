// The glance card's first line: what the page shows, in one sentence of this run's own measured figures — a
// stopped run's culprit, a persistently slow rank, a late rank in the collectives, the bubble's largest cause
// against its textbook floor — then the first fix with its predicted step. Built from what the card already
// has (glance.js); null while nothing is known.
import { cause } from "./causes.js";
import { ms, percent } from "./format.js";

const WHY = { hung: "stopped; the others wait for it", failed: "failed first" };
const LAYERWISE = "(p-1)/p"; // the closed form of the layer-wise split, whatever the schedule's name or alias
const noStop = (text) => text.replace(/[.\s]+$/, ""); // a sentence's own text, without its final period

// p and m with the closed form the analysis chose, e.g. "(p−1)/(m+p−1) = 33.3% for 2 stages and 2 micro-batches".
function floorText(attribution, config) {
  if (attribution.closed_form_fraction === null || !attribution.closed_form_formula) return null;
  const p = config.num_stages || config.pp;
  const m = config.num_microbatches;
  const shape = [p && `${p} stages`, m && `${m} micro-batch${m > 1 ? "es" : ""}`].filter(Boolean).join(" and ");
  const formula = attribution.closed_form_formula.replaceAll("-", "−");
  return `${formula} = ${percent(attribution.closed_form_fraction)}${shape ? ` for ${shape}` : ""}`;
}

const largest = (items, size) => items.reduce((x, y) => (size(y) > size(x) ? y : x), items[0]);

function imbalanceText(stages) {
  const working = stages.filter((s) => s.compute_ns > 0);
  if (working.length < 2) return "";
  const slow = largest(working, (s) => s.compute_ns);
  const fast = largest(working, (s) => -s.compute_ns);
  return ` Stage ${slow.stage} computes ${(slow.compute_ns / fast.compute_ns).toFixed(1)}× stage ${fast.stage}'s work, and the others wait for it:`;
}

function pipelineSentence(analysis, config) {
  const a = analysis.attribution;
  const bubble = `The bubble is ${percent(a.measured_bubble_fraction)} of the step`;
  const floor = floorText(a, config);
  if (a.closed_form_formula === LAYERWISE) return `Layer-wise split: one stage works at a time. ${bubble}, against ${floor}.`;
  if (!a.causes.length) return `${bubble}.`;
  const top = largest(a.causes, (c) => c.ns);
  const share = `${ms(top.ns)} ms a rank a step (${percent(top.fraction_of_step)})`;
  if (top.name === "schedule_inherent") {
    const most = a.above_floor_fraction <= 0.05 ? "nearly all" : "most of it";
    return `${bubble}, ${most} the schedule's own fill and drain: ${floor || share}. More micro-batches or another schedule shrink it.`;
  }
  if (top.name === "stage_imbalance") {
    const equal = floor ? `, against ${floor} for equal stages` : "";
    return `Unequal stages.${imbalanceText(analysis.stages) || " The others wait for the slowest:"} ${share}. ${bubble}${equal}.`;
  }
  if (top.name === "communication_wait") return `Transfers between stages are exposed: ${share}. ${bubble}.`;
  if (top.name === "mesh_collective_wait") {
    return `${bubble}; its largest part is ranks waiting for their peers in the data- or tensor-parallel collectives: ${share}.`;
  }
  return `${bubble}; its largest part is ${cause(top.name).label}: ${share}.`;
}

// The culprit of a run without a pipeline, where its lateness is worth a line: at least LATE_SHARE of the step
// (the analysis names one even when it kept its peers waiting a fraction of a millisecond).
const LATE_SHARE = 0.02;
export const lateCulprit = (split) => (split.culprit && split.culprit.lateness_ns >= LATE_SHARE * split.window_ns ? split.culprit : null);

// The late culprit of a split whose compute is timed (without compute, waits mislead), or null.
export const timedLateCulprit = (split) => (split && split.compute_instrumented ? lateCulprit(split) : null);

// Whether every rank of a straggler finding waits for the late culprit in the collectives (the analysis'
// Culprit.waited_on_by): their extra compute is not what holds the step, the culprit is, and it leads.
export const waitsForCulprit = (finding, culprit) => Boolean(finding && culprit && finding.ranks.length
  && !finding.ranks.includes(culprit.rank) && finding.ranks.every((r) => culprit.victims.includes(r)));

// The largest part of a step without a pipeline that is not the model's own work (null: none); host gaps counted as
// those every rank has (one rank's own gaps are what its peers wait for: the waiting is the cause to show).
export function largestOtherPart(split) {
  const parts = split.parts.filter((p) => !["model_compute", "optimizer"].includes(p.name) && p.ns > 0)
    .map((p) => (p.name === "host_gaps" ? { ...p, ns: split.shared_gaps_ns, fraction_of_step: split.shared_gaps_ns / split.window_ns } : p))
    .filter((p) => p.ns > 0);
  return parts.length ? largest(parts, (p) => p.ns) : null;
}

function splitSentence(split) {
  const compute = split.parts.find((p) => p.name === "model_compute");
  const head = compute ? `Compute is ${percent(compute.fraction_of_step)} of the step` : "";
  const c = lateCulprit(split);
  if (c) return `Rank ${c.rank} is late to the collectives: each of its peers waits ${ms(c.lateness_ns)} ms a step for it.${head ? ` ${head}.` : ""}`;
  const top = largestOtherPart(split);
  if (!head) return null;
  return top ? `${head}; the largest other part is ${cause(top.name).label}, ${percent(top.fraction_of_step)}.` : `${head}.`;
}

function fixSentence(analysis) {
  const s = (analysis.suggestions || []).find((x) => !x.within_noise);
  return s ? ` Do first: ${s.title} (${ms(s.current_step_ns)} → ${ms(s.predicted_step_ns)} ms predicted).` : "";
}

// The sentence for `known` ({ run, analysis, stragglers }) and the stopped run's culprit `stopped` (glance.js), or null.
export function verdict(known, stopped) {
  if (stopped) { // the run's own account where its state says the same (step, how long, who), else the alert's culprit
    const detail = stopped.detail || (known.run.state === stopped.how ? known.run.state_detail : "");
    return `The run ${stopped.how}: ${noStop(detail || `${stopped.who} ${WHY[stopped.how]}`)}.`;
  }
  const finding = known.stragglers ? known.stragglers.findings[0] : null;
  const analysis = known.analysis;
  const advised = analysis && !analysis.advice_withheld;
  const late = analysis ? timedLateCulprit(analysis.step_split) : null;
  if (finding && finding.verdict === "persistent" && finding.kind === "slow rank" && finding.ratio && !waitsForCulprit(finding, late)) {
    const slow = `Rank ${finding.ranks[0]} of ${known.run.world_size} is persistently slow: ${finding.ratio.toFixed(2)}× ${finding.compared_with}`;
    return `${slow}; the ranks it meets wait for it.${advised ? fixSentence(analysis) : ""}`;
  }
  if (!advised) return null;
  if (analysis.step_split) {
    const sentence = analysis.step_split.compute_instrumented ? splitSentence(analysis.step_split) : null;
    return sentence ? sentence + fixSentence(analysis) : null;
  }
  if (!analysis.attribution) return null;
  return pipelineSentence(analysis, known.run.config) + fixSentence(analysis);
}
