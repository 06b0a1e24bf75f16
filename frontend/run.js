"use strict";
// The run page: step selector, aligned timeline (one row per rank), per-rank breakdown, bubble.
const runKey = decodeURIComponent(location.pathname.split("/").filter(Boolean).pop());
const KIND_COLORS = {
  forward: "#2f6fde", backward: "#f08c2e", backward_input: "#f0a35e", backward_weight: "#c46a12",
  optimizer: "#2e9e5b", data_loading: "#9aa3b2", send: "#8e5bd0", recv: "#d0457a",
  all_reduce: "#0f9fb0", all_gather: "#13b3a0", reduce_scatter: "#5fc2d6", all_to_all: "#7a86c2", broadcast: "#b06fb0",
};
// wanted: the step the user picked (also ?step=N, so a step view can be linked); null follows the
// latest step. requests: showStep calls so far; only the latest one may render.
const linkedStep = new URLSearchParams(location.search).get("step");
const state = { run: null, step: null, wanted: linkedStep === null ? null : Number(linkedStep), requests: 0 };

function rankLabel(rank) {
  const info = state.run.ranks.find((r) => r.rank === rank);
  if (info && info.stages && info.stages.length > 1) return `rank ${rank} · stages ${info.stages.join(", ")}`;
  return info && info.stage !== null ? `rank ${rank} · stage ${info.stage}` : `rank ${rank}`;
}

function renderFacts(run) {
  const c = run.config;
  document.getElementById("run-title").textContent = `${run.name}`;
  document.getElementById("crumb").textContent = run.key;
  document.title = `Bubblescope — ${run.name}`;
  const state = document.getElementById("run-state");
  state.replaceChildren(bs.stateBadge(run), bs.el("span", { class: run.state === "failed" ? "detail error" : "detail muted" }, run.state_detail));
  state.hidden = false;
  const dropped = run.ranks.reduce((sum, r) => sum + r.dropped_spans, 0);
  document.getElementById("run-facts").replaceChildren(
    bs.fact("Ranks", String(run.world_size)),
    bs.fact("Schedule", c.schedule || "—"),
    bs.fact("Stages × micro-batches", c.num_stages ? `${c.num_stages} × ${c.num_microbatches}` : "—"),
    bs.fact("Steps", String(run.step_count)),
    bs.fact("Dropped spans", String(dropped)),
    bs.fact("Run key", run.key, true),
  );
}

function renderStepOptions(run) {
  const select = document.getElementById("step-select");
  const steps = run.steps.filter((s) => s.has_spans);
  select.replaceChildren(...steps.map((s) => bs.el("option", { value: String(s.step) }, `${s.step} — ${bs.ms(s.wall_ns)} ms`)));
  if (!steps.length) return null;
  const picked = steps.some((s) => s.step === state.wanted);
  const chosen = picked ? state.wanted : steps[steps.length - 1].step;
  select.value = String(chosen);
  return chosen;
}

function renderBubble(detail) {
  const b = detail.bubble;
  const theory = b.theoretical_fraction === null ? "—" : `${(100 * b.theoretical_fraction).toFixed(1)}%`;
  document.getElementById("bubble-facts").replaceChildren(
    bs.fact("Measured bubble", `${(100 * b.measured_fraction).toFixed(1)}%`),
    bs.fact(`Theoretical ${b.formula || ""}`, theory),
    bs.fact("Step wall time", `${bs.ms(b.wall_ns)} ms`),
  );
}

function renderTimeline(detail) {
  const ranks = [...new Set(state.run.ranks.map((r) => r.rank).concat(detail.breakdown.map((b) => b.rank)))].sort((a, b) => a - b);
  const byKind = new Map();
  for (const span of detail.spans) {
    if (!byKind.has(span.kind)) byKind.set(span.kind, []);
    byKind.get(span.kind).push(span);
  }
  const traces = [...byKind.entries()].map(([kind, spans]) => ({
    type: "bar", orientation: "h", name: kind, marker: { color: KIND_COLORS[kind] || "#777" },
    y: spans.map((s) => rankLabel(s.rank)),
    base: spans.map((s) => s.start_ns / 1e6),
    x: spans.map((s) => Math.max((s.end_ns - s.start_ns) / 1e6, 0.01)),
    text: spans.map((s) => (s.microbatch === null ? "" : String(s.microbatch))),
    textposition: "inside", insidetextanchor: "middle",
    hovertext: spans.map((s) => [
      `${s.kind}${s.microbatch === null ? "" : ` · micro-batch ${s.microbatch}`}`,
      s.stage === null ? null : `stage ${s.stage}`, s.peer === null ? null : `peer rank ${s.peer}`,
      s.bytes === null ? null : `${s.bytes} bytes`,
      `${bs.ms(s.start_ns)} → ${bs.ms(s.end_ns)} ms (${((s.end_ns - s.start_ns) / 1e6).toFixed(2)} ms)`,
    ].filter(Boolean).join("<br>")),
    hoverinfo: "text",
  }));
  const layout = {
    barmode: "overlay", bargap: 0.25, margin: { l: 130, r: 20, t: 30, b: 45 },
    xaxis: { title: { text: "ms since step start" }, zeroline: false },
    yaxis: { categoryorder: "array", categoryarray: ranks.map(rankLabel).reverse(), automargin: true },
    legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom" }, height: Math.max(240, 60 * ranks.length + 110),
  };
  Plotly.react("timeline", traces, layout, { displaylogo: false, responsive: true });
}

