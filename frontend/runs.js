// The runs list page: the runs the service knows, newest activity first, PAGE_SIZE at a time, filtered
// by state, name or key, and how recently they were heard from (the filters and the page are in the
// URL, so a view can be linked), each with its firing alerts; refreshed every 5 s. A round asks for
// the page of runs and, once for the whole list, for the firing alerts.
import { alertsCell } from "./alerts.js";
import { api } from "./api.js";
import { cell, comparedLink, el, say, stateBadge } from "./dom.js";
import { poll } from "./poll.js";

const EVERY_MS = 5000;
const PAGE_SIZE = 50;
const form = document.getElementById("run-filters");
const view = { cursors: [null], next: null }; // cursors of the pages seen, the one shown last
const picked = new Map(); // run key -> created_at, at most two: the runs to compare (kept across refreshes and pages)

function filters() {
  const asked = new URLSearchParams(location.search);
  const within = Number(asked.get("within") || 0);
  return {
    state: asked.get("state") || "",
    name: asked.get("name") || "",
    since: within ? new Date(Date.now() - within * 1000).toISOString() : "",
    limit: String(PAGE_SIZE),
    cursor: view.cursors[view.cursors.length - 1] || "",
  };
}
const FIRING_AT_MOST = 1000; // GET /alerts' limit

function row(run, alerts) {
  const c = run.config;
  const name = cell("", "text");
  name.append(el("a", { href: `/runs/${encodeURIComponent(run.key)}` }, run.name));
  if (typeof c.title === "string") name.append(el("div", { class: "run-title muted" }, c.title));
  if (typeof c.compare_with === "string") name.append(comparedLink(c.compare_with, run.key));
  const state = cell("", "text");
  state.append(stateBadge(run));
  const pick = cell("", "text");
  const box = el("input", { type: "checkbox", "aria-label": `pick ${run.key} to compare` });
  box.checked = picked.has(run.key);
  box.addEventListener("change", () => pickRun(run, box.checked));
  pick.append(box);
  const tr = el("tr", { "data-run": run.key });
  tr.append(
    pick, name, state, alerts, el("td", { class: "text key", title: run.key }, run.key), cell(run.world_size), cell(c.schedule || "—", "text"),
    cell(c.num_stages ? `${c.num_stages} × ${c.num_microbatches}` : "—"), cell(run.step_count),
    cell(new Date(run.updated_at).toLocaleString(), "text when"),
  );
  return tr;
}

// Keeps the two newest picks; the link compares the earlier-created run (before) with the later one (after).
function pickRun(run, on) {
  if (on) picked.set(run.key, run.created_at);
  else picked.delete(run.key);
  while (picked.size > 2) picked.delete(picked.keys().next().value);
  for (const box of document.querySelectorAll("#runs tbody input[type=checkbox]")) {
    box.checked = picked.has(box.closest("tr").dataset.run);
  }
  showCompareLink();
}

function showCompareLink() {
  const link = document.getElementById("compare-link");
  link.hidden = picked.size !== 2;
  if (picked.size !== 2) return;
  const [a, b] = [...picked.entries()].sort((x, y) => (x[1] < y[1] ? -1 : 1)).map(([key]) => key);
  link.href = `/compare?${new URLSearchParams({ a, b })}`;
}

// The firing alerts by run key (newest first, as listed); null when they could not be loaded.
async function firingByRun() {
  try {
    const { alerts } = await api.alerts({ states: ["firing"], limit: FIRING_AT_MOST });
    say("alerts-error", "");
    const byRun = new Map();
    for (const alert of alerts) {
      if (!byRun.has(alert.run)) byRun.set(alert.run, []);
      byRun.get(alert.run).push(alert);
    }
    return byRun;
  } catch (error) {
    say("alerts-error", `Could not load the alerts: ${error.message}`);
    return null;
  }
}

function unknownAlerts() {
  const td = cell("", "text alerts");
  td.append(el("span", { class: "muted", title: "the alerts could not be loaded" }, "?"));
  return td;
}

async function round() {
  try {
    const [page, firing] = await Promise.all([api.runs(filters()), firingByRun()]);
    const runs = page.items;
    view.next = page.next;
    const first = (view.cursors.length - 1) * PAGE_SIZE;
    document.getElementById("runs-page").textContent = runs.length ? `runs ${first + 1}–${first + runs.length}` : "";
    document.getElementById("runs-older").disabled = !page.next;
    document.getElementById("runs-newest").disabled = view.cursors.length === 1;
    const alerts = (run) => (firing ? alertsCell(firing.get(run.key)) : unknownAlerts());
    document.querySelector("#runs tbody").replaceChildren(...runs.map((run) => row(run, alerts(run))));
    const filtered = [...new URLSearchParams(location.search).values()].some(Boolean);
    document.getElementById("runs-empty").hidden = runs.length > 0 || filtered;
    say("runs-none", runs.length || !filtered ? "" : "No run matches these filters.");
    say("runs-error", "");
  } catch (error) {
    say("runs-error", `Could not load runs: ${error.message}`);
  }
  return EVERY_MS;
}

// The filters live in the URL; a new filter or "Newest" starts again from the first page.
for (const [name, value] of new URLSearchParams(location.search)) if (form.elements[name]) form.elements[name].value = value;
form.addEventListener("submit", (event) => {
  event.preventDefault();
  const url = new URL(location.href);
  url.search = new URLSearchParams([...new FormData(form)].filter(([, v]) => v)).toString();
  history.replaceState(null, "", url);
  view.cursors = [null];
  round();
});
document.getElementById("runs-older").addEventListener("click", () => {
  if (view.next) view.cursors.push(view.next);
  round();
});
document.getElementById("runs-newest").addEventListener("click", () => {
  view.cursors = [null];
  round();
});

poll(round, EVERY_MS);
