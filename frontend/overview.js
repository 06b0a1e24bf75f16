// The top of the run page: name, state and facts of the run; the step picker and the step's bubble (or, for a
// run without a pipeline, its compute and exposed communication).
import { comparedLink, el, fact, stateBadge } from "./dom.js";
import { ms, percent } from "./format.js";
import { isComplete, isWarmup } from "./glance.js";

export function renderRun(run) {
  const c = run.config;
  document.getElementById("run-title").textContent = run.name;
  document.getElementById("crumb").textContent = run.key;
  document.title = `Bubblescope — ${run.name}`;
  const state = document.getElementById("run-state");
  state.replaceChildren(stateBadge(run), el("span", { class: run.state === "failed" ? "detail error" : "detail muted" }, run.state_detail));
  state.hidden = false;
  renderPurpose(c, run.key);
  const source = importedFrom(c.imported_from);
  renderSource(source);
  const dropped = run.dropped_spans;
  const imported = source ? source.ranks.length : null;
  document.getElementById("run-facts").replaceChildren(
    fact("Ranks", imported === null ? String(run.world_size) : `${imported} of ${run.world_size} (traces)`),
    fact("Schedule", c.schedule || "—"),
    fact("Stages × micro-batches", c.num_stages ? `${c.num_stages} × ${c.num_microbatches}` : "—"),
    fact("Steps", String(run.step_count)),
    fact("Dropped spans", String(dropped)),
    fact("Run key", run.key, true),
  );
}

// What the run tried (config title) and the run it re-runs with a change (compare_with), under the name.
function renderPurpose(c, key) {
  const line = document.getElementById("run-purpose");
  const title = typeof c.title === "string" ? c.title : "";
  const before = typeof c.compare_with === "string" ? c.compare_with : "";
  line.replaceChildren(...[title, before && title ? " · " : "", before ? comparedLink(before, key) : ""].filter(Boolean));
  line.hidden = !title && !before;
}

// The config's imported_from where it has the shape the importer writes (any client may set config keys), else null.
function importedFrom(source) {
  const ok = source && typeof source === "object" && Array.isArray(source.ranks) && source.files && typeof source.files === "object"
    && Array.isArray(source.steps);
  return ok ? source : null;
}

// A run imported from profiler traces (bubblescope import-trace): which file each rank came from, the profiler and
// its steps, so nobody mistakes two sampled ranks for the whole job.
function renderSource(source) {
  const line = document.getElementById("run-source");
  if (!source) { line.hidden = true; return; }
  const files = Object.entries(source.files).map(([rank, file]) => `rank ${rank}: ${file}`);
  const steps = source.steps.length ? `profiler steps ${source.steps[0]}–${source.steps[source.steps.length - 1]}` : "no steps";
  line.replaceChildren(
    el("strong", {}, `Imported from ${source.format}s`), ` — ${files.join(", ")} · ${source.profiler} · ${steps}`,
  );
  line.hidden = false;
}

let shownOptions = null; // the options' text, so an open picker is rebuilt only when the steps change

// One option per step with spans, warm-up and partial steps marked; `chosen` selected.
export function renderStepOptions(steps, chosen, run) {
  const select = document.getElementById("step-select");
  const mark = (s) => (!isComplete(run, s) ? ` (partial: ${s.ranks_reported} of ${run.world_size} ranks)`
    : isWarmup(run, s) ? " (warm-up)" : "");
  const options = steps.map((s) => [String(s.step), `${s.step} — ${ms(s.wall_ns)} ms${mark(s)}`]);
  const text = JSON.stringify(options);
  if (text !== shownOptions) {
    select.replaceChildren(...options.map(([value, label]) => el("option", { value }, label)));
    shownOptions = text;
  }
  if (chosen !== null) select.value = String(chosen);
}

export function renderStepNote(text, isError = false) {
  const note = document.getElementById("step-note");
  note.textContent = text;
  note.className = isError ? "error" : "muted";
}

// A run that registered a pipeline: the step's bubble beside its closed form. Any other run (DDP, FSDP2, tensor
// parallel, a plain loop) has no bubble: its step's compute and exposed communication, over the ranks.
export function renderBubble(detail, run) {
  const b = detail.bubble;
  const facts = run && !run.config.schedule ? stepShares(detail.breakdown) : [
    fact("Measured bubble, this step", percent(b.measured_fraction)),
    fact(`Theoretical ${b.formula || ""}`, percent(b.theoretical_fraction)),
  ];
  document.getElementById("bubble-facts").replaceChildren(...facts, fact("Step wall time", `${ms(b.wall_ns)} ms`));
  const aggregates = detail.breakdown.filter((r) => !r.from_spans).length;
  renderStepNote(`${detail.spans.length} spans` + (aggregates ? `; ${aggregates} rank(s) from their step aggregates (no spans)` : ""));
}

function stepShares(rows) {
  const sum = (field) => rows.reduce((total, r) => total + r[field], 0);
  const window = sum("window_ns") || 1;
  return [
    fact("Compute, this step", percent(sum("compute_ns") / window)),
    fact("Exposed communication", `${percent(sum("exposed_comm_ns") / window)} (waiting ${percent(sum("dependency_wait_ns") / window)})`),
  ];
}
