// The alerts the service's rules raised (GET /alerts), where the pages show them: the run page's
// banner of firing alerts and its collapsed list of resolved ones, the run list's alert column, and
// the run page's ranks table: what each rank last did, what it is blocked in while its step runs
// long (the collector's in_flight report), the ranks the alerts name highlighted, and with
// ?view=hung the lagging and blocked ranks first. Every text from the service goes in as text.
import { cell, el } from "./dom.js";

const SEVERITIES = ["critical", "warning", "info"];
const severityIndex = (alert) => {
  const index = SEVERITIES.indexOf(alert.labels.severity);
  return index < 0 ? SEVERITIES.length : index;
};
// The severity as a class name: only the known ones (anything else is shown as info).
const severityOf = (alert) => SEVERITIES[Math.min(severityIndex(alert), SEVERITIES.length - 1)];

// Worst first; newest first within a severity (the API lists newest first and sort is stable).
export const byUrgency = (alerts) => [...alerts].sort((a, b) => severityIndex(a) - severityIndex(b));

// Seconds as "42 s", "12 min", "3.5 h", "2 d" (the alert texts write them the same way).
export function duration(seconds) {
  const s = Math.max(0, seconds);
  if (s < 120) return `${Math.round(s)} s`;
  if (s < 7200) return `${Math.round(s / 60)} min`;
  if (s < 172800) return `${(s / 3600).toFixed(1)} h`;
  return `${Math.round(s / 86400)} d`;
}

const secondsSince = (iso, now) => Math.max(0, (now - Date.parse(iso)) / 1000);
// An ISO time as "12 s ago" ("just now" within 2 s, or a little ahead of this browser's clock).
export const ago = (iso, now) => (secondsSince(iso, now) < 2 ? "just now" : `${duration(secondsSince(iso, now))} ago`);
const localTime = (iso) => new Date(iso).toLocaleString();

const runHref = (key) => `/runs/${encodeURIComponent(key)}`;

// Where an alert's evidence is on this service: the run's page with its generatorURL's query and
// hash. The URL's own host is the service as --external-url names it, which need not be how this
// browser reached it; a URL that is not http(s) leaves only the run page.
export function evidenceHref(alert) {
  try {
    const url = new URL(alert.generatorURL);
    if (url.protocol === "http:" || url.protocol === "https:") return `${runHref(alert.run)}${url.search}${url.hash}`;
  } catch (_) { /* not a URL: the run page */ }
  return runHref(alert.run);
}

// What the evidence link shows, by the anchor it goes to.
const EVIDENCE_WORDS = { ranks: "the ranks", stragglers: "the straggler heat map", analysis: "the bubble analysis" };
function evidenceWords(alert) {
  const url = new URL(evidenceHref(alert), location.origin);
  const where = EVIDENCE_WORDS[url.hash.slice(1)];
  if (url.searchParams.get("view") === "hung") return "See what each rank waits for";
  return where ? `See ${where}` : "Open the run";
}

const severityChip = (alert) => el("span", { class: `sev sev-${severityOf(alert)}` }, severityOf(alert));
const timeNode = (iso, now, prefix = "") =>
  el("time", { datetime: iso, title: localTime(iso), "data-ago": iso, "data-prefix": prefix }, `${prefix}${ago(iso, now)}`);

function firingItem(alert, now) {
  const a = alert.annotations;
  const li = el("li", { class: `alert sev-${severityOf(alert)}`, "data-alertname": alert.labels.alertname || "" });
  li.append(el("div", { class: "alert-head" },
    severityChip(alert), " ", el("span", { class: "summary" }, a.summary || alert.labels.alertname || "alert"), " ",
    el("span", { class: "since muted" }, "started ", timeNode(alert.startsAt, now)), " ",
    el("a", { class: "evidence", href: evidenceHref(alert) }, `${evidenceWords(alert)} →`)));
  if (a.description) li.append(el("div", { class: "description" }, a.description));
  if (a.action) li.append(el("div", { class: "action" }, el("span", { class: "label" }, "What to do: "), a.action));
  return li;
}

function resolvedItem(alert, now) {
  const lasted = (Date.parse(alert.endsAt) - Date.parse(alert.startsAt)) / 1000;
  return el("li", { class: "resolved-alert" },
    severityChip(alert), " ", el("a", { href: evidenceHref(alert) }, alert.annotations.summary || alert.labels.alertname || "alert"),
    " ", el("span", { class: "muted" }, timeNode(alert.endsAt, now, "resolved "), ` after ${duration(lasted)}`));
}

let alertsShown = null; // what the banner and the resolved list were built from

