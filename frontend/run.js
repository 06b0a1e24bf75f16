// The run page (/runs/{key}): owns the run key, the picked step and the page's one polling loop.
// Each round asks for the run and its alerts (firing, and the last resolved ones); the step view,
// the analysis and the stragglers are asked for again only when the run changed since they were
// last loaded, or when another step is to be shown. ?view=hung puts the lagging and blocked ranks
// first in the ranks table; a #ranks, #stragglers or #analysis is scrolled to once the page is drawn.
import { renderRanks, renderRunAlerts } from "./alerts.js";
import { api, traceUrl, worthRetrying } from "./api.js";
import { el, plotly, say } from "./dom.js";
import { spanKinds } from "./kinds.js";
import { renderAnalysis, showAnalysisError } from "./analysis.js";
import { loadCauses } from "./causes.js";
import { renderBreakdown } from "./breakdown.js";
import { renderFlightRecorder } from "./flight_recorder.js";
import { isComplete, isWarmup, renderGlance } from "./glance.js";
import { renderBubble, renderRun, renderStepNote, renderStepOptions } from "./overview.js";
import { poll } from "./poll.js";
import { renderProfiles, setUpProfile, showProfileForm } from "./profile.js";
import { renderStragglers, showStragglersError } from "./stragglers.js";
import { renderTimeline } from "./timeline.js";

const EVERY_MS = 3000;
const NOT_KNOWN_EVERY_MS = 5000; // a run not (yet) registered: its job may still be starting
const NAME_MATCHES_LISTED = 20; // runs whose name or key holds an unknown key, listed on its page
// A running run changes with every batch, and its analysis and stragglers cost the service seconds of
// CPU at 1,024 ranks: while it runs each is asked for again only once this many times its last answer's
// time has passed (a 50-ms answer every poll, a 2-s one every 20 s: the page keeps the service ≤ 10%
// busy), and at least every LIVE_REFRESH_MAX_MS.
const LIVE_COST_FACTOR = 10;
const LIVE_REFRESH_MAX_MS = 60000;
const RESOLVED_SHOWN = 5;
const FIRING_AT_MOST = 100;

const key = decodeURIComponent(location.pathname.split("/").filter(Boolean).pop());
const linkedStep = new URLSearchParams(location.search).get("step");
const linkedRanks = new URLSearchParams(location.search).get("ranks");

const state = {
  run: null,
  version: null, // of the run last loaded (runVersion)
  // The step the user picked (also ?step=N, so a step view can be linked); null follows the latest.
  wanted: linkedStep === null ? null : Number(linkedStep),
  ranks: linkedRanks || null, // whose spans the timeline shows ("0-7,341", also ?ranks=); null: the service's choice
  requests: 0, // showStep calls so far: only the latest one may render
  step: null, // the step shown
  loaded: { step: null, analysis: null, stragglers: null, flightRecorder: null, profiles: null }, // the run version each was loaded at
  askedAt: { analysis: 0, stragglers: 0, flightRecorder: 0, profiles: 0 }, // when each was last asked for (Date.now())
  tookMs: { analysis: 0, stragglers: 0, flightRecorder: 0, profiles: 0 }, // how long its last answer took
  stepFinal: false, // the step shown had every rank's report when loaded: it will not change
  alerts: { firing: [], resolved: [] }, // as last loaded
  // The element the URL's hash names, to scroll to once the page is drawn, unless the reader
  // scrolled first; null once done.
  scrollTo: location.hash.length > 1 ? decodeURIComponent(location.hash.slice(1)) : null,
  readerScrolled: false,
};
const hungView = () => new URLSearchParams(location.search).get("view") === "hung";

// What changes whenever the service stores something for the run. updated_at alone is not enough:
// on SQLite it has whole seconds, and a second holds many batches.
const runVersion = (run) => JSON.stringify([run.updated_at, run.step_count, run.steps]);
const stepsWithSpans = (run) => run.steps.filter((s) => s.has_spans);

// The step shown unless one was picked: the service's default (analysis/warmup.py: of the complete steps
// with spans past the warm-up, the newest while the run runs, else the one nearest the median wall time;
// a crashed run's partial last step and a finished run's outlier are not the default).
function chooseStep(steps, run) {
  if (steps.some((s) => s.step === state.wanted)) return state.wanted;
  return run.default_step;
}

// The step as a Perfetto trace (GET /runs/{key}/trace): of the ranks the timeline shows, or of those asked for.
function showExportLink(step) {
  const link = document.getElementById("export-trace");
  link.href = traceUrl(key, step, step, state.ranks);
  link.hidden = false;
}

