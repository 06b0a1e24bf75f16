// The run page's first card: one sentence of what the page shows (verdict.js), then the on-call questions
// answered in one screen, from what the page already
// loads (the run, its analysis, its stragglers, its alerts): step time now against the run's own
// baseline with the trend, the bubble against its floor, the largest cause, the slowest rank, the
// first thing to do and the alerts firing (a run without a pipeline: its compute share and the largest
// other part of its step, no bubble). Each part fills in as its source arrives.
import { el } from "./dom.js";
import { ms, percent } from "./format.js";
import { cause } from "./causes.js";
import { overheadsDominate, unevenOutsideWork } from "./overhead.js";
import { largestOtherPart, timedLateCulprit, verdict, waitsForCulprit } from "./verdict.js";

// The warm-up and the baseline's length come with the run (warmup_until_step, baseline_steps).
const NOW_STEPS = 5; // "now": median of the newest complete steps
const TREND_STEPS = 200; // the sparkline's newest steps

const known = { run: null, analysis: null, stragglers: null, firing: null };

const median = (values) => {
  if (!values.length) return null;
  const sorted = [...values].sort((a, b) => a - b);
  const mid = Math.floor(sorted.length / 2);
  return sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
};

// A step every rank of the world reported (a crashed run's last step, or one still arriving, is partial).
// the service's marks (analysis/warmup.py): every rank reported it; one of the run's first steps
export const isComplete = (run, step) => step.complete;
export const isWarmup = (run, step) => step.warmup;

// The baseline is the first baseline_steps complete steps past the warm-up; "now" the newest NOW_STEPS after
// them, so a run too short to have both compares nothing (a crashed step is not its own baseline).
function stepTimes(run) {
  const complete = run.steps.filter((s) => isComplete(run, s));
  const past = complete.filter((s) => !isWarmup(run, s));
  const known = past.length > run.baseline_steps;
  const baseline = known ? median(past.slice(0, run.baseline_steps).map((s) => s.wall_ns)) : null;
  const now = median(past.slice(-NOW_STEPS).map((s) => s.wall_ns));
  return { baseline, now, past: past.length, partial: run.steps.length - complete.length };
}

// The newest steps' wall times as an inline SVG line; warm-up steps and partial steps as hollow dots.
function sparkline(run) {
  const steps = run.steps.slice(-TREND_STEPS);
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("class", "sparkline");
  svg.setAttribute("viewBox", "0 0 200 36");
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("aria-label", "step time trend");
  if (steps.length < 2) return svg;
  const walls = steps.map((s) => s.wall_ns);
  const lo = Math.min(...walls);
  const span = Math.max(...walls) - lo || 1;
  const x = (i) => (200 * i) / (steps.length - 1);
  const y = (ns) => 33 - (30 * (ns - lo)) / span;
  const line = document.createElementNS(svg.namespaceURI, "polyline");
  line.setAttribute("points", steps.map((s, i) => `${x(i).toFixed(1)},${y(s.wall_ns).toFixed(1)}`).join(" "));
  svg.append(line);
  steps.forEach((s, i) => {
    if (!isWarmup(run, s) && isComplete(run, s)) return;
    const dot = document.createElementNS(svg.namespaceURI, "circle");
    dot.setAttribute("cx", x(i).toFixed(1));
    dot.setAttribute("cy", y(s.wall_ns).toFixed(1));
    dot.setAttribute("r", "2");
    dot.setAttribute("class", isComplete(run, s) ? "warmup" : "partial");
    svg.append(dot);
  });
  return svg;
}

function item(id, label, value, note, tone = "") {
  return el("div", { class: `glance-item ${tone}`, id },
    el("div", { class: "label" }, label), el("div", { class: "value" }, value), el("div", { class: "note" }, ...[note].flat()));
}

const waiting = (id, label) => item(id, label, "…", "loading");

