"use strict";
// The run page's analysis section: the measured bubble split into causes (ms and % of the step)
// beside the closed-form and simulated floors, stage imbalance, and the ranked suggestions with
// their predicted step time and the change in torch / torchtitan / Megatron-LM terms.
// Loaded with `defer` from inside <main>; refreshes every 5 s while the run grows.
(() => {
  const key = decodeURIComponent(location.pathname.split("/").filter(Boolean).pop());
  const CAUSE_LABELS = {
    schedule_inherent: "schedule-inherent", stage_imbalance: "stage imbalance",
    communication_wait: "communication wait", straggler_jitter: "straggler / jitter",
  };
  const CAUSE_COLORS = { schedule_inherent: "#9aa3b2", stage_imbalance: "#f08c2e", communication_wait: "#8e5bd0", straggler_jitter: "#d0457a" };
  let lastBody = null;
  const pct = (f) => (f === null || f === undefined ? "—" : `${(100 * f).toFixed(1)}%`);

  function renderAttribution(a, stepNs) {
    const facts = document.getElementById("analysis-facts");
    facts.replaceChildren(
      bs.fact("Median step", `${bs.ms(stepNs)} ms`),
      bs.fact("Measured bubble", `${bs.ms(a.measured_bubble_ns)} ms · ${pct(a.measured_bubble_fraction)}`),
      bs.fact(`Closed-form floor ${a.closed_form_formula || ""}`, pct(a.closed_form_fraction)),
      bs.fact("Simulated floor (measured stage times)", pct(a.simulated_floor_fraction)),
    );
    const traces = a.causes.map((c) => ({
      type: "bar", orientation: "h", name: CAUSE_LABELS[c.name] || c.name, y: ["bubble"], x: [c.ns / 1e6],
      marker: { color: CAUSE_COLORS[c.name] || "#777" },
      hovertext: [`${CAUSE_LABELS[c.name]}: ${bs.ms(c.ns)} ms (${pct(c.fraction_of_step)} of the step)<br>${c.explanation}`],
      hoverinfo: "text", text: [`${bs.ms(c.ns)} ms`], textposition: "inside",
    }));
    Plotly.react("attribution-chart", traces, {
      barmode: "relative", height: 150, margin: { l: 60, r: 20, t: 30, b: 40 },
      xaxis: { title: { text: "ms of idle per rank per step" } }, legend: { orientation: "h", x: 0, y: 1.15, yanchor: "bottom" },
    }, { displaylogo: false, responsive: true });
    document.querySelector("#causes tbody").replaceChildren(...a.causes.map((c) => {
      const tr = document.createElement("tr");
      tr.append(bs.cell(CAUSE_LABELS[c.name] || c.name, "text"), bs.cell(bs.ms(c.ns)), bs.cell(pct(c.fraction_of_step)), bs.cell(c.explanation, "text"));
      return tr;
    }));
  }

  function renderImbalance(im) {
    const note = document.getElementById("imbalance-note");
    if (!im) { note.textContent = ""; return; }
    const stages = im.stage_cost_ns.map((ns, i) => `stage ${i}: ${bs.ms(ns)} ms`).join(" · ");
    let text = `Per micro-batch (forward + backward) — ${stages}. Slowest: stage ${im.slowest_stage}, ${pct(im.slowest_excess)} above the mean.`;
    if (im.moves.length) {
      const moves = im.moves.map((m) => `move ${m.layers} layer(s) from stage ${m.from_stage} to ${m.to_stage}`).join("; ");
      text += ` Balanced split ${im.balanced_layers.join(",")}: ${moves} → ${bs.ms(im.balanced_step_ns)} ms per step.`;
    }
    note.textContent = text;
  }

  function suggestionItem(s) {
    const li = bs.el("li", { class: "suggestion" });
    const gain = `${bs.ms(s.current_step_ns)} → ${bs.ms(s.predicted_step_ns)} ms (${s.gain_fraction >= 0 ? "−" : "+"}${Math.abs(100 * s.gain_fraction).toFixed(1)}%)`;
    const bubble = s.predicted_bubble_fraction === null ? "" : `, bubble ${pct(s.predicted_bubble_fraction)}`;
    li.append(bs.el("div", { class: "title" }, `${s.title}`), bs.el("div", { class: "muted" }, `predicted ${gain}${bubble}`));
    li.append(bs.el("div", {}, `Evidence: ${s.evidence}`), bs.el("div", {}, `Memory: ${s.memory_cost}`));
    const code = [];
    if (s.torch_pipelining) code.push(`torch: ${s.torch_pipelining}`);
    const titan = Object.entries(s.torchtitan).map(([k, v]) => `${k} = ${JSON.stringify(v)}`);
    if (titan.length) code.push(`torchtitan: ${titan.join("; ")}`);
    if (s.megatron.filter(Boolean).length) code.push(`Megatron-LM: ${s.megatron.filter(Boolean).join(" ")}`);
    li.append(bs.el("pre", {}, code.join("\n")));
    return li;
  }

  function render(view) {
    const error = document.getElementById("analysis-error");
    error.hidden = true;
    document.getElementById("analysis-note").textContent = `(steps ${view.steps[0]}–${view.steps[view.steps.length - 1]}, ${view.steps.length} with spans)`;
    if (view.attribution) renderAttribution(view.attribution, view.step_ns);
    else { error.textContent = `No pipeline replay: ${view.pipeline_unavailable}`; error.hidden = false; }
    renderImbalance(view.imbalance);
    const list = document.getElementById("suggestions");
    list.replaceChildren(...(view.suggestions.length ? view.suggestions.map(suggestionItem) : [bs.el("li", { class: "muted" }, "Nothing to change: no fix is predicted to save 1% of the step.")]));
    document.body.dataset.suggestions = String(view.suggestions.length);
  }

  async function refresh() {
    try {
      const view = await bs.getJson(`/api/v1/runs/${encodeURIComponent(key)}/analysis`);
      const body = JSON.stringify(view);
      if (body !== lastBody) { lastBody = body; render(view); }
    } catch (e) {
      const error = document.getElementById("analysis-error");
      error.textContent = `No analysis yet: ${e.message}`;
      error.hidden = false;
    }
  }
  bs.poll(refresh, 5000);
})();
