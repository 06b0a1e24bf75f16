// The compare page (/compare?a=KEY&b=KEY): two runs side by side, before and after a fix: step time,
// bubble and its floor, each cause of the bubble, each stage's compute and waiting, and the first
// suggestion, from each run's detail and analysis (both already stored by the service: docs/scale.md).
import { api } from "./api.js";
import { cause, loadCauses } from "./causes.js";
import { cell, el, say } from "./dom.js";
import { ms, percent } from "./format.js";

const form = document.getElementById("compare-form");
const asked = new URLSearchParams(location.search);
for (const name of ["a", "b"]) form.elements[name].value = asked.get(name) || "";

const change = (before, after, format) => {
  if (before === null || before === undefined || after === null || after === undefined) return "—";
  const delta = after - before;
  const relative = before ? ` (${delta >= 0 ? "+" : "−"}${Math.abs((100 * delta) / before).toFixed(1)}%)` : "";
  return `${delta >= 0 ? "+" : "−"}${format(Math.abs(delta))}${relative}`;
};
const msText = (ns) => (ns === null || ns === undefined ? "—" : `${ms(ns)} ms`);

function line(label, before, after, format = msText, delta = (x, y) => change(x, y, (d) => `${ms(d)} ms`)) {
  const tr = el("tr");
  tr.append(cell(label, "text"), cell(format(before), "text"), cell(format(after), "text"), cell(delta(before, after)));
  return tr;
}

const section = (title) => {
  const tr = el("tr", { class: "section" });
  const th = el("th", { colspan: "4", class: "text" }, title);
  tr.append(th);
  return tr;
};

const causeNs = (analysis, name) => {
  const found = analysis.attribution && analysis.attribution.causes.find((c) => c.name === name);
  return found ? found.ns : null;
};
const stageOf = (analysis, stage) => analysis.stages.find((s) => s.stage === stage) || null;

function rows(runs, analyses) {
  const [a, b] = analyses;
  const out = [section("Runs")];
  out.push(line("Name", runs[0].name, runs[1].name, String, () => ""));
  out.push(line("State", runs[0].state, runs[1].state, String, () => ""));
  out.push(line("Ranks", runs[0].world_size, runs[1].world_size, String, () => ""));
  const shape = (r) => `${r.config.schedule || "—"}, ${r.config.num_stages || "?"} × ${r.config.num_microbatches || "?"}`;
  out.push(line("Schedule, stages × micro-batches", runs[0], runs[1], shape, () => ""));
  out.push(section("Step"));
  out.push(line("Median step", a.step_ns, b.step_ns));
  const bubble = (x) => (x.attribution ? x.attribution.measured_bubble_fraction : null);
  const floor = (x) => (x.attribution ? x.attribution.simulated_floor_fraction : null);
  const points = (x, y) => (x === null || y === null ? "—" : `${y >= x ? "+" : "−"}${Math.abs(100 * (y - x)).toFixed(1)} pts`);
  out.push(line("Measured bubble", bubble(a), bubble(b), percent, points));
  out.push(line("Simulated floor", floor(a), floor(b), percent, points));
  out.push(section("The bubble's causes, per rank per step"));
  const causes = [...new Set([a, b].flatMap((x) => (x.attribution ? x.attribution.causes.map((c) => c.name) : [])))];
  for (const name of causes) out.push(line(cause(name).label, causeNs(a, name), causeNs(b, name)));
  out.push(section("Per stage: compute · waiting (dependency wait + idle), per rank per step"));
  const stages = [...new Set([a, b].flatMap((x) => x.stages.map((s) => s.stage)))].sort((x, y) => (x ?? -1) - (y ?? -1));
  for (const stage of stages) {
    const [sa, sb] = [stageOf(a, stage), stageOf(b, stage)];
    const label = stage === null ? "no stage" : `stage ${stage}`;
    out.push(line(`${label} compute`, sa && sa.compute_ns, sb && sb.compute_ns));
    const waiting = (s) => (s ? s.dependency_wait_ns + s.idle_ns : null);
    out.push(line(`${label} waiting`, waiting(sa), waiting(sb)));
  }
  out.push(section("First suggestion"));
  const first = (x) => { const call = x.suggestions.find((s) => !s.within_noise); return call ? call.title : x.suggestions.length ? "nothing clears the noise" : "nothing to change"; };
  out.push(line("", first(a), first(b), String, () => ""));
  return out;
}

async function show() {
  const keys = [asked.get("a"), asked.get("b")];
  if (!keys[0] || !keys[1]) return;
  try {
    const [runs, analyses] = await Promise.all([
      Promise.all(keys.map((key) => api.run(key))),
      Promise.all(keys.map((key) => api.analysis(key))),
      loadCauses(),
    ]);
    document.getElementById("head-a").replaceChildren(el("a", { href: `/runs/${encodeURIComponent(keys[0])}` }, `Before: ${keys[0]}`));
    document.getElementById("head-b").replaceChildren(el("a", { href: `/runs/${encodeURIComponent(keys[1])}` }, `After: ${keys[1]}`));
    document.querySelector("#compare-table tbody").replaceChildren(...rows(runs, analyses));
    document.getElementById("compare").hidden = false;
    say("compare-error", "");
    document.body.dataset.drawn = "true";
  } catch (error) {
    say("compare-error", `Could not compare: ${error.message}`);
    document.body.dataset.drawn = "true";
  }
}

show();
