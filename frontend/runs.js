"use strict";
async function loadRuns() {
  const body = document.querySelector("#runs tbody");
  const error = document.getElementById("runs-error");
  try {
    const runs = await bs.getJson("/api/v1/runs");
    error.hidden = true;
    body.replaceChildren(...runs.map((run) => {
      const row = document.createElement("tr");
      const link = bs.el("a", { href: `/runs/${encodeURIComponent(run.key)}` }, run.name);
      const name = document.createElement("td"); name.className = "text"; name.append(link);
      const c = run.config;
      const state = bs.cell("", "text"); state.append(bs.stateBadge(run));
      row.append(name, state, bs.cell(run.key, "text"), bs.cell(run.world_size), bs.cell(c.schedule || "—", "text"),
        bs.cell(c.num_stages ? `${c.num_stages} × ${c.num_microbatches}` : "—"), bs.cell(run.step_count),
        bs.cell(new Date(run.updated_at).toLocaleString(), "text"));
      return row;
    }));
    document.getElementById("runs-empty").hidden = runs.length > 0;
  } catch (e) {
    error.textContent = `Could not load runs: ${e.message}`;
    error.hidden = false;
  }
}
bs.poll(loadRuns, 5000);
