// The runs list page: every run the service knows, newest activity first, refreshed every 5 s.
import { api } from "./api.js";
import { cell, el, say, stateBadge } from "./dom.js";
import { poll } from "./poll.js";

const EVERY_MS = 5000;

function row(run) {
  const c = run.config;
  const name = cell("", "text");
  name.append(el("a", { href: `/runs/${encodeURIComponent(run.key)}` }, run.name));
  const state = cell("", "text");
  state.append(stateBadge(run));
  const tr = document.createElement("tr");
  tr.append(
    name, state, cell(run.key, "text wrap"), cell(run.world_size), cell(c.schedule || "—", "text"),
    cell(c.num_stages ? `${c.num_stages} × ${c.num_microbatches}` : "—"), cell(run.step_count),
    cell(new Date(run.updated_at).toLocaleString(), "text wrap"),
  );
  return tr;
}

async function round() {
  try {
    const runs = await api.runs();
    document.querySelector("#runs tbody").replaceChildren(...runs.map(row));
    document.getElementById("runs-empty").hidden = runs.length > 0;
    say("runs-error", "");
  } catch (error) {
    say("runs-error", `Could not load runs: ${error.message}`);
  }
  return EVERY_MS;
}

poll(round, EVERY_MS);
