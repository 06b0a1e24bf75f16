// The one client of the service's API: every request under the API prefix goes through here.
// An error answer, {"detail": [{"loc", "msg", "type"}]}, becomes an ApiError with its status and
// the messages; a service that cannot be reached, an ApiError with status 0.

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
    const body = await response.json();
    if (Array.isArray(body.detail)) detail = body.detail;
  } catch (_) { /* not JSON: the status line says it */ }
  const message = detail.length ? detail.map((d) => d.msg).join("; ") : `${response.status} ${response.statusText}`;
  return new ApiError(response.status, message, detail);
}

async function getJson(path) {
  let response;
  try {
    response = await fetch(`${API_PREFIX}${path}`, { headers: { Accept: "application/json" } });
  } catch (error) {
    throw new ApiError(0, `the service did not answer (${error.message})`);
  }
  if (!response.ok) throw await failure(response);
  return response.json();
}

const runPath = (key) => `/runs/${encodeURIComponent(key)}`;

export const api = {
  runs: () => getJson("/runs"),
  run: (key) => getJson(runPath(key)),
  step: (key, step) => getJson(`${runPath(key)}/steps/${step}`),
  analysis: (key) => getJson(`${runPath(key)}/analysis`),
  stragglers: (key) => getJson(`${runPath(key)}/stragglers`),
  spanKinds: () => getJson("/span-kinds"),
};

// Whether asking again can give another answer for the same data: not for a 4xx (the request or
// the run is what it is), yes when the service was unreachable or failed.
export const worthRetrying = (error) => !(error instanceof ApiError) || error.status === 0 || error.status >= 500;
