// The run page's analysis section: the measured bubble split into causes (ms and % of the step)
// beside the closed-form and simulated floors, stage imbalance, and the ranked suggestions with
// their predicted step time and the change in torch / torchtitan / Megatron-LM terms. A run without a
// pipeline has no bubble: the section shows where its step goes (analysis.step_split) instead.
import { cell, el, fact, plot, say } from "./dom.js";
import { bytes, ms, percent, plotText } from "./format.js";
import { cause } from "./causes.js";
import { overheadsDominate, unevenOutsideWork } from "./overhead.js";

const LISTED_STAGES = 8; // more stages than this are summed up as a range

// Parts of a step (a bubble's causes, or the parts of a step without a pipeline), ms per rank per step: the
// `drawn` ones as one horizontal bar in `row`, every one of `listed` in the table under it.
function drawParts(drawn, listed, row, axisTitle, barmode) {
  const explain = (p) => p.explanation || cause(p.name).explanation || "";
  const traces = drawn.map((p) => ({
    type: "bar", orientation: "h", name: plotText(cause(p.name).label), y: [row], x: [p.ns / 1e6],
    marker: { color: cause(p.name).color },
    hovertext: [`${plotText(cause(p.name).label)}: ${ms(p.ns)} ms (${percent(p.fraction_of_step)} of the step)<br>${plotText(explain(p))}`],
    hoverinfo: "text", text: [`${ms(p.ns)} ms`], textposition: "inside",
  }));
  const chart = plot("attribution-chart", traces, {
    barmode, height: 150, margin: { l: 60, r: 20, t: 30, b: 40 },
    xaxis: { title: { text: axisTitle } }, legend: { orientation: "h", x: 0, y: 1.15, yanchor: "bottom" },
  });
  document.querySelector("#causes tbody").replaceChildren(...listed.map((p) => {
    const tr = document.createElement("tr");
    tr.append(cell(cause(p.name).label, "text"), cell(ms(p.ns)), cell(percent(p.fraction_of_step)), cell(explain(p), "text"));
    return tr;
  }));
  return chart;
}

function renderAttribution(a, stepNs) {
  document.getElementById("analysis-facts").replaceChildren(
    fact("Median step", `${ms(stepNs)} ms`),
    fact("Measured bubble, median of the steps", `${ms(a.measured_bubble_ns)} ms · ${percent(a.measured_bubble_fraction)}`),
    fact(`Closed-form floor ${a.closed_form_formula || ""}`, percent(a.closed_form_fraction)),
    fact("Simulated floor (measured stage times)", `${ms(a.simulated_floor_ns)} ms · ${percent(a.simulated_floor_fraction)}`),
  );
  // causes stop at the measurement: what the replay idles beyond it is said, not drawn as a negative bar
  say("attribution-note", a.replay_excess_ns > 0
    ? `The replay with this run's median stage costs and transfers idles ${ms(a.replay_excess_ns)} ms a rank more than was measured: the causes stop at the measured bubble.`
    : "");
  const drawn = drawParts(a.causes, a.causes, "bubble", "ms of idle per rank per step", "relative");
  return drawn;
}

// A step without a pipeline, split into its parts (compute, optimizer, data loading, waiting for peers,
// transfer, host gaps), ms per rank per step; exposed communication per group; the rank the others wait for.
function renderStepSplit(split, stepNs) {
  const share = (name) => split.parts.find((p) => p.name === name);
  const exposed = share("collective_wait").ns + share("collective_transfer").ns;
  document.getElementById("analysis-facts").replaceChildren(
    fact("Median step", `${ms(stepNs)} ms`),
    fact("Compute (forward and backward)", `${ms(share("model_compute").ns)} ms · ${percent(share("model_compute").fraction_of_step)}`),
    fact("Exposed communication", `${ms(exposed)} ms · waiting for peers ${ms(share("collective_wait").ns)} ms`),
    fact("Host gaps (nothing recorded)", `${ms(share("host_gaps").ns)} ms · ${percent(share("host_gaps").fraction_of_step)}`),
  );
  const drawn = drawParts(split.parts.filter((p) => p.ns > 0), split.parts, "step", "ms per rank per step", "stack");
  const groups = split.groups.map((g) => `${g.group} ${ms(g.exposed_ns)} ms (waiting ${ms(g.wait_ns)}, transfer ${ms(g.transfer_ns)})`);
  const c = split.culprit;
  const culprit = c ? ` Rank ${c.rank}${c.host ? ` (host ${c.host})` : ""} starts the collectives last: ${percent(c.share)} of the waits in them are for it.` : "";
  say("attribution-note", groups.length ? `Exposed communication a rank per step, by group: ${groups.join(" · ")}.${culprit}` : culprit.trim());
  return drawn;
}