function renderBreakdown(detail) {
  const rows = detail.breakdown;
  const labels = rows.map((b) => rankLabel(b.rank));
  const part = (name, key, color) => ({ type: "bar", orientation: "h", name, y: labels, x: rows.map((b) => b[key] / 1e6), marker: { color } });
  Plotly.react("breakdown-chart", [
    part("compute", "compute_ns", "#2f6fde"), part("transfer", "transfer_ns", "#8e5bd0"),
    part("dependency wait", "dependency_wait_ns", "#e7a3bd"), part("idle", "idle_ns", "#d7dbe3"),
  ], { barmode: "stack", margin: { l: 130, r: 20, t: 30, b: 45 }, xaxis: { title: { text: "ms" } },
       yaxis: { autorange: "reversed", automargin: true }, legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom" } },
  { displaylogo: false, responsive: true });
  document.querySelector("#breakdown tbody").replaceChildren(...rows.map((b) => {
    const tr = document.createElement("tr");
    const share = (ns) => `${bs.ms(ns)} (${bs.pct(ns, b.window_ns)})`;
    tr.append(bs.cell(`rank ${b.rank}`, "text"), bs.cell(b.stage === null ? "—" : b.stage), bs.cell(bs.ms(b.window_ns)),
      bs.cell(share(b.compute_ns)), bs.cell(share(b.transfer_ns)), bs.cell(share(b.dependency_wait_ns)),
      bs.cell(share(b.idle_ns)), bs.cell(bs.ms(b.overlapped_comm_ns)), bs.cell(`${(100 * b.bubble_fraction).toFixed(1)}%`));
    return tr;
  }));
}

async function showStep(step) {
  const request = ++state.requests;
  const detail = await bs.getJson(`/api/v1/runs/${encodeURIComponent(runKey)}/steps/${step}`);
  if (request !== state.requests) return; // a later pick or refresh asked for another step meanwhile
  state.step = step;
  document.getElementById("step-note").textContent = `${detail.spans.length} spans`;
  renderBubble(detail);
  renderTimeline(detail);
  renderBreakdown(detail);
  document.body.dataset.renderedStep = String(step);
}

async function refresh() {
  const error = document.getElementById("run-error");
  try {
    const run = await bs.getJson(`/api/v1/runs/${encodeURIComponent(runKey)}`);
    state.run = run;
    renderFacts(run);
    const step = renderStepOptions(run);
    if (step !== null && step !== state.step) await showStep(step);
    if (step === null) document.getElementById("step-note").textContent = "no step with spans yet";
    error.hidden = true;
  } catch (e) {
    if (e.status === 404) { // no such run: say so once, hide the empty panels, stop polling
      bs.missing = true;
      document.querySelector("main").classList.add("missing");
      error.textContent = `No run "${runKey}" here (${e.message}). The runs this service knows are listed at /.`;
    } else {
      error.textContent = `Could not load run ${runKey}: ${e.message}`;
    }
    error.hidden = false;
  }
}

document.getElementById("step-select").addEventListener("change", async (event) => {
  const steps = state.run.steps.filter((s) => s.has_spans);
  const chosen = Number(event.target.value);
  state.wanted = chosen === steps[steps.length - 1].step ? null : chosen;
  const url = new URL(location.href);
  if (state.wanted === null) url.searchParams.delete("step");
  else url.searchParams.set("step", String(chosen));
  history.replaceState(null, "", url);
  await showStep(chosen);
});
bs.poll(refresh, 3000);