function stepItem(run) {
  const { baseline, now, past, partial } = stepTimes(run);
  if (now === null) {
    const why = run.warmup_until_step === null ? "no step reported yet" : `no complete step past the warm-up (steps before ${run.warmup_until_step}) yet`;
    return item("glance-step", "Step time", "—", why);
  }
  const change = baseline ? (now - baseline) / baseline : 0;
  const tone = change > 0.1 ? "bad" : "";
  const versus = baseline === null
    ? `no baseline yet: ${past} complete step${past === 1 ? "" : "s"} past the warm-up, the baseline is the first ${run.baseline_steps}`
    : `${change >= 0 ? "+" : "−"}${Math.abs(100 * change).toFixed(1)}% vs baseline ${ms(baseline)} ms${tone ? ": over 10% slower" : ""}`;
  const marks = partial ? `; ${partial} partial step${partial > 1 ? "s" : ""} left out` : "";
  return item("glance-step", "Step time now", `${ms(now)} ms`, [versus + marks, sparkline(run)], tone);
}

// Within this of its simulated floor, a bubble is at its floor: the replay's medians are no finer than that.
const AT_FLOOR = 0.02;
const RED_OVER_FLOOR = 0.05; // a bubble this far above its floor is drawn red, and the note says so

// The analysis' bubble (the median over its steps) against the replay's floor, both over the run's step.
// A measurement under the floor says the replay overstates this run, not that the run beat its schedule:
// said so, not "below".
function bubbleItem(analysis) {
  if (analysis.step_split) return computeItem(analysis.step_split);
  const a = analysis.attribution;
  if (!a) return item("glance-bubble", "Bubble", "—", analysis.pipeline_unavailable || "not measurable for this run");
  // Both over the run's step: the floor's idle time as a share of this step (its own fraction, of the replayed
  // pipeline step, is in the analysis below; beside the measured share it would read as a contradiction).
  const over = a.above_floor_fraction;
  const floor = `${percent(a.measured_bubble_fraction - over)} of the step`;
  const steps = `median of ${analysis.steps.length} step${analysis.steps.length > 1 ? "s" : ""}`;
  if (analysis.advice_withheld) { // one or two steps: a figure, no verdict
    return item("glance-bubble", "Bubble", percent(a.measured_bubble_fraction), `${steps}: too few for a verdict; floor ${floor}, simulated`);
  }
  const versus = Math.abs(over) <= AT_FLOOR ? `at its floor (${floor}, simulated)`
    : over > 0 ? `${(100 * over).toFixed(1)} pts above its floor (${floor}, simulated)${over > RED_OVER_FLOOR ? ": more than 5 pts" : ""}`
      : `under its simulated floor (${floor}): the replay overstates this run by ${ms(a.replay_excess_ns)} ms a rank`;
  return item("glance-bubble", "Bubble", percent(a.measured_bubble_fraction), `${steps}; ${versus}`, over > RED_OVER_FLOOR ? "bad" : "");
}

// A run without a pipeline: its compute share, and the rest of its step in one line; or that it recorded none.
function computeItem(split) {
  const part = (name) => split.parts.find((p) => p.name === name);
  if (!split.compute_instrumented) {
    return item("glance-bubble", "Compute", "not instrumented", "add collector.instrument_model(model): the training reads as host gaps", "bad");
  }
  const rest = ["collective_wait", "collective_transfer", "data_loading", "host_gaps"].map(part)
    .filter((p) => p.fraction_of_step >= 0.005).map((p) => `${cause(p.name).label} ${percent(p.fraction_of_step)}`);
  return item("glance-bubble", "Compute", percent(part("model_compute").fraction_of_step), `of the step; ${rest.join(", ") || "nothing else"}`);
}

function largestPart(split) {
  const top = split.compute_instrumented ? largestOtherPart(split) : null;
  if (!top) return item("glance-cause", "Largest cause", "—", split.compute_instrumented ? "the step is all compute" : "compute is not instrumented");
  return item("glance-cause", "Largest cause", cause(top.name).label, `${ms(top.ns)} ms per rank per step (${percent(top.fraction_of_step)} of the step)`);
}

