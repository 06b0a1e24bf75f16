// The one client of the service's API: every request under the API prefix goes through here.
// An error answer, {"detail": [{"loc", "msg", "type"}]}, becomes an ApiError with its status and
// the messages; a service that cannot be reached, an ApiError with status 0.

import { parseVisible } from "./format.js";

export const API_PREFIX = "/api/v1"; // bubblescope.wire.API_PREFIX (tests/dashboard/test_span_kinds.py checks)

export class ApiError extends Error {
  constructor(status, message, detail = []) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.detail = detail;
  }
}

async function failure(response) {
  let detail = [];
  try {
    const body = await readJson(response);
    if (Array.isArray(body.detail)) detail = body.detail;
  } catch (_) { /* not JSON: the status line says it */ }
  const message = detail.length ? detail.map((d) => d.msg).join("; ") : `${response.status} ${response.statusText}`;
  return new ApiError(response.status, message, detail);
}

async function get(path) {
  let response;
  try {
    response = await fetch(`${API_PREFIX}${path}`, { headers: { Accept: "application/json" } });
  } catch (error) {
    throw new ApiError(0, `the service did not answer (${error.message})`);
  }
  if (response.status === 401) toSignIn();
  if (!response.ok) throw await failure(response);
  return response;
}

// Every answer's strings are shown as the job wrote them, save direction controls, made visible (format.js).
const readJson = async (response) => parseVisible(await response.text());

const getJson = async (path) => readJson(await get(path));

// A request the page makes (a profile): its JSON answer, and whether it was new (201) or already waiting (200).
async function postJson(path, body) {
  let response;
  try {
    response = await fetch(`${API_PREFIX}${path}`, {
      method: "POST", headers: { Accept: "application/json", "Content-Type": "application/json" }, body: JSON.stringify(body),
    });
  } catch (error) {
    throw new ApiError(0, `the service did not answer (${error.message})`);
  }
  if (response.status === 401) toSignIn();
  if (!response.ok) throw await failure(response);
  return { answer: await readJson(response), created: response.status === 201 };
}

// A page of a listing: its items, and the cursor of the next page (X-Next-Cursor; null: the last).
async function getPage(path) {
  const response = await get(path);
  return { items: await readJson(response), next: response.headers.get("X-Next-Cursor") };
}

// serve --auth (docs/access.md): an API answer of 401 sends the browser to the sign-in page, which
// comes back here (`next`) once POST /session has set the HttpOnly session cookie.
function toSignIn() {
  const next = `${window.location.pathname}${window.location.search}${window.location.hash}`;
  window.location.assign(`/signin?next=${encodeURIComponent(next)}`);
}

async function session(method, body) {
  const init = { method, headers: { Accept: "application/json" } };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(`${API_PREFIX}/session`, init);
  } catch (error) {
    throw new ApiError(0, `the service did not answer (${error.message})`);
  }
  if (!response.ok) throw await failure(response);
  return response.status === 204 ? null : readJson(response);
}

export const signIn = (token) => session("POST", { token });
export const signOut = () => session("DELETE");

const runPath = (key) => `/runs/${encodeURIComponent(key)}`;

// GET /alerts' query: states (firing, resolved; none: both), one run's alerts (its key) or every run's, at most limit.
function alertQuery({ states = [], run = null, limit = null } = {}) {
  const query = new URLSearchParams();
  for (const state of states) query.append("state", state);
  if (run !== null) query.set("run", run);
  if (limit !== null) query.set("limit", String(limit));
  const text = query.toString();
  return text ? `?${text}` : "";
}

export const BREAKDOWN_ROWS = 1024; // backend/warm_views.py stores a quiet run's answers as these queries ask: PAGE_*
export const RANK_ROWS = 1024; // the ranks table's rows: a 16,384-rank run's every rank was 4.5 MB a poll

export const api = {
  // filters: state, name, since (ISO), limit, cursor; the answer's X-Next-Cursor comes back as `next`
  runs: (filters = {}) => getPage(`/runs?${new URLSearchParams(Object.entries(filters).filter(([, v]) => v))}`),
  run: (key) => getJson(`${runPath(key)}?ranks_limit=${RANK_ROWS}`), // failed, blocked, ended, silent ranks first
  // ranks: whose spans ("0-7,341"); null: the service's choice (every rank, or each stage's median and slowest);
  // the breakdown table pages through its BREAKDOWN_ROWS slowest ranks
  step: (key, step, ranks = null) => getJson(`${runPath(key)}/steps/${step}?${new URLSearchParams(
    [...(ranks ? [["ranks", ranks]] : []), ["breakdown_limit", String(BREAKDOWN_ROWS)]])}`),
  analysis: (key) => getJson(`${runPath(key)}/analysis`),
  flightRecorder: (key) => getJson(`${runPath(key)}/flight-recorder`),
  stragglers: (key) => getJson(`${runPath(key)}/stragglers?phases=compute&compact=true`), // the heat-map's one phase, as drawn
  spanKinds: () => getJson("/span-kinds"),
  bubbleCauses: () => getJson("/bubble-causes"),
  alerts: (options) => getJson(`/alerts${alertQuery(options)}`), // newest first
  // torch.profiler over the next `steps` steps; uploadRanks (a list, or null: the service's first 8) send their traces
  profile: (key, steps, uploadRanks = null) => postJson(`${runPath(key)}/profile`, uploadRanks ? { steps, upload_ranks: uploadRanks } : { steps }),
  profiles: (key) => getJson(`${runPath(key)}/profiles`), // newest first, with the traces uploaded
};

// Where a browser downloads steps as a Perfetto trace (GET /runs/{key}/trace): a link, not a fetch.
export const traceUrl = (key, fromStep, toStep, ranks = null) => `${API_PREFIX}${runPath(key)}/trace?${new URLSearchParams(
  [["from_step", String(fromStep)], ["to_step", String(toStep)], ...(ranks ? [["ranks", ranks]] : [])])}`;

// Whether asking again can give another answer for the same data: not for a 4xx (the request or
// the run is what it is), yes when the service was unreachable or failed.
export const worthRetrying = (error) => !(error instanceof ApiError) || error.status === 0 || error.status >= 500;
