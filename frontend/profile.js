// A profiler on demand from the run page (POST /runs/{key}/profile): every rank runs torch.profiler over the same
// upcoming steps and writes its trace on its own disk, beside its spool (collector/profiling.py). Offered while the
// run runs; the note says which steps and where their traces go.

import { api } from "./api.js";

export function showProfileForm(run) {
  document.getElementById("profile-form").hidden = !(run.state === "running" || run.state === "hung");
}

function where(key, first, last) {
  return `each rank writes profiles/${key}/rank<R>-steps${first}-${last}.json.gz beside its spool `
    + "(~/.cache/bubblescope/profiles by default); read them with bubblescope import-trace";
}

export function setUpProfile(key) {
  const form = document.getElementById("profile-form");
  const note = document.getElementById("profile-note");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const steps = Number(document.getElementById("profile-steps").value);
    note.classList.remove("error");
    note.textContent = "asking…";
    try {
      const { answer, created } = await api.profile(key, steps);
      const last = answer.from_step + answer.steps - 1;
      const asked = created ? `Every rank profiles steps ${answer.from_step}–${last}` : `Steps ${answer.from_step}–${last} were already asked for`;
      note.textContent = `${asked}: ${where(key, answer.from_step, last)}.`;
      document.body.dataset.profiled = String(answer.from_step);
    } catch (error) {
      note.classList.add("error");
      note.textContent = `No profile: ${error.message}`;
    }
  });
}
