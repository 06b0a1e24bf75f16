// The run page's stragglers section: a rank × step heatmap of compute time as a ratio to the rank's
// baseline, the one its flags compare with (its stage peers, all ranks, or its own history: a slow
// host is a horizontal band, a one-off a lone cell, and a stage slow by design stays white: that is
// imbalance, which the analysis reports); flagged cells are ringed; past 1,024 ranks a row folds
// several ranks of a stage (heatmap_rows.js); and the findings in plain English.
import { el, plot, say } from "./dom.js";
import { ms, plotText } from "./format.js";
import { heatmapRows, medianIn, slowestIn } from "./heatmap_rows.js";

// A heatmap row's label, escaped for Plotly (plotText): the same string is the row's category in
// both traces and the first line of its cells' hover text.
function rankLabel(view, i) {
  const parts = [`rank ${view.ranks[i]}`];
  if (view.hosts[i]) parts.push(plotText(view.hosts[i]));
  if (view.stages[i] !== null) parts.push(`stage ${view.stages[i]}`);
  return parts.join(" · ");
}

// Past this many rows, a row is thinner than its label: rows are drawn without labels or gaps.
const LABELLED_ROWS = 64;

// A folded row's label: its stage and the first and last of its ranks.
function foldedLabel(view, members) {
  const stage = view.stages[members[0]];
  const span = `ranks ${view.ranks[members[0]]}–${view.ranks[members[members.length - 1]]}`;
  return stage === null ? span : `stage ${stage} · ${span}`;
}

function renderHeatmap(view, { rows, size }) {
  const labels = rows.map((members) => (members.length === 1 ? rankLabel(view, members[0]) : foldedLabel(view, members)));
  const basis = new Map(view.rank_scores.map((s) => [s.rank, s.basis])); // a flagged rank is never scored normal
  const many = labels.length > LABELLED_ROWS;
  const rowPx = !many ? 30 : size > 1 ? 3 : 1; // a folded row may stand for a slow rank: thick enough to see
  const compute = view.matrices.compute;
  const ratios = view.ratio_to_baseline; // the colour: what the flags compare
  const flagged = new Set(view.flagged_cells.map(([i, j]) => i * view.steps.length + j));
  const isFlagged = (i, j) => flagged.has(i * view.steps.length + j);
  // the compact answer (api.js) carries each cell's ratio to its baseline and each step's median compute
  const cellText = (i, j) => [
    `compute ${ratios[i][j].toFixed(2)}× its baseline${basis.has(view.ranks[i]) ? ` (${plotText(basis.get(view.ranks[i]))})` : ""}`,
    isFlagged(i, j) ? "flagged" : null,
  ];
  const stepMedian = (j) => `the step's median compute: ${ms(compute.step_median_ns[j])} ms`;
  const slowestOf = rows.map((members) => view.steps.map((_, j) => slowestIn(members, ratios, j)));
  const z = slowestOf.map((row) => row.map((slowest, j) => (slowest === null ? null : ratios[slowest][j])));
  const hover = rows.map((members, r) => view.steps.map((_, j) => {
    const slowest = slowestOf[r][j];
    if (slowest === null) return "not reported, or no baseline to score it against";
    const lines = members.length === 1 ? [labels[r], `step ${view.steps[j]}`, ...cellText(slowest, j), stepMedian(j)] : [
      `${labels[r]} (${members.length} ranks)`, `step ${view.steps[j]}`,
      `slowest: ${rankLabel(view, slowest)}`, ...cellText(slowest, j),
      `median of the ${members.length}: ${medianIn(members, ratios, j).toFixed(2)}×`, stepMedian(j),
    ];
    return lines.filter(Boolean).join("<br>");
  }));
  const rowOf = new Map(rows.flatMap((members, r) => members.map((i) => [i, r])));
  const ringed = new Map(view.flagged_cells.map(([i, j]) => [`${rowOf.get(i)}:${j}`, [rowOf.get(i), j]]));
  const traces = [
    {
      type: "heatmap", x: view.steps, y: labels, z, zmin: 0.5, zmax: 1.5,
      colorscale: [[0, "#2f6fde"], [0.5, "#f7f8fa"], [1, "#c0392b"]],
      colorbar: { title: { text: "× baseline" }, thickness: 12 },
      text: hover, hoverinfo: "text", xgap: 1, ygap: many ? 0 : 1,
    },
    {
      type: "scatter", mode: "markers", name: "flagged", hoverinfo: "skip", showlegend: false,
      x: [...ringed.values()].map(([, j]) => view.steps[j]), y: [...ringed.values()].map(([r]) => labels[r]),
      marker: { symbol: "circle-open", size: 11, color: "#1d2330", line: { width: 2 } },
    },
  ];
  const order = size > 1 ? `in ${labels.length} rows of ${size}, stage 0 on top` : "rank 0 on top";
  const layout = {
    margin: { l: 150, r: 20, t: 10, b: 45 },
    height: Math.min(900, Math.max(220, rowPx * labels.length + 90)),
    xaxis: { title: { text: "step" }, type: "category" },
    // rank 0 on top by reversing the axis, not the categories: a heatmap's hover finds its cell as if
    // the rows ran up the axis in data order, so reordered categories showed another rank's numbers
    yaxis: {
      type: "category", autorange: "reversed", automargin: true, showticklabels: !many, ...(many ? { ticks: "", showgrid: false } : {}),
      title: many ? { text: `${view.ranks.length.toLocaleString()} ranks, ${order} (hover a row)` } : undefined,
    },
  };
  return plot("straggler-heatmap", traces, layout);
}

function renderFindings(view, folded) {
  const range = view.from_step === null ? "no steps yet" : `steps ${view.from_step}–${view.to_step}`;
  const t = view.thresholds;
  document.getElementById("straggler-note").textContent =
    `${range}; a cell is flagged at ≥ ${t.min_ratio}× the median of comparable ranks and robust z ≥ ${t.z_score} (z with ≥ ${t.min_values_for_z} of them)`
    + (folded > 1 ? `; a heat-map row is the slowest of ${folded} ranks of one stage, each cell its slowest rank's` : "");
  const items = view.findings.map((f) => el("li", { class: `finding ${f.verdict}` }, f.message));
  if (!items.length) items.push(el("li", { class: "muted" }, view.steps.length ? "No stragglers: every rank is within the thresholds." : "No steps reported yet."));
  document.getElementById("straggler-findings").replaceChildren(...items);
}

export function renderStragglers(view) {
  say("straggler-error", "");
  const rows = heatmapRows(view);
  renderFindings(view, rows.size);
  const drawn = view.steps.length ? renderHeatmap(view, rows) : undefined;
  document.body.dataset.stragglersSteps = String(view.steps.length);
  return drawn;
}

export const showStragglersError = (error) => say("straggler-error", `Could not load stragglers: ${error.message}`);
