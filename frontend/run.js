// The run page (/runs/{key}): owns the run key, the picked step and the page's one polling loop.
// Each round asks for the run; the step view, the analysis and the stragglers are asked for again
// only when the run changed since they were last loaded, or when another step is to be shown.
import { api, worthRetrying } from "./api.js";
import { el, say } from "./dom.js";
import { spanKinds } from "./kinds.js";
import { renderAnalysis, showAnalysisError } from "./analysis.js";
import { renderBreakdown } from "./breakdown.js";
import { renderBubble, renderRun, renderStepNote, renderStepOptions } from "./overview.js";
import { poll } from "./poll.js";
import { renderStragglers, showStragglersError } from "./stragglers.js";
import { renderTimeline } from "./timeline.js";

const EVERY_MS = 3000;
const NOT_KNOWN_EVERY_MS = 5000; // a run not (yet) registered: its job may still be starting

const key = decodeURIComponent(location.pathname.split("/").filter(Boolean).pop());
const linkedStep = new URLSearchParams(location.search).get("step");

const state = {
  run: null,
  version: null, // of the run last loaded (runVersion)
  // The step the user picked (also ?step=N, so a step view can be linked); null follows the latest.
  wanted: linkedStep === null ? null : Number(linkedStep),
  requests: 0, // showStep calls so far: only the latest one may render
  step: null, // the step shown
  loaded: { step: null, analysis: null, stragglers: null }, // the run version each part was loaded at
};

// What changes whenever the service stores something for the run. updated_at alone is not enough:
// on SQLite it has whole seconds, and a second holds many batches.
const runVersion = (run) => JSON.stringify([run.updated_at, run.step_count, run.steps]);
const stepsWithSpans = (run) => run.steps.filter((s) => s.has_spans);

function chooseStep(steps) {
  if (!steps.length) return null;
  return steps.some((s) => s.step === state.wanted) ? state.wanted : steps[steps.length - 1].step;
}

async function showStep(step, version) {
  const request = ++state.requests;
  try {
    const [detail, kinds] = await Promise.all([api.step(key, step), spanKinds()]);
    if (request !== state.requests) return; // a later pick or round asked for a step meanwhile
    renderBubble(detail);
    renderTimeline(detail, state.run, kinds);
    renderBreakdown(detail, state.run, kinds);
    state.step = step;
    state.loaded.step = version;
    document.body.dataset.renderedStep = String(step);
  } catch (error) {
    if (request === state.requests) renderStepNote(`could not load step ${step}: ${error.message}`, true);
  }
}

// Loads one section and renders it; marks it loaded at `version` unless asking again may help.
async function refresh(name, load, render, showError, version) {
  try {
    render(await load(key));
    state.loaded[name] = version;
  } catch (error) {
    showError(error);
    if (!worthRetrying(error)) state.loaded[name] = version;
  }
}

function showNotKnown(error) {
  document.querySelector("main").classList.add("missing");
  document.getElementById("run-title").textContent = key;
  document.getElementById("crumb").textContent = key;
  const note = document.getElementById("run-error");
  note.className = "muted";
  note.replaceChildren(
    `Run "${key}" is not known here (yet): ${error.message}. A job that is still starting shows up once its first `
      + `rank registers; this page keeps checking every ${NOT_KNOWN_EVERY_MS / 1000} s. `,
    el("a", { href: "/" }, "The runs this service knows"),
  );
  note.hidden = false;
}

function showRunError(text) {
  const note = document.getElementById("run-error");
  note.className = "error";
  say("run-error", text);
}

async function round() {
  let run;
  try {
    run = await api.run(key);
  } catch (error) {
    if (error.status === 404) {
      showNotKnown(error);
      return NOT_KNOWN_EVERY_MS;
    }
    showRunError(`Could not load run ${key}: ${error.message}`);
    return EVERY_MS;
  }
  document.querySelector("main").classList.remove("missing");
  showRunError("");
  state.run = run;
  state.version = runVersion(run);
  renderRun(run);
  const steps = stepsWithSpans(run);
  const step = chooseStep(steps);
  renderStepOptions(steps, step);
  const work = [];
  if (step === null) renderStepNote("no step with spans yet");
  else if (step !== state.step || state.loaded.step !== state.version) work.push(showStep(step, state.version));
  if (state.loaded.analysis !== state.version) {
    work.push(refresh("analysis", api.analysis, renderAnalysis, showAnalysisError, state.version));
  }
  if (state.loaded.stragglers !== state.version) {
    work.push(refresh("stragglers", api.stragglers, renderStragglers, showStragglersError, state.version));
  }
  await Promise.all(work);
  return EVERY_MS;
}

document.getElementById("step-select").addEventListener("change", (event) => {
  const steps = stepsWithSpans(state.run);
  const chosen = Number(event.target.value);
  state.wanted = chosen === steps[steps.length - 1].step ? null : chosen;
  const url = new URL(location.href);
  if (state.wanted === null) url.searchParams.delete("step");
  else url.searchParams.set("step", String(chosen));
  history.replaceState(null, "", url);
  showStep(chosen, state.version);
});

poll(round, EVERY_MS);
