// Where each rank's time went in the step: a stacked bar per rank and the same numbers as a table.
import { cell, PLOT_CONFIG } from "./dom.js";
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

export function renderBreakdown(detail, run, kinds) {
  const rows = detail.breakdown;
  const labels = rows.map((b) => rankLabel(run, b.rank));
  const part = (name, key, color) => ({ type: "bar", orientation: "h", name, y: labels, x: rows.map((b) => b[key] / 1e6), marker: { color } });
  Plotly.react("breakdown-chart", [
    part("compute", "compute_ns", kinds.category("compute")),
    part("transfer", "transfer_ns", kinds.category("communication")),
    part("dependency wait", "dependency_wait_ns", WAIT_COLOR),
    part("idle", "idle_ns", IDLE_COLOR),
  ], {
    barmode: "stack", margin: { l: 130, r: 20, t: 30, b: 45 }, xaxis: { title: { text: "ms" } },
    yaxis: { autorange: "reversed", automargin: true }, legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom" },
    height: Math.max(240, Math.min(rowHeight(rows.length), 30) * rows.length + 90),
  }, PLOT_CONFIG);
  document.querySelector("#breakdown tbody").replaceChildren(...rows.map(row));
}