// Imbalance in time, and in layers where they are known (declared by the job, or counted by the collector).
// timed: the stages' layers timed one by one (pipeline.stage_layers), or null
function renderImbalance(im, layersSource, outside, timed) {
  const note = document.getElementById("imbalance-note");
  if (!im) { note.textContent = outside || ""; return; }
  const costs = im.stage_cost_ns;
  const sorted = [...costs].sort((a, b) => a - b);
  const stages = costs.length <= LISTED_STAGES
    ? costs.map((ns, i) => `stage ${i}: ${ms(ns)} ms`).join(" · ")
    : `${costs.length} stages, ${ms(sorted[0])}–${ms(sorted[sorted.length - 1])} ms (median ${ms(sorted[Math.floor(sorted.length / 2)])} ms)`;
  let text = `Per micro-batch (forward + backward) — ${stages}. Slowest: stage ${im.slowest_stage}, ${percent(im.slowest_excess)} above the mean.`;
  const total = (c) => c.forward_ns + c.backward_ns;
  // what the moved layers cost: as timed (the layers crossing the boundary between the two stages: between the
  // layers before it now and after the move), else the stage's cost spread evenly over its layers
  const before = (counts, boundary) => counts.slice(0, boundary + 1).reduce((sum, n) => sum + n, 0);
  const moved = (m) => {
    if (!timed) return m.layers * costs[m.from_stage] / im.layers_per_stage[m.from_stage];
    const boundary = Math.min(m.from_stage, m.to_stage);
    const [now, then] = [before(im.layers_per_stage, boundary), before(im.balanced_layers, boundary)];
    return timed.layers.flat().slice(Math.min(now, then), Math.max(now, then)).reduce((sum, c) => sum + total(c), 0);
  };
  if (timed) {
    const own = timed.own.length <= LISTED_STAGES ? timed.own.map((c, i) => `stage ${i}: ${ms(total(c))} ms`).join(" · ") : "";
    if (own) text += ` Each stage's own work outside its layers (runtime, embedding, head, loss), which stays on it when layers move — ${own}.`;
  }
  if (im.moves.length) {
    const moves = im.moves.map((m) => `move ${m.layers} layer(s) from stage ${m.from_stage} to ${m.to_stage} (${timed ? "" : "≈ "}${ms(moved(m))} ms per micro-batch)`).join("; ");
    const counted = layersSource === "counted" ? " (layers as the collector counted them in each stage's module)" : "";
    text += ` Balanced split ${im.balanced_layers.join(",")}${counted}: ${moves} → ${ms(im.balanced_step_ns)} ms per step.`;
  } else if (im.balanced_layers && im.balanced_cut_ns > 0) {
    text += ` The best split in whole layers, ${im.balanced_layers.join(",")}, would take ${ms(im.balanced_cut_ns)} ms per micro-batch off the slowest stage, within the ±${ms(im.noise_ns)} ms its cost is measured to: no move is worth making.`;
  } else if (!im.layers_per_stage && im.slowest_excess > 0.1) {
    text += ` Layers per stage unknown: move about ${ms(im.excess_ns)} ms of work per micro-batch out of stage ${im.slowest_stage} to balance.`;
  }
  if (outside) text += ` ${outside}`;
  note.textContent = text;
}

// Communication no compute hid, per mesh dimension (pipeline P2P excluded: it is in the bubble), largest first.
function renderExposed(byGroup, stepNs) {
  const parts = Object.entries(byGroup).filter(([, ns]) => ns / stepNs >= 0.005).sort((a, b) => b[1] - a[1]);
  say("exposed-note", parts.length
    ? `Exposed communication a rank per step, by mesh dimension: ${parts.map(([g, ns]) => `${g} ${ms(ns)} ms (${percent(ns / stepNs)} of the step)`).join(" · ")}.`
      + (parts.length > 1 ? ` Most of it is in ${parts[0][0]}.` : "")
    : "");
}

const MEMORY_SOURCES = {
  gpu_reserved: "(CUDA allocator's peak reserved bytes per step, highest over the steps)",
  host_rss: "(each process's peak resident set per step, highest over the steps)",
};

