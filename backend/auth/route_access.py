"""THE table of what every route of the service needs: one home, so that a route cannot be left open.

Each entry is (method, path template) → a scope, or ``PUBLIC``. ``guard.authorize`` (a dependency of
every API route) looks the called route up here; a route missing from the table needs ``admin``, and
``tests/auth/test_route_table.py`` fails for it, and for a route the dependency cannot guard (a mount,
a plain Starlette route) unless it is public. HEAD is looked up as GET.

- ``ingest``: what a collector sends: a run's and a rank's registration, a rank's end, ingest batches; and a
  profiler trace imported as a run's rank.
- ``read``: the dashboard and every GET of the API, ``/metrics``, and the operator actions the dashboard
  offers (a capture request, what-if, the planner): they compute or ask for detail, they delete nothing.
- ``admin``: tokens, run deletion, the settings in force (and everything else: ``scopes.grants``).
- public: liveness and readiness, the dashboard's pages and assets, the API docs, signing in and out.
"""

from __future__ import annotations

from typing import Final

from starlette.routing import BaseRoute, Mount

from bubblescope.backend.auth.scopes import PUBLIC, Access, Scope
from bubblescope.wire import API_PREFIX as API

ANY_METHOD: Final = "*"
"""The method of a mount (static files): every method it answers."""

RouteKey = tuple[str, str]

ROUTE_ACCESS: Final[dict[RouteKey, Access]] = {
    # liveness and readiness: for load balancers, no token
    ("GET", f"{API}/health"): PUBLIC,
    ("GET", f"{API}/ready"): PUBLIC,
    # collectors
    ("PUT", f"{API}/runs/{{run_key}}"): Scope.INGEST,
    ("PUT", f"{API}/runs/{{run_key}}/ranks/{{rank}}"): Scope.INGEST,
    ("PUT", f"{API}/runs/{{run_key}}/ranks/{{rank}}/end"): Scope.INGEST,
    ("POST", f"{API}/ingest"): Scope.INGEST,
    ("POST", f"{API}/runs/{{run_key}}/traces"): Scope.INGEST,  # a profiler trace, imported as a rank's steps
    ("POST", f"{API}/runs/{{run_key}}/flight-recorder"): Scope.INGEST,  # a rank's Flight Recorder dump
    ("POST", f"{API}/runs/{{run_key}}/profiles/{{profile_id}}"): Scope.INGEST,  # a rank's trace of a profile asked
    # people, dashboards and scrapers
    ("GET", "/metrics"): Scope.READ,
    ("GET", f"{API}/runs"): Scope.READ,
    ("GET", f"{API}/runs/{{run_key}}"): Scope.READ,
    ("GET", f"{API}/runs/{{run_key}}/steps/{{step}}"): Scope.READ,
    ("GET", f"{API}/runs/{{run_key}}/trace"): Scope.READ,
    ("GET", f"{API}/runs/{{run_key}}/flight-recorder"): Scope.READ,
    ("GET", f"{API}/runs/{{run_key}}/profiles"): Scope.READ,
    ("GET", f"{API}/runs/{{run_key}}/analysis"): Scope.READ,
    ("GET", f"{API}/runs/{{run_key}}/stragglers"): Scope.READ,
    ("GET", f"{API}/span-kinds"): Scope.READ,
    ("GET", f"{API}/bubble-causes"): Scope.READ,
    ("GET", f"{API}/alerts"): Scope.READ,
    ("POST", f"{API}/runs/{{run_key}}/capture"): Scope.READ,
    ("POST", f"{API}/runs/{{run_key}}/profile"): Scope.READ,
    ("POST", f"{API}/runs/{{run_key}}/whatif"): Scope.READ,
    ("POST", f"{API}/plan"): Scope.READ,
    # administration
    ("DELETE", f"{API}/runs/{{run_key}}"): Scope.ADMIN,
    ("GET", f"{API}/tokens"): Scope.ADMIN,
    ("POST", f"{API}/tokens"): Scope.ADMIN,
    ("DELETE", f"{API}/tokens/{{name_or_prefix}}"): Scope.ADMIN,
    ("GET", f"{API}/settings"): Scope.ADMIN,
    # the dashboard's session: signing in checks the token it is given
    ("POST", f"{API}/session"): PUBLIC,
    ("DELETE", f"{API}/session"): PUBLIC,
    # pages and assets (the data behind them is not public), the API's documentation
    ("GET", "/"): PUBLIC,
    ("GET", "/runs"): PUBLIC,  # a browser: the run list; an API client: a 404 naming /api/v1/runs
    ("GET", "/runs/{run_key}"): PUBLIC,
    ("GET", "/compare"): PUBLIC,
    ("GET", "/signin"): PUBLIC,
    ("POST", "/signin"): PUBLIC,  # the form without JavaScript: stores nothing (the token never goes in a URL)
    ("GET", "/vendor/{name}"): PUBLIC,
    ("GET", "/docs"): PUBLIC,
    ("GET", "/openapi.json"): PUBLIC,
    (ANY_METHOD, "/static/{path}"): PUBLIC,
}


def access_of(method: str, path_template: str) -> Access | None:
    """What a call of ``method`` on the route ``path_template`` needs; None: the route is not in the table."""
    method = "GET" if method == "HEAD" else method
    return ROUTE_ACCESS.get((method, path_template))


def route_keys(route: BaseRoute, path_template: str) -> list[RouteKey]:
    """The table's keys of one route: a key per method (HEAD as GET), ``ANY_METHOD`` for a mount."""
    if isinstance(route, Mount):
        return [(ANY_METHOD, path_template)]
    methods = set(getattr(route, "methods", None) or ())
    if "GET" in methods:
        methods.discard("HEAD")
    return [(method, path_template) for method in sorted(methods)]
