// A profiler on demand from the run page (POST /runs/{key}/profile): every rank runs torch.profiler over the same
// upcoming steps and writes its trace on its own disk, beside its spool (collector/profiling.py); the ranks asked
// for (the first 8 by default) upload theirs, imported as a run of their own. The form is offered while the run
// runs; the list (GET /runs/{key}/profiles) shows each profile, the traces that arrived, and links to open them as
// a run or download them for Perfetto.

import { api, traceUrl } from "./api.js";
import { el } from "./dom.js";
import { bytes } from "./format.js";

const LISTED = 5; // newest profiles shown; the rest are counted
const MAX_UPLOADS = 8; // the service's limit (backend/capture/schemas.py)

export function showProfileForm(run) {
  document.getElementById("profile-form").hidden = !(run.state === "running" || run.state === "hung");
}

// "0-3,341" as [0, 1, 2, 3, 341]; null when empty; the service refuses more than 8 and ranks outside the run.
function parseRanks(text) {
  if (!text.trim()) return null;
  const ranks = [];
  for (const part of text.split(",").map((p) => p.trim()).filter(Boolean)) {
    const range = /^(\d+)(?:-(\d+))?$/.exec(part);
    if (!range) throw new Error(`"${part}" is not a rank or a range of ranks (e.g. 0-3,341)`);
    const [first, last] = [Number(range[1]), Number(range[2] ?? range[1])];
    if (last < first) throw new Error(`${part}: a range runs from the lower rank to the higher`);
    for (let rank = first; rank <= last && ranks.length <= MAX_UPLOADS; rank += 1) ranks.push(rank);
  }
  if (ranks.length > MAX_UPLOADS) throw new Error(`at most ${MAX_UPLOADS} ranks upload their traces`);
  return ranks;
}

const span = (ranks) => (ranks.length > 2 && ranks[ranks.length - 1] - ranks[0] === ranks.length - 1
  ? `${ranks[0]}–${ranks[ranks.length - 1]}` : ranks.join(", "));

function profileItem(profile) {
  const last = profile.from_step + profile.steps - 1;
  const asked = new Date(profile.asked_at).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  const arrived = profile.traces.length;
  const head = el("strong", {}, `Steps ${profile.from_step}–${last}`);
  const uploading = profile.upload_ranks ?? [];
  const got = `${arrived} of ${uploading.length} trace${uploading.length === 1 ? "" : "s"} uploaded`;
  const parts = [head, ` · asked ${asked} · ${got}`];
  if (arrived) {
    const size = profile.traces.reduce((total, trace) => total + trace.bytes, 0);
    const ranks = profile.traces.map((t) => t.rank);
    parts.push(` (${ranks.length === 1 ? "rank" : "ranks"} ${span(ranks)}, ${bytes(size)})`,
      el("a", { href: `/runs/${encodeURIComponent(profile.run_key)}` }, "open as a run"),
      el("a", { href: traceUrl(profile.run_key, profile.from_step, last), download: `${profile.run_key}.json.gz` }, "Perfetto JSON"));
  } else {
    parts.push(el("span", { class: "muted" }, ` — ranks ${span(uploading)} send theirs once the steps have run`));
  }
  return el("li", { "data-profile": String(profile.id) }, ...parts);
}

export function renderProfiles(answer) {
  const list = document.getElementById("profile-list");
  list.hidden = answer.profiles.length === 0;
  const items = answer.profiles.slice(0, LISTED).map(profileItem);
  if (answer.total > LISTED) items.push(el("li", { class: "muted" }, `${answer.total - LISTED} earlier profiles`));
  list.replaceChildren(...items);
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
      const uploadRanks = parseRanks(document.getElementById("profile-ranks").value);
      const { answer, created } = await api.profile(key, steps, uploadRanks);
      const last = answer.from_step + answer.steps - 1;
      const asked = created ? `Every rank profiles steps ${answer.from_step}–${last}` : `Steps ${answer.from_step}–${last} were already asked for`;
      const uploading = answer.upload_ranks ?? []; // a request stored before the service knew of uploads: none
      const senders = uploading.length === 1 ? `rank ${uploading[0]} uploads its trace`
        : `ranks ${span(uploading)} upload their traces`;
      note.textContent = `${asked}; ${senders} (listed below), every rank keeps its own in profiles/${key}/ beside its spool.`;
      document.body.dataset.profiled = String(answer.from_step);
      renderProfiles(await api.profiles(key));
    } catch (error) {
      note.classList.add("error");
      note.textContent = `No profile: ${error.message}`;
    }
  });
}