// Measured memory per stage beside the limit and the planner's prediction; the stage nearest its limit flagged.
function renderMemory(rows) {
  const box = document.getElementById("memory");
  box.hidden = !rows.length;
  if (!rows.length) return;
  document.getElementById("memory-source").textContent = MEMORY_SOURCES[rows[0].source] || "";
  // the planner's column where the run declared its model, the allocator's where a GPU was measured
  const columns = [
    ["Stage", (r) => (r.stage === null ? "—" : r.stage)], ["Ranks", (r) => r.ranks], ["Peak", (r) => bytes(r.peak_bytes)],
    ["On rank", (r) => `rank ${r.peak_rank}`, "text"], ["Median rank", (r) => bytes(r.median_bytes)],
    ["Limit", (r) => bytes(r.limit_bytes)], ["Of limit", (r) => percent(r.fraction_of_limit)],
    ...(rows.some((r) => r.predicted_bytes !== null) ? [["Planner", (r) => bytes(r.predicted_bytes)]] : []),
    ...(rows.some((r) => r.source === "gpu_reserved") ? [["Allocator retries", (r) => r.gpu_alloc_retries]] : []),
  ];
  const head = el("tr");
  head.append(...columns.map(([title, , cls]) => el("th", cls ? { class: cls } : {}, title)));
  document.querySelector("#memory-table thead").replaceChildren(head);
  document.querySelector("#memory-table tbody").replaceChildren(...rows.map((r) => {
    const tr = el("tr", r.nearest_limit ? { class: "nearest" } : {});
    tr.append(...columns.map(([, value, cls]) => cell(value(r), cls)));
    return tr;
  }));
  const top = rows.find((r) => r.nearest_limit);
  const where = top.stage === null ? "These ranks are" : `Stage ${top.stage} is`;
  let text = top.fraction_of_limit === null
    ? `${where} the fullest: ${bytes(top.peak_bytes)} on rank ${top.peak_rank} (no limit registered).`
    : `${where} nearest its limit: ${bytes(top.peak_bytes)} of ${bytes(top.limit_bytes)} (${percent(top.fraction_of_limit)}) on rank ${top.peak_rank}.`;
  if (top.gpu_alloc_retries > 0) text += ` The allocator retried ${top.gpu_alloc_retries} time(s): it flushed its cache to fit.`;
  if (top.predicted_bytes !== null) text += ` The planner predicts ${bytes(top.predicted_bytes)} there for the declared model.`;
  say("memory-note", text);
}

// Each instrumented block's forward and backward per step (median rank), the heaviest flagged, the slowest rank beside.
function renderBlocks(rows) {
  const box = document.getElementById("blocks");
  box.hidden = !rows.length;
  if (!rows.length) return;
  const total = (r) => r.forward_ns + r.backward_ns;
  // by the column the table shows: its share of the model's compute where every block has one, else its time
  const weight = rows.every((r) => r.share_of_model !== null) ? (r) => r.share_of_model : total;
  const heaviest = rows.reduce((a, b) => (weight(b) > weight(a) ? b : a));
  const layers = rows.some((r) => r.stage !== null && r.stage !== undefined);
  document.getElementById("blocks-source").textContent = layers
    ? "(each pipeline stage's layers, timed one by one: per step, median over ranks)"
    : "(instrument_model(model, blocks=…): per step, median over ranks)";
  document.querySelector("#blocks-table tbody").replaceChildren(...rows.map((r) => {
    const tr = el("tr", r === heaviest ? { class: "nearest" } : {});
    const slowest = r.slowest_ns > 1.1 * total(r) ? `rank ${r.slowest_rank}: ${ms(r.slowest_ns)} ms (${(r.slowest_ns / total(r)).toFixed(2)}× the median rank)` : "—";
    tr.append(cell(r.block, "text"), cell(ms(r.forward_ns)), cell(ms(r.backward_ns)),
      cell(r.share_of_model === null ? "—" : percent(r.share_of_model)), cell(slowest, "text"));
    return tr;
  }));
  const share = heaviest.share_of_model === null ? "" : ` (${percent(heaviest.share_of_model)} of the model's compute)`;
  const mean = rows.reduce((sum, r) => sum + total(r), 0) / rows.length;
  say("blocks-note", `Heaviest block: ${heaviest.block}, ${ms(total(heaviest))} ms a step${share}, ${(total(heaviest) / mean).toFixed(2)}× the mean block.`
    + " A slowest rank is named where it costs over 1.1× the median rank.");
}

