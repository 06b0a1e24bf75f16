// The run's PyTorch Flight Recorder dumps (GET /runs/{key}/flight-recorder), under the glance: per process group,
// the first collective not every rank joined and the ranks missing from it (what a hung run is waiting on, in
// the dumps' words), mismatches in op, sizes or dtypes, and each rank's last enqueued, started and completed
// collective, the ranks that went least far first. Hidden while the run has no dump.

import { cell, el } from "./dom.js";

const ROWS = 64; // a 1,024-rank group's table shows the ranks that went least far; the rest are counted

const seq = (value) => (value === null ? "–" : String(value));

function groupTitle(group) {
  return `Process group ${group.group}${group.description ? ` (${group.description})` : ""}, ${group.ranks.length} ranks`;
}

function verdict(group) {
  const front = group.wavefront;
  if (!front) return el("p", {}, "Every rank joined the same collectives.");
  const missing = front.missing.length > 8 ? `${front.missing.slice(0, 8).join(", ")} and ${front.missing.length - 8} more` : front.missing.join(", ");
  return el("p", { class: "fr-front" },
    el("strong", {}, `#${front.seq} ${front.op || "(a collective)"}`),
    ` is the first collective not every rank joined: missing on rank${front.missing.length === 1 ? "" : "s"} ${missing}`,
    ` (joined by ${front.joined.length} of ${front.joined.length + front.missing.length}).`);
}

function progressTable(group) {
  const rows = [...group.progress].sort((a, b) => (a.last_enqueued ?? -1) - (b.last_enqueued ?? -1) || a.rank - b.rank);
  const body = el("tbody");
  for (const p of rows.slice(0, ROWS)) {
    const tr = el("tr");
    tr.append(cell(String(p.rank), "text"), cell(seq(p.last_enqueued)), cell(seq(p.last_started)), cell(seq(p.last_completed)), cell(p.blocked_in || "", "text"));
    body.append(tr);
  }
  const head = el("thead", {}, el("tr", {}, el("th", { class: "text" }, "Rank"), el("th", {}, "Last enqueued"),
    el("th", {}, "Started"), el("th", {}, "Completed"), el("th", { class: "text" }, "Blocked in")));
  const more = rows.length > ROWS ? [el("p", { class: "muted" }, `${rows.length - ROWS} more ranks not shown`)] : [];
  return [el("div", { class: "scroll" }, el("table", { class: "fr-progress" }, head, body)), ...more];
}

export function renderFlightRecorder(report) {
  const card = document.getElementById("flight-recorder");
  card.hidden = report.dumps.length === 0;
  if (card.hidden) return;
  const files = report.dumps.length === 1 ? "1 dump" : `${report.dumps.length} dumps`;
  const parts = [el("h2", {}, "Flight Recorder ", el("span", { class: "muted" }, `(${files}, torch's record of each rank's collectives)`))];
  for (const group of report.groups) {
    parts.push(el("h3", {}, groupTitle(group)), verdict(group));
    if (group.without_dump.length) parts.push(el("p", { class: "muted" }, `No dump from ranks ${group.without_dump.join(", ")}.`));
    for (const m of group.mismatches) {
      const values = Object.entries(m.values).map(([rank, value]) => `rank ${rank}: ${value}`).join("; ");
      parts.push(el("p", { class: "error" }, `#${m.seq}: the ranks disagree on ${m.what}: ${values}`));
    }
    parts.push(...progressTable(group));
  }
  card.replaceChildren(...parts);
}
