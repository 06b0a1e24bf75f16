// The runs list page: every run the service knows, newest activity first, each with its firing
// alerts; refreshed every 5 s. A round asks for the runs and, once for the whole list, for the
// firing alerts.
import { alertsCell } from "./alerts.js";
import { api } from "./api.js";
import { cell, el, say, stateBadge } from "./dom.js";
import { poll } from "./poll.js";

const EVERY_MS = 5000;
const FIRING_AT_MOST = 1000; // GET /alerts' limit

function row(run, alerts) {
  const c = run.config;
  const name = cell("", "text");
  name.append(el("a", { href: `/runs/${encodeURIComponent(run.key)}` }, run.name));
  const state = cell("", "text");
  state.append(stateBadge(run));
  const tr = el("tr", { "data-run": run.key });
  tr.append(
    name, state, alerts, cell(run.key, "text wrap"), cell(run.world_size), cell(c.schedule || "—", "text"),
    cell(c.num_stages ? `${c.num_stages} × ${c.num_microbatches}` : "—"), cell(run.step_count),
    cell(new Date(run.updated_at).toLocaleString(), "text wrap"),
  );
  return tr;
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
    const [runs, firing] = await Promise.all([api.runs(), firingByRun()]);
    const alerts = (run) => (firing ? alertsCell(firing.get(run.key)) : unknownAlerts());
    document.querySelector("#runs tbody").replaceChildren(...runs.map((run) => row(run, alerts(run))));
    document.getElementById("runs-empty").hidden = runs.length > 0;
    say("runs-error", "");
  } catch (error) {
    say("runs-error", `Could not load runs: ${error.message}`);
  }
  return EVERY_MS;
}

poll(round, EVERY_MS);