// bubbleNs: today's measured bubble; a predicted bubble is said in ms first, as its fraction is of another step
function suggestionItem(s, bubbleNs) {
  const li = el("li", { class: "suggestion" });
  const gain = `${ms(s.current_step_ns)} → ${ms(s.predicted_step_ns)} ms (${s.gain_fraction >= 0 ? "−" : "+"}${Math.abs(100 * s.gain_fraction).toFixed(1)}%)`;
  const predictedNs = s.predicted_bubble_fraction === null ? null : s.predicted_bubble_fraction * s.predicted_step_ns;
  const bubble = predictedNs === null ? ""
    : `, bubble ${bubbleNs === null ? "" : `${ms(bubbleNs)} → `}${ms(predictedNs)} ms a step (${percent(s.predicted_bubble_fraction)} of the new step)`;
  const interval = s.gain_half_width_ns > 0 ? `, ±${ms(s.gain_half_width_ns)} ms (95%)` : "";
  li.append(el("div", { class: "title" }, s.title), el("div", { class: "muted" }, `predicted ${gain}${interval}${bubble}`));
  if (s.within_noise) {
    li.classList.add("within-noise");
    li.append(el("div", { class: "noise" }, `Within noise: the gain, ${ms(s.current_step_ns - s.predicted_step_ns)} ms, does not clear `
      + `±${ms(s.gain_half_width_ns)} ms, the run's own step-to-step variation and the replay's error. Not a call to act.`));
  }
  li.append(el("div", {}, `Evidence: ${s.evidence}`), el("div", {}, `Memory: ${s.memory_cost}`));
  const code = [];
  if (s.torch_pipelining) code.push(`torch: ${s.torch_pipelining}`);
  // torchtitan's command-line flags (a key with a colon is a choice, given bare and last, as its parser takes it:
  // activation-checkpoint:full); a list of lists (model parts) is set in the job's config function instead
  const entries = Object.entries(s.torchtitan);
  const flag = ([k, v]) => (k.includes(":") ? k : v === true ? `--${k}` : `--${k} ${v}`);
  const flags = entries.filter(([k, v]) => !Array.isArray(v) && !k.includes(":")).map(flag)
    .concat(entries.filter(([k]) => k.includes(":")).map(flag));
  const listed = entries.filter(([, v]) => Array.isArray(v)).map(([k, v]) => `config.${k} = ${JSON.stringify(v)}  # in your config function`);
  if (flags.length) code.push(`torchtitan: ${flags.join(" ")}`);
  code.push(...listed.map((line) => `torchtitan: ${line}`));
  if (s.megatron.filter(Boolean).length) code.push(`Megatron-LM: ${s.megatron.filter(Boolean).join(" ")}`);
  li.append(el("pre", {}, code.join("\n")));
  return li;
}

export function renderAnalysis(view) {
  const span = (steps) => (steps.length > 1 ? `${steps[0]}–${steps[steps.length - 1]}` : `${steps[0]}`);
  const out = [
    view.warmup_steps_left_out.length ? `warm-up ${span(view.warmup_steps_left_out)}` : null,
    view.partial_steps_left_out.length ? `partial ${view.partial_steps_left_out.join(", ")}` : null,
  ].filter(Boolean);
  const spanned = view.steps.length - view.steps_from_aggregates.length;
  const aggregated = view.steps_from_aggregates.length ? `, ${view.steps_from_aggregates.length} from their aggregates` : "";
  document.getElementById("analysis-note").textContent = `(steps ${span(view.steps)}, ${spanned} with spans${aggregated}`
    + (out.length ? `; left out: ${out.join(", ")})` : ")");
  const split = view.step_split;
  document.getElementById("analysis-heading").textContent = split ? "Where the step goes, and what to change" : "Why the bubble, and what to change";
  let drawn;
  if (split) {
    drawn = renderStepSplit(split, view.step_ns);
    say("analysis-error", split.not_instrumented ? `Compute is not instrumented: ${split.not_instrumented.replace(/^compute is not instrumented: /, "")}` : "");
  } else {
    drawn = view.attribution ? renderAttribution(view.attribution, view.step_ns) : undefined;
    say("analysis-error", view.attribution ? "" : `No pipeline replay: ${view.pipeline_unavailable}`);
  }
  const nothing = !split && !view.attribution; // no chart and no causes: no empty plot area, no table of headers
  document.getElementById("attribution-chart").hidden = nothing;
  document.getElementById("causes").closest(".scroll").hidden = nothing;
  renderExposed(split ? {} : view.exposed_comm_ns_by_group, view.step_ns);
  renderImbalance(view.imbalance, view.layers_source, unevenOutsideWork(view), view.pipeline?.stage_layers || null);
  renderMemory(view.memory);
  renderBlocks(view.block_costs || []); // an answer cached by an older service has none
  const why = unevenOutsideWork(view) || overheadsDominate(view); // one stage holds the others, or overheads outweigh the work
  const blind = split && !split.compute_instrumented; // nothing can be priced on a step whose compute reads as gaps
  const items = view.suggestions.length
    ? view.suggestions.map((s) => suggestionItem(s, view.attribution ? view.attribution.measured_bubble_ns : null))
    : [el("li", { class: "muted" }, view.advice_withheld ? `Too few steps to advise: ${view.advice_withheld}.`
      : blind ? "Instrument the model's compute first (above): no fix is priced on a step whose training reads as host gaps."
      : `Nothing to change: no fix is predicted to save 1% of the step${why ? `; ${why}` : ""}.`)];
  document.getElementById("suggestions").replaceChildren(...items);
  document.body.dataset.suggestions = String(view.suggestions.length);
  return drawn;
}

export const showAnalysisError = (error) => say("analysis-error", `No analysis yet: ${error.message}`);