// The run page's banner (firing, worst first) and resolved list; rebuilt only when the alerts
// changed (a link under the pointer stays put), their times brought up to date every round.
// `resolved` holds the newest `atMost` resolved alerts.
export function renderRunAlerts(firing, resolved, atMost, now) {
  const text = JSON.stringify([firing, resolved]);
  if (text !== alertsShown) {
    alertsShown = text;
    const banner = document.getElementById("alert-banner");
    banner.replaceChildren(...byUrgency(firing).map((alert) => firingItem(alert, now)));
    banner.hidden = firing.length === 0;
    const past = document.getElementById("alerts-resolved");
    past.querySelector("summary").textContent = `Resolved alerts (${resolved.length < atMost ? resolved.length : `the latest ${atMost}`})`;
    past.querySelector("ul").replaceChildren(...resolved.map((alert) => resolvedItem(alert, now)));
    past.hidden = resolved.length === 0;
  }
  for (const node of document.querySelectorAll("#run-alerts time[data-ago]")) {
    node.textContent = `${node.dataset.prefix}${ago(node.dataset.ago, now)}`;
  }
}

// The run list's cell: how many alerts fire, coloured by the worst, and the worst one's summary
// linking to its evidence; "—" for a run with none.
export function alertsCell(alerts) {
  const td = cell("", "text alerts");
  if (!alerts || !alerts.length) {
    td.append(el("span", { class: "muted" }, "—"));
    return td;
  }
  const sorted = byUrgency(alerts);
  const worst = sorted[0];
  const names = sorted.map((a) => `${severityOf(a)}: ${a.annotations.summary || a.labels.alertname}`).join("\n");
  td.append(
    el("span", { class: `alert-count sev-${severityOf(worst)}`, title: names }, String(alerts.length)), " ",
    el("a", { class: "alert-link", href: evidenceHref(worst), title: worst.annotations.summary || "" },
      worst.annotations.summary || worst.labels.alertname || "alert"),
  );
  if (alerts.length > 1) td.append(" ", el("span", { class: "muted" }, `+${alerts.length - 1} more`));
  return td;
}

// ---- the ranks table

const HUNG = "BubblescopeRunHung";
const FLAG_WORDS = { BubblescopeRunFailed: "failed first", BubblescopeRunSilent: "quiet first", BubblescopeStraggler: "straggler" };
const blockedOp = (r) => (r.in_flight && r.in_flight.op ? r.in_flight.op : null);
const live = (r) => r.outcome === null || r.outcome === undefined;

// The ranks a firing hung alert names: its labels.rank; when it blames several (no rank label), as
// its rule does (analysis/alert_rules.py hung_lagging): the ranks in their own code (in_flight
// without an op) and the peers blocked ranks wait on that are not blocked themselves. (The rule
// also blames ranks gone quiet, which the page cannot tell without the service's --silent-after.)
// With every rank blocked, the ranks furthest behind.
export function laggingRanks(run, firing) {
  const hung = firing.filter((a) => a.labels.alertname === HUNG);
  if (!hung.length) return new Set();
  const named = hung.filter((a) => a.labels.rank !== undefined).map((a) => Number(a.labels.rank));
  if (named.length) return new Set(named);
  const open = run.ranks.filter(live);
  const blocked = new Set(open.filter(blockedOp).map((r) => r.rank));
  const free = open.filter((r) => r.in_flight && !r.in_flight.op).map((r) => r.rank);
  const known = new Set(open.map((r) => r.rank));
  const waitedOn = open.filter(blockedOp).map((r) => blockedOp(r).peer).filter((peer) => known.has(peer) && !blocked.has(peer));
  if (free.length || waitedOn.length) return new Set([...free, ...waitedOn]);
  const behind = Math.min(...open.map((r) => r.last_step ?? -1)); // every rank blocked: the ones furthest behind
  return new Set(open.filter((r) => (r.last_step ?? -1) === behind).map((r) => r.rank));
}

// Each rank a firing alert names, with a word for why (a hung run's lagging ranks: "lagging").
function flags(run, firing) {
  const found = new Map([...laggingRanks(run, firing)].map((rank) => [rank, "lagging"]));
  for (const alert of firing) {
    if (alert.labels.alertname === HUNG || alert.labels.rank === undefined) continue;
    const rank = Number(alert.labels.rank);
    if (!found.has(rank)) found.set(rank, FLAG_WORDS[alert.labels.alertname] || "named by an alert");
  }
  return found;
}

const peerWord = (kind) => (/recv/i.test(kind) ? "from" : /send/i.test(kind) ? "to" : "with");

// What a rank's in_flight report says it is doing, its durations brought to now: the report's are
// as of last_heard_at. "recv 'bwd' from rank 1 on pp for 42 s (in step 5)", "in step 5 outside any
// collective for 41 s".
export function inFlightText(report, sinceHeardS) {
  const where = report.in_step === false ? `after step ${report.step - 1}` : `in step ${report.step}`;
  const op = report.op;
  if (!op) return `${where} outside any collective for ${duration(report.elapsed_s + sinceHeardS)}`;
  const name = op.name ? ` '${op.name}'` : "";
  const peer = op.peer === null || op.peer === undefined ? "" : ` ${peerWord(op.kind)} rank ${op.peer}`;
  const group = op.group ? ` on ${op.group}` : "";
  return `${op.kind}${name}${peer}${group} for ${duration(op.elapsed_s + sinceHeardS)} (${where})`;
}