function causeItem(analysis) {
  if (analysis.step_split) return largestPart(analysis.step_split);
  const causes = analysis.attribution ? analysis.attribution.causes : [];
  if (!causes.length) return item("glance-cause", "Largest cause", "—", "no bubble attribution");
  const top = causes.reduce((a, b) => (b.ns > a.ns ? b : a));
  return item("glance-cause", "Largest cause", cause(top.name).label,
    `${ms(top.ns)} ms per rank per step (${percent(top.fraction_of_step)} of the step)`);
}

const STOPPED = { BubblescopeRunHung: "hung", BubblescopeRunFailed: "failed" };

// A hung or failed run's culprit as the banner's alert names it (rank, host, what to do), else as the run's state
// says it ("rank 1 (host h)", or "3 ranks (1, 4, 7)" when several lag): the one culprit every card of the page
// names. Null while the run is neither.
function trouble() {
  const alert = (known.firing || []).find((a) => STOPPED[a.labels.alertname]);
  if (alert && alert.labels.rank !== undefined) {
    const rank = alert.labels.rank;
    return { how: STOPPED[alert.labels.alertname], who: `rank ${rank}`, one: true, host: alert.labels.host, action: alert.annotations.action };
  }
  const run = known.run;
  if (!run || !["hung", "failed"].includes(run.state)) return null;
  const detail = run.state_detail || "";
  const action = alert ? alert.annotations.action : null;
  const several = run.state === "hung" ? /wait for (\d+) ranks \(([^)]*)\)/.exec(detail) : null; // not an error's text
  if (several) return { how: run.state, who: `ranks ${several[2]}`, one: false, count: several[1], host: null, action, detail };
  const named = /rank (\d+)(?: \(host ([^)]+)\))?/.exec(detail);
  return named ? { how: run.state, who: `rank ${named[1]}`, one: true, host: named[2], action, detail } : null;
}

function culpritItem(t) {
  const where = t.host ? `host ${t.host}; ` : t.one ? "" : `${t.count} ranks; `;
  const what = t.how === "hung" ? `the others wait for ${t.one ? "it" : "them"}: the run is hung` : "it failed first: the run failed";
  return item("glance-slowest", "Culprit", t.who, `${where}${what} (see the alert above)`, "bad");
}

// The straggler view's worst rank; in a run without a pipeline, the rank the others wait for in the
// collectives where the straggler view finds no persistent one, or only ranks that wait for it (its lateness may
// be host work, not compute).
function slowestItem(view, analysis) {
  const finding = view.findings[0];
  const split = analysis ? analysis.step_split : null;
  const culprit = timedLateCulprit(split);
  if (culprit && !(finding && finding.verdict === "persistent" && !waitsForCulprit(finding, culprit))) {
    const where = culprit.host ? `host ${culprit.host}; ` : "";
    return item("glance-slowest", "Slowest", `rank ${culprit.rank}`,
      `${where}its peers wait ${ms(culprit.lateness_ns)} ms a step each for it in the collectives (${percent(culprit.share)} of the waits)`, "bad");
  }
  if (!finding) return item("glance-slowest", "Slowest", "none", "every rank within the straggler thresholds");
  const score = view.rank_scores.find((s) => s.rank === finding.ranks[0]);
  const where = score ? [score.host && `host ${score.host}`, score.stage !== null && `stage ${score.stage}`].filter(Boolean).join(" · ") : "";
  const who = finding.kind === "slow rank" ? `rank ${finding.ranks[0]}` : `${finding.kind}: ${finding.ranks.length} ranks`;
  const ratio = finding.ratio ? `${finding.ratio.toFixed(2)}× ${finding.compared_with}, ` : "";
  return item("glance-slowest", "Slowest", who, `${where}${where ? "; " : ""}${ratio}${finding.verdict}`, "bad");
}

