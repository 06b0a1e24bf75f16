// The step's aligned timeline: one row per rank the service sent spans of (every rank of a small run;
// of a big one each stage's median and slowest rank, or the ranks asked for), one bar per span,
// coloured by kind.
import { plot } from "./dom.js";
import { ms, plotText, rankLabel } from "./format.js";

// Past this many bars, a bar is a few pixels wide and its micro-batch number would not fit in it:
// bars are drawn without it (the hover still names the micro-batch).
const LABELLED_BARS = 400;

// Row height in px: roomy for a few ranks, compact for many.
export const rowHeight = (rows) => (rows <= 8 ? 60 : rows <= 16 ? 36 : 22);

function hover(span, category) {
  return [
    `${plotText(span.kind)} (${plotText(category)})${span.microbatch === null ? "" : ` · micro-batch ${span.microbatch}`}`,
    span.name ? plotText(span.name) : null,
    span.group ? `group ${plotText(span.group)}` : null,
    span.stage === null ? null : `stage ${span.stage}`,
    span.peer === null ? null : `peer rank ${span.peer}`,
    span.bytes === null ? null : `${span.bytes} bytes`,
    `${ms(span.start_ns)} → ${ms(span.end_ns)} ms (${((span.end_ns - span.start_ns) / 1e6).toFixed(2)} ms)`,
  ].filter(Boolean).join("<br>");
}

export function renderTimeline(detail, run, kinds) {
  const shown = detail.timeline_ranks;
  const ranks = shown.map((r) => r.rank);
  const roleOf = (r) => (r.role === "every rank" || r.role === "asked" ? "" : ` · ${r.role}`);
  const labels = new Map(shown.map((r) => [r.rank, rankLabel(run, r.rank, r.stage) + roleOf(r)]));
  // A block's span lies inside its model's or stage's (same kind, same colour) and would hide its micro-batch
  // number: the run page's per-block table prices the blocks instead.
  const drawn = detail.spans.filter((span) => !kinds.isBlock(span));
  const byKind = new Map();
  for (const span of drawn) {
    if (!byKind.has(span.kind)) byKind.set(span.kind, []);
    byKind.get(span.kind).push(span);
  }
  const labelled = drawn.length <= LABELLED_BARS;
  const order = (kind) => (kinds.order.includes(kind) ? kinds.order.indexOf(kind) : kinds.order.length);
  const traces = [...byKind.entries()].sort(([a], [b]) => order(a) - order(b)).map(([kind, spans]) => {
    const { category, color } = kinds.kind(kind);
    return {
      type: "bar", orientation: "h", name: plotText(kind), marker: { color },
      y: spans.map((s) => labels.get(s.rank) || rankLabel(run, s.rank)),
      base: spans.map((s) => s.start_ns / 1e6),
      x: spans.map((s) => Math.max((s.end_ns - s.start_ns) / 1e6, 0.01)),
      // plotly measures every bar's text, shown or not: 1,440 labels took 0.6 s of a 1-s drawing
      ...(labelled ? { text: spans.map((s) => (s.microbatch === null ? "" : String(s.microbatch))) } : {}),
      textposition: "inside", insidetextanchor: "middle",
      hovertext: spans.map((s) => hover(s, category)), hoverinfo: "text",
    };
  });
  const layout = {
    barmode: "overlay", bargap: 0.25, margin: { l: 130, r: 20, t: 30, b: 45 },
    xaxis: { title: { text: "ms since step start" }, zeroline: false },
    yaxis: { categoryorder: "array", categoryarray: ranks.map((rank) => labels.get(rank)).reverse(), automargin: true },
    legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom" },
    uniformtext: { mode: "hide", minsize: 10 }, // a micro-batch number too big for its bar is left out
    height: Math.max(240, rowHeight(ranks.length) * ranks.length + 110),
  };
  const plotted = plot("timeline", traces, layout);
  const folded = shown.find((r) => r.role.startsWith("median of"));
  const blocks = detail.spans.length - drawn.length;
  document.getElementById("timeline-note").textContent = [
    folded ? `${run.world_size.toLocaleString()} ranks: each stage's median and slowest rank (by compute) shown; ask for any ranks above` : "",
    blocks ? `${blocks.toLocaleString()} layer spans inside these bars are priced in the per-block table` : "",
  ].filter(Boolean).join(" · ");
  return plotted;
}