async function showStep(step, version) {
  const request = ++state.requests;
  try {
    const [detail, kinds] = await Promise.all([api.step(key, step, state.ranks), spanKinds()]);
    if (request !== state.requests) return; // a later pick or round asked for a step meanwhile
    renderBubble(detail, state.run);
    await Promise.all([renderTimeline(detail, state.run, kinds), renderBreakdown(detail, state.run, kinds)]);
    state.step = step;
    state.loaded.step = version;
    showExportLink(step);
    const summary = state.run.steps.find((s) => s.step === step);
    state.stepFinal = Boolean(summary && isComplete(state.run, summary));
    document.body.dataset.renderedStep = String(step);
  } catch (error) {
    if (request === state.requests) renderStepNote(`could not load step ${step}: ${error.message}`, true);
  }
}

// Loads one section and renders it; marks it loaded at `version` unless asking again may help.
async function refresh(name, load, render, showError, version) {
  try {
    const asked = Date.now();
    const answer = await load(key);
    state.tookMs[name] = Date.now() - asked;
    await render(answer); // a chart's promise: drawn
    state.loaded[name] = version;
  } catch (error) {
    showError(error);
    if (!worthRetrying(error)) state.loaded[name] = version;
  }
}

// No run has this key: it may be a run's name (the key carries torchrun's run id, which nobody types). The
// newest run of exactly that name opens in its place; runs whose name or key holds it are listed; else the page
// waits for a job that is still starting. Returns true when it moved to another run's page.
async function showNotKnown(error) {
  let matches = [];
  try {
    matches = (await api.runs({ name: key, limit: String(NAME_MATCHES_LISTED) })).items;
  } catch {
    // the listing is a convenience: the page still says the run is not known
  }
  const named = matches.filter((run) => run.name === key);
  if (named.length) {
    const newest = named.reduce((a, b) => (b.created_at > a.created_at ? b : a));
    window.location.replace(`/runs/${encodeURIComponent(newest.key)}${window.location.search}${window.location.hash}`);
    return true;
  }
  document.querySelector("main").classList.add("missing");
  document.getElementById("run-title").textContent = key;
  document.getElementById("crumb").textContent = key;
  const note = document.getElementById("run-error");
  note.className = "muted";
  const listed = matches.length
    ? [` Runs whose name or key holds "${key}": `, ...matches.flatMap((run, i) => [
      i ? ", " : "", el("a", { href: `/runs/${encodeURIComponent(run.key)}` }, run.key)]), ". "]
    : [];
  note.replaceChildren(
    `Run "${key}" is not known here (yet): ${error.message}.`,
    ...listed,
    ` A job that is still starting shows up once its first rank registers; this page keeps checking every `
      + `${NOT_KNOWN_EVERY_MS / 1000} s. `,
    el("a", { href: "/" }, "The runs this service knows"),
  );
  note.hidden = false;
  return false;
}

async function loadAlerts() {
  try {
    const [firing, resolved] = await Promise.all([
      api.alerts({ states: ["firing"], run: key, limit: FIRING_AT_MOST }),
      api.alerts({ states: ["resolved"], run: key, limit: RESOLVED_SHOWN }),
    ]);
    state.alerts = { firing: firing.alerts, resolved: resolved.alerts };
    say("alerts-error", "");
  } catch (error) {
    say("alerts-error", `Could not load the run's alerts: ${error.message}`); // the last ones loaded stay
  }
}

function renderAlertsAndRanks() {
  const now = Date.now();
  renderRunAlerts(state.alerts.firing, state.alerts.resolved, RESOLVED_SHOWN, now);
  renderRanks(state.run, state.alerts.firing, hungView(), now);
  document.body.dataset.alertsFiring = String(state.alerts.firing.length);
}