function suggestionItem(analysis, stopped) {
  if (stopped) { // a stalled or crashed run: its runbook first, no tuning advice
    const title = stopped.how === "hung" ? `Find why ${stopped.who} ${stopped.one ? "is" : "are"} stuck` : `Read ${stopped.who}'s log`;
    return item("glance-do", "Do first", title, stopped.action || stopped.detail || "see the alert above", "long");
  }
  const s = analysis.suggestions.find((x) => !x.within_noise);
  const noisy = analysis.suggestions.filter((x) => x.within_noise);
  const split = analysis.step_split;
  if (split && !split.compute_instrumented) {
    return item("glance-do", "Do first", "Instrument the model's compute", "collector.instrument_model(model) after building it (instrument_ddp does it for DDP); then the page can price fixes", "long");
  }
  if (analysis.advice_withheld) return item("glance-do", "Do first", "too few steps to advise", analysis.advice_withheld);
  if (!s && noisy.length) {
    const best = noisy[0];
    return item("glance-do", "Do first", "nothing clears the noise",
      `${noisy.length} fix${noisy.length > 1 ? "es" : ""} within noise; the best, ${best.title.charAt(0).toLowerCase()}${best.title.slice(1)}, saves ${ms(best.current_step_ns - best.predicted_step_ns)} ms ± ${ms(best.gain_half_width_ns)} ms`);
  }
  if (!s) {
    const uneven = unevenOutsideWork(analysis); // one stage's work outside the pipeline holds the others
    if (uneven) return item("glance-do", "Do first", "balance the work outside the pipeline", uneven, "long");
    return item("glance-do", "Do first", "nothing to change", overheadsDominate(analysis) || "no suggestion predicts a faster step");
  }
  const sign = s.gain_fraction >= 0 ? "−" : "+"; // as the suggestions list writes it (analysis.js)
  const gain = `${ms(s.current_step_ns)} → ${ms(s.predicted_step_ns)} ms (${sign}${Math.abs(100 * s.gain_fraction).toFixed(1)}%)`;
  return item("glance-do", "Do first", s.title, gain, "long");
}

function alertsItem(firing) {
  if (!firing.length) return item("glance-alerts", "Alerts", "none firing", "");
  const critical = firing.filter((a) => a.labels.severity === "critical").length;
  return item("glance-alerts", "Alerts", `${firing.length} firing`,
    el("a", { href: "#alert-banner" }, critical ? `${critical} critical: see above` : "see above"), critical ? "bad" : "");
}

// The straggler section names a stopped run's culprit first, as the banner and the glance do: its findings are of
// the steps before the hang or the crash, and a warm-up's one-off there is not the cause.
function stragglerCulprit(t) {
  const line = document.getElementById("straggler-culprit");
  if (!line) return;
  line.hidden = !t;
  line.textContent = !t ? "" : t.how === "hung"
    ? `The run is hung on ${t.who}: the others wait for ${t.one ? "it" : "them"} (the alert above). The cells below are the steps before the hang.`
    : `The run failed: ${t.who} failed first (the alert above). The cells below are the steps before the failure.`;
}

function render() {
  const box = document.getElementById("glance");
  if (!known.run) return;
  const stopped = trouble(); // a hung or failed run's culprit, read once for the cards and the straggler section
  stragglerCulprit(stopped);
  const sentence = verdict(known, stopped);
  box.replaceChildren(
    ...(sentence ? [el("p", { class: "glance-verdict", id: "glance-verdict" }, sentence)] : []),
    stepItem(known.run),
    known.analysis ? bubbleItem(known.analysis) : waiting("glance-bubble", known.run.config.schedule ? "Bubble" : "Compute"),
    known.analysis ? causeItem(known.analysis) : waiting("glance-cause", "Largest cause"),
    stopped ? culpritItem(stopped) : known.stragglers ? slowestItem(known.stragglers, known.analysis) : waiting("glance-slowest", "Slowest"),
    known.analysis || stopped ? suggestionItem(known.analysis || { suggestions: [] }, stopped) : waiting("glance-do", "Do first"),
    known.firing ? alertsItem(known.firing) : waiting("glance-alerts", "Alerts"),
  );
  box.hidden = false;
}

// Takes whichever of run, analysis, stragglers and firing (alerts) is given, and redraws the card.
export function renderGlance(parts) {
  Object.assign(known, parts);
  render();
}
