// How numbers and ranks are written on the pages.

// Nanoseconds as milliseconds with one decimal ("-0.0" for a tiny negative is written "0.0").
export function ms(ns) {
  const text = (ns / 1e6).toFixed(1);
  return text === "-0.0" ? "0.0" : text;
}

// A fraction (0.123) as "12.3%"; "—" when there is none.
export const percent = (fraction) => (fraction === null || fraction === undefined ? "—" : `${(100 * fraction).toFixed(1)}%`);

// Bytes as "1.25 GiB", "310 MiB" or (below a MiB: a profile's trace) "48 KiB"; "—" when unknown.
export function bytes(value) {
  if (value === null || value === undefined) return "—";
  if (value > 0 && value < 2 ** 20) return `${Math.max(1, Math.round(value / 2 ** 10))} KiB`;
  return value >= 2 ** 30 ? `${(value / 2 ** 30).toFixed(2)} GiB` : `${Math.round(value / 2 ** 20)} MiB`;
}

// part as a percentage of whole; "—" when whole is 0.
export const share = (part, whole) => (whole ? percent(part / whole) : "—");

// "rank 3 · stage 3" (or "· stages 3, 7" for interleaved schedules) from the run detail's ranks.
const ranksOf = new WeakMap(); // run answer -> Map rank -> its row: a 16,384-rank table read per label was O(n²)
// stage: the caller's, for a rank the run answer does not list (past its ranks_limit)
export function rankLabel(run, rank, stage = null) {
  if (!ranksOf.has(run)) ranksOf.set(run, new Map(run.ranks.map((r) => [r.rank, r])));
  const info = ranksOf.get(run).get(rank);
  if (info && info.stages && info.stages.length > 1) return `rank ${rank} · stages ${info.stages.join(", ")}`;
  const known = info ? info.stage : stage;
  return known !== null && known !== undefined ? `rank ${rank} · stage ${known}` : `rank ${rank}`;
}

// Text from the service (host, run, span and group names, messages) as a chart label, trace name or
// hover text. Plotly reads a subset of HTML there (<a href>, <span style>, <b>, <br>) and decodes
// entities, so &, <, > and quotes become entities it shows as the characters. Quotes as numbers:
// Plotly knows no &quot;. Markup the page itself writes (the "<br>" between hover lines) goes around it.
const ENTITIES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&#34;", "'": "&#39;" };
export const plotText = (value) => String(value).replace(/[&<>"']/g, (c) => ENTITIES[c]);

// Unicode's direction controls (U+202E and its kin; backend/visible_text.py BIDI_CONTROLS, the same list) shown as
// visible escapes: a job's "report\u202egnp.exe" would read "reportexe.png", and the page's words after it reversed.
const BIDI_CONTROL = /[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;
// What may hold one in an answer's JSON text: the character itself, or its \uXXXX escape.
const BIDI_IN_JSON = /[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]|\\u(?:061c|200[ef]|202[a-e]|206[6-9])/i;

export const visible = (text) => text.replace(BIDI_CONTROL, (c) => `<U+${c.codePointAt(0).toString(16).toUpperCase().padStart(4, "0")}>`);

// Every string of a parsed answer (keys too) made visible.
function visibleDeep(value) {
  if (typeof value === "string") return visible(value);
  if (Array.isArray(value)) return value.map(visibleDeep);
  if (value && typeof value === "object") {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [visible(k), visibleDeep(v)]));
  }
  return value;
}

// An answer's JSON text parsed, its strings made visible: walked only when the text may hold a control (rare).
export const parseVisible = (text) => {
  const data = JSON.parse(text);
  return BIDI_IN_JSON.test(text) ? visibleDeep(data) : data;
};
