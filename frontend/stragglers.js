// The run page's stragglers section: a rank × step heatmap of compute time as a ratio to the
// step's median over all ranks (a slow host or stage is a horizontal band, a one-off a lone
// cell; flagged cells are ringed), and the findings in plain English.
import { el, plot, say } from "./dom.js";
import { ms, plotText } from "./format.js";

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

function renderHeatmap(view) {
  const labels = view.ranks.map((_, i) => rankLabel(view, i));
  const basis = new Map(view.rank_scores.map((s) => [s.rank, s.basis])); // a flagged rank is never scored normal
  const many = labels.length > LABELLED_ROWS;
  // the compact answer (api.js): a cell's time is its ratio × the step's median; flagged cells are listed
  const compute = view.matrices.compute;
  const flagged = new Set(view.flagged_cells.map(([i, j]) => i * view.steps.length + j));
  const hover = compute.ratio_to_step_median.map((row, i) => row.map((ratio, j) => (ratio === null ? "not reported" : [
    labels[i], `step ${view.steps[j]}`,
    `compute ${ms(ratio * compute.step_median_ns[j])} ms = ${ratio.toFixed(2)}× the step median`,
    flagged.has(i * view.steps.length + j) ? `flagged (against ${plotText(basis.get(view.ranks[i]) || "its peers")})` : null,
  ].filter(Boolean).join("<br>"))));
  const flaggedX = view.flagged_cells.map(([, j]) => view.steps[j]);
  const flaggedY = view.flagged_cells.map(([i]) => labels[i]);
  const traces = [
    {
      type: "heatmap", x: view.steps, y: labels, z: compute.ratio_to_step_median, zmin: 0.5, zmax: 1.5,
      colorscale: [[0, "#2f6fde"], [0.5, "#f7f8fa"], [1, "#c0392b"]],
      colorbar: { title: { text: "× step median" }, thickness: 12 },
      text: hover, hoverinfo: "text", xgap: 1, ygap: many ? 0 : 1,
    },
    {
      type: "scatter", mode: "markers", name: "flagged", x: flaggedX, y: flaggedY, hoverinfo: "skip",
      marker: { symbol: "circle-open", size: 11, color: "#1d2330", line: { width: 2 } }, showlegend: false,
    },
  ];
  const layout = {
    margin: { l: 150, r: 20, t: 10, b: 45 },
    height: Math.min(900, Math.max(220, (many ? 1 : 30) * labels.length + 90)),
    xaxis: { title: { text: "step" }, type: "category" },
    // rank 0 on top by reversing the axis, not the categories: a heatmap's hover finds its cell as if
    // the rows ran up the axis in data order, so reordered categories showed another rank's numbers
    yaxis: {
      type: "category", autorange: "reversed", automargin: true, showticklabels: !many,
      title: many ? { text: `${labels.length.toLocaleString()} ranks, rank 0 on top (hover a row)` } : undefined,
    },
  };
  return plot("straggler-heatmap", traces, layout);
}

function renderFindings(view) {
  const range = view.from_step === null ? "no steps yet" : `steps ${view.from_step}–${view.to_step}`;
  const t = view.thresholds;
  document.getElementById("straggler-note").textContent =
    `${range}; a cell is flagged at ≥ ${t.min_ratio}× the median of comparable ranks and robust z ≥ ${t.z_score} (z with ≥ ${t.min_values_for_z} of them)`;
  const items = view.findings.map((f) => el("li", { class: `finding ${f.verdict}` }, f.message));
  if (!items.length) items.push(el("li", { class: "muted" }, view.steps.length ? "No stragglers: every rank is within the thresholds." : "No steps reported yet."));
  document.getElementById("straggler-findings").replaceChildren(...items);
}

export function renderStragglers(view) {
  say("straggler-error", "");
  renderFindings(view);
  const drawn = view.steps.length ? renderHeatmap(view) : undefined;
  document.body.dataset.stragglersSteps = String(view.steps.length);
  return drawn;
}

export const showStragglersError = (error) => say("straggler-error", `Could not load stragglers: ${error.message}`);