// Scrolls to the element the hash named; `last`: the page is drawn, forget the hash either way.
function scrollToHash(last) {
  const target = state.scrollTo && document.getElementById(state.scrollTo);
  if (target && !state.readerScrolled) target.scrollIntoView({ block: "start" });
  if (last) state.scrollTo = null;
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
      const moved = await showNotKnown(error);
      return moved ? null : NOT_KNOWN_EVERY_MS;
    }
    showRunError(`Could not load run ${key}: ${error.message}`);
    return EVERY_MS;
  }
  document.querySelector("main").classList.remove("missing");
  showRunError("");
  state.run = run;
  state.version = runVersion(run);
  renderRun(run);
  showProfileForm(run);
  renderGlance({ run });
  const alertsShown = loadAlerts().then(() => {
    renderGlance({ firing: state.alerts.firing });
    renderAlertsAndRanks();
    scrollToHash(false); // the sections above may still grow: again once they are drawn
  });
  const steps = stepsWithSpans(run);
  const step = chooseStep(steps, run);
  renderStepOptions(steps, step, run);
  const work = [alertsShown];
  if (step === null) renderStepNote("no step with spans yet");
  else if (step !== state.step || (state.loaded.step !== state.version && !state.stepFinal)) work.push(showStep(step, state.version));
  const due = (name) => {
    if (state.loaded[name] === state.version) return false;
    const wait = Math.min(LIVE_REFRESH_MAX_MS, LIVE_COST_FACTOR * state.tookMs[name]);
    if ((run.state === "running" || run.state === "hung") && Date.now() - state.askedAt[name] < wait) return false;
    state.askedAt[name] = Date.now();
    return true;
  };
  if (due("analysis")) {
    const show = (analysis) => { const drawn = renderAnalysis(analysis); renderGlance({ analysis }); return drawn; };
    const load = (runKey) => Promise.all([api.analysis(runKey), loadCauses()]).then(([analysis]) => analysis);
    work.push(refresh("analysis", load, show, showAnalysisError, state.version));
  }
  if (due("flightRecorder")) { // an uploaded dump bumps the run's revision: news like a batch
    work.push(refresh("flightRecorder", api.flightRecorder, renderFlightRecorder, () => {}, state.version));
  }
  if (due("profiles")) { // so does a profile's uploaded trace
    work.push(refresh("profiles", api.profiles, renderProfiles, () => {}, state.version));
  }
  if (due("stragglers")) {
    const show = (stragglers) => { const drawn = renderStragglers(stragglers); renderGlance({ stragglers }); return drawn; };
    work.push(refresh("stragglers", api.stragglers, show, showStragglersError, state.version));
  }
  await Promise.all(work);
  requestAnimationFrame(() => {
    scrollToHash(true);
    document.body.dataset.drawn = "true"; // every section has had its first answer
  });
  return EVERY_MS;
}

document.getElementById("step-select").addEventListener("change", (event) => {
  const steps = stepsWithSpans(state.run);
  const chosen = Number(event.target.value);
  state.wanted = chosen;
  const url = new URL(location.href);
  if (state.wanted === null) url.searchParams.delete("step");
  else url.searchParams.set("step", String(chosen));
  history.replaceState(null, "", url);
  showStep(chosen, state.version);
});

setUpProfile(key);
document.getElementById("rank-filter").value = state.ranks || "";
document.getElementById("compare-b").value = key;
document.getElementById("rank-form").addEventListener("submit", (event) => {
  event.preventDefault();
  state.ranks = document.getElementById("rank-filter").value.trim() || null;
  const url = new URL(location.href);
  if (state.ranks === null) url.searchParams.delete("ranks");
  else url.searchParams.set("ranks", state.ranks);
  history.replaceState(null, "", url);
  if (state.step !== null) showStep(state.step, state.version);
});

// An alert's evidence on this page (same run) is shown without loading the page again: the URL
// takes the link's view and hash, the ranks table its order, and the page scrolls to the anchor.
document.getElementById("run-alerts").addEventListener("click", (event) => {
  const link = event.target.closest("a[href]");
  if (!link || event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
  const target = new URL(link.href);
  if (target.origin !== location.origin || target.pathname !== location.pathname) return;
  event.preventDefault();
  const url = new URL(location.href);
  url.searchParams.delete("view");
  for (const [name, value] of target.searchParams) url.searchParams.set(name, value);
  url.hash = target.hash;
  history.pushState(null, "", url);
  showView();
});
window.addEventListener("popstate", showView);

function showView() {
  state.scrollTo = location.hash.length > 1 ? decodeURIComponent(location.hash.slice(1)) : null;
  state.readerScrolled = false;
  if (state.run) renderAlertsAndRanks();
  scrollToHash(true);
}

// Once the reader scrolls, the page no longer scrolls for them.
for (const name of ["wheel", "touchstart", "keydown"]) {
  window.addEventListener(name, () => { state.readerScrolled = true; }, { passive: true });
}

poll(round, EVERY_MS); // its first request is out:
plotly(); // the chart library loads meanwhile
