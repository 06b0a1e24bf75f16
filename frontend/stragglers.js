// The run page's stragglers section: a rank × step heatmap of compute time as a ratio to the
// step's median over all ranks (a slow host or stage is a horizontal band, a one-off a lone
// cell; flagged cells are ringed), and the findings in plain English.
import { el, plot, say } from "./dom.js";
import { ms, plotText } from "./format.js";

// A heatmap row's label, escaped for Plotly (plotText): the same string is the row's category in
// both traces and the first line of its cells' hover text.
function rankLabel(score) {
  const parts = [`rank ${score.rank}`];
  if (score.host) parts.push(plotText(score.host));
  if (score.stage !== null) parts.push(`stage ${score.stage}`);
  return parts.join(" · ");
}

// Past this many rows, a row is thinner than its label: rows are drawn without labels or gaps.
const LABELLED_ROWS = 64;

function renderHeatmap(view) {
  const labels = view.rank_scores.map(rankLabel);
  const many = labels.length > LABELLED_ROWS;
  const compute = view.matrices.compute;
  const hover = compute.values_ns.map((row, i) => row.map((ns, j) => (ns === null ? "not reported" : [
    labels[i], `step ${view.steps[j]}`,
    `compute ${ms(ns)} ms = ${compute.ratio_to_step_median[i][j].toFixed(2)}× the step median`,
    view.flagged[i][j] ? `flagged (against ${plotText(view.rank_scores[i].basis)})` : null,
  ].filter(Boolean).join("<br>"))));
  const flaggedX = [];
  const flaggedY = [];
  view.flagged.forEach((row, i) => row.forEach((hit, j) => { if (hit) { flaggedX.push(view.steps[j]); flaggedY.push(labels[i]); } }));
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