function doing(r, now) {
  if (r.outcome === "failed") return r.error ? `failed: ${r.error}` : "failed";
  if (r.outcome) return r.outcome;
  if (r.in_flight) return inFlightText(r.in_flight, r.last_heard_at ? secondsSince(r.last_heard_at, now) : 0);
  return r.last_heard_at ? "—" : "registered; nothing heard yet";
}

const stageText = (r) => (r.stages && r.stages.length > 1 ? r.stages.join(", ") : r.stage === null ? "—" : String(r.stage));

// Hung view order: lagging, then blocked in an op, then other in-flight reports, then the rest.
const urgency = (r, flagged) => (flagged.get(r.rank) === "lagging" ? 0 : blockedOp(r) ? 1 : r.in_flight ? 2 : flagged.has(r.rank) ? 3 : 4);

const COLUMNS = 7; // rank, host, pid, stage, last step, last heard, doing
const rows = new Map(); // rank → { tr, cells, texts, flag }: rows are updated in place, never rebuilt
let shownOrder = "";

function newRow(rank) {
  const cells = Array.from({ length: COLUMNS }, (_, i) => cell("", i === 1 || i >= 5 ? "text" : ""));
  cells[0].className = "text";
  cells[6].classList.add("doing");
  const tr = el("tr", { "data-rank": String(rank) });
  tr.append(...cells);
  return { tr, cells, texts: new Array(COLUMNS).fill(null), flag: null, cls: null, heard: null };
}

function updateRow(row, r, flag, now) {
  const texts = [
    `rank ${r.rank}`, r.host, String(r.pid), stageText(r), r.last_step === null || r.last_step === undefined ? "—" : String(r.last_step),
    r.last_heard_at ? ago(r.last_heard_at, now) : "never", doing(r, now),
  ];
  texts.forEach((text, i) => {
    if (i > 0 && row.texts[i] !== text) row.cells[i].textContent = text;
  });
  if (row.texts[0] !== texts[0] || row.flag !== flag) {
    row.cells[0].replaceChildren(texts[0], ...(flag ? [" ", el("span", { class: "flag" }, flag)] : []));
    row.flag = flag;
  }
  row.texts = texts;
  const cls = [flag === "lagging" ? "lagging" : flag ? "named" : "", blockedOp(r) ? "blocked" : "", r.outcome === "failed" ? "failed" : ""]
    .filter(Boolean).join(" ");
  if (row.cls !== cls) { row.tr.className = cls; row.cls = cls; }
  if (row.heard !== r.last_heard_at) {
    row.cells[5].title = r.last_heard_at ? localTime(r.last_heard_at) : "";
    row.heard = r.last_heard_at;
  }
}

// The run page's ranks table. With hungView, the ranks the hung alert names first, then those
// blocked waiting; otherwise by rank. 1,024 ranks are 1,024 light rows in a card that scrolls:
// each round changes only the cells whose text changed, and moves rows only when the order did.
export function renderRanks(run, firing, hungView, now) {
  const flagged = flags(run, firing);
  const ranks = [...run.ranks].sort((a, b) => (hungView ? urgency(a, flagged) - urgency(b, flagged) : 0) || a.rank - b.rank);
  const present = new Set();
  for (const r of ranks) {
    present.add(r.rank);
    if (!rows.has(r.rank)) rows.set(r.rank, newRow(r.rank));
    updateRow(rows.get(r.rank), r, flagged.get(r.rank) || null, now);
  }
  for (const rank of [...rows.keys()]) if (!present.has(rank)) rows.delete(rank);
  const order = ranks.map((r) => r.rank).join(",");
  if (order !== shownOrder) {
    document.querySelector("#ranks-table tbody").replaceChildren(...ranks.map((r) => rows.get(r.rank).tr));
    shownOrder = order;
  }
  const lagging = [...flagged.values()].filter((f) => f === "lagging").length;
  const blocked = run.ranks.filter((r) => live(r) && blockedOp(r)).length;
  const parts = [`${run.rank_count.toLocaleString()} registered`];
  if (run.ranks.length < run.rank_count) parts.push(`${run.ranks.length.toLocaleString()} listed: failed, blocked, ended and silent first`);
  if (lagging) parts.push(`${lagging} lagging`);
  if (blocked) parts.push(`${blocked} blocked in an op`);
  if (hungView) parts.push("lagging and blocked ranks first");
  document.getElementById("ranks-note").textContent = `(${parts.join(" · ")})`;
  document.body.dataset.ranksShown = String(ranks.length);
}
