// Where each rank's time went in the step: a stacked bar per rank and the same numbers as a table,
// slowest compute first (the rank the others wait for heads the list), a page of PAGE_ROWS at a time.
import { cell, plot } from "./dom.js";
import { ms, percent, rankLabel, share } from "./format.js";
import { rowHeight } from "./timeline.js";

// Time that is not a span: waiting for a peer's data, and nothing at all.
const WAIT_COLOR = "#e7a3bd";
const IDLE_COLOR = "#d7dbe3";

function row(b) {
  const tr = document.createElement("tr");
  const part = (ns) => `${ms(ns)} (${share(ns, b.window_ns)})`;
  tr.append(
    cell(`rank ${b.rank}`, "text"), cell(b.stage === null ? "—" : b.stage), cell(ms(b.window_ns)),
    cell(part(b.compute_ns), "share"), cell(part(b.transfer_ns), "share"), cell(part(b.dependency_wait_ns), "share"),
    cell(part(b.idle_ns), "share"), cell(ms(b.overlapped_comm_ns)), cell(percent(b.bubble_fraction)),
  );
  return tr;
}

export const PAGE_ROWS = 32;
const view = { page: 0, last: null }; // the page shown, and the last arguments, to turn pages

export function renderBreakdown(detail, run, kinds) {
  view.last = [detail, run, kinds];
  const sorted = [...detail.breakdown].sort((a, b) => b.compute_ns - a.compute_ns || a.rank - b.rank);
  const pages = Math.max(1, Math.ceil(sorted.length / PAGE_ROWS));
  view.page = Math.min(view.page, pages - 1);
  const rows = sorted.slice(view.page * PAGE_ROWS, (view.page + 1) * PAGE_ROWS);
  const pager = document.getElementById("breakdown-pager");
  pager.hidden = pages === 1;
  const listed = detail.breakdown_ranks > sorted.length ? ` (the ${sorted.length.toLocaleString()} slowest listed)` : "";
  document.getElementById("breakdown-page").textContent =
    `ranks ${view.page * PAGE_ROWS + 1}–${view.page * PAGE_ROWS + rows.length} of ${detail.breakdown_ranks.toLocaleString()}${listed}, slowest compute first`;
  document.getElementById("breakdown-prev").disabled = view.page === 0;
  document.getElementById("breakdown-next").disabled = view.page === pages - 1;
  // a run without a pipeline waits for its peers in collectives, and has no bubble: idle plus that wait
  const waitLabel = run.config.schedule ? "dependency wait" : "waiting for peers";
  document.getElementById("breakdown-wait-head").textContent = run.config.schedule ? "Dependency wait" : "Waiting for peers";
  document.getElementById("breakdown-bubble-head").textContent = run.config.schedule ? "Bubble" : "Waiting + idle";
  const labels = rows.map((b) => rankLabel(run, b.rank, b.stage));
  const part = (name, key, color) => ({ type: "bar", orientation: "h", name, y: labels, x: rows.map((b) => b[key] / 1e6), marker: { color } });
  const drawn = plot("breakdown-chart", [
    part("compute", "compute_ns", kinds.category("compute")),
    part("transfer", "transfer_ns", kinds.category("communication")),
    part(waitLabel, "dependency_wait_ns", WAIT_COLOR),
    part("idle", "idle_ns", IDLE_COLOR),
  ], {
    barmode: "stack", margin: { l: 130, r: 20, t: 30, b: 45 }, xaxis: { title: { text: "ms" } },
    yaxis: { autorange: "reversed", automargin: true }, legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom" },
    height: Math.max(240, Math.min(rowHeight(rows.length), 30) * rows.length + 90),
  });
  document.querySelector("#breakdown tbody").replaceChildren(...rows.map(row));
  return drawn;
}

function turn(by) {
  view.page = Math.max(0, view.page + by);
  if (view.last) renderBreakdown(...view.last);
}
document.getElementById("breakdown-prev").addEventListener("click", () => turn(-1));
document.getElementById("breakdown-next").addEventListener("click", () => turn(1));
