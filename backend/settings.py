"""The service's settings: every limit and policy ``bubblescope serve`` can change, in one place.

Each field is one ``serve`` option (``--max-batch-spans``, ``--allowed-host`` ...): its name with
dashes, its default here, its help text in the field's metadata. ``serve_options`` adds them to the
command line, ``from_options`` reads them back, and ``python -m bubblescope.backend.settings`` prints
the table of docs/limits.md, which a test keeps in step with this class. Standard library only: the
command line builds its parser from it on machines with only the collector installed.

The bounds a value must keep to fit its database column (a rank is a 32-bit integer, a time is
nanoseconds below 2^62) are not settings: they are in ``backend.fields``.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bubblescope import wire
from bubblescope.analysis import DEFAULT_THRESHOLDS

if TYPE_CHECKING:  # the command line reads this module; it must not need the server's packages
    from starlette.requests import Request

MiB = 1024 * 1024
SMALL_BODY_BYTES = 1 * MiB
"""Every body but an ingest batch (a registration, a rank's end, a capture or plan request), on the wire
and decompressed; a fixed limit (``body.SMALL_BODY``)."""
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
MAX_SILENT_AFTER_S = 30 * 86400


def _setting(
    default: Any,
    help_text: str,
    *,
    metavar: str | None = None,
    many: bool = False,
    option: str | None = None,
    maximum: float | None = None,
    shown: str | None = None,
    kind: type | None = None,
) -> Any:
    """One setting. ``kind``: its type when the default does not tell (``str`` for an optional
    text, ``bool`` for a flag that is off by default)."""
    metadata = {
        "help": help_text,
        "metavar": metavar,
        "many": many,
        "option": option,
        "maximum": maximum,
        "shown": shown,
        "kind": kind or type(default),
    }
    if many:
        return field(default_factory=lambda: tuple(default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class ServiceSettings:
    """Limits and policies of one service process (see docs/limits.md for what a client gets)."""

    max_body_bytes: int = _setting(
        16 * MiB, "largest ingest body on the wire (gzip or not); 413 beyond", metavar="BYTES"
    )
    max_json_bytes: int = _setting(
        32 * MiB, "largest ingest body once decompressed; 413 beyond, found while decompressing", metavar="BYTES"
    )
    max_json_values: int = _setting(
        1_500_000,
        "most JSON values in an ingest body (commas and opening brackets, counted as it arrives); 413 beyond",
        metavar="N",
    )
    max_bodies_bytes: int = _setting(
        64 * MiB,
        "request bodies (once decompressed) held at once across all requests; more get 503 with Retry-After",
        metavar="BYTES",
    )
    max_trace_bytes: int = _setting(
        1024 * MiB,
        "largest profiler trace one POST /runs/{key}/traces takes (streamed to a temporary file); 413 beyond",
        metavar="BYTES",
    )
    trace_timeout_s: float = _setting(
        600.0,
        "seconds a client has to send a whole profiler trace (POST /runs/{key}/traces); 408 after",
        metavar="SECONDS",
        option="--trace-timeout",
    )
    max_batch_spans: int = _setting(
        100_000, "most spans in one ingest batch (the collector sends up to 20,000); 413 beyond", metavar="N"
    )
    max_batch_steps: int = _setting(
        wire.MAX_BATCH_STEPS,
        "most step aggregates in one ingest batch (the collector flushes at 10,000); 413 beyond",
        metavar="N",
    )
    max_config_bytes: int = _setting(
        64 * 1024, "largest run config, as JSON, after merging a registration into it; 413 beyond", metavar="BYTES"
    )
    max_config_keys: int = _setting(256, "most top-level keys in a run config after merging; 413 beyond", metavar="N")
    body_timeout_s: float = _setting(
        30.0,
        "seconds a client has to send a whole body; 408 after (a stalled upload holds no limit for long)",
        metavar="SECONDS",
        option="--body-timeout",
    )
    header_timeout_s: float = _setting(
        10.0,
        "seconds a client has to send a request's headers; the connection is closed after (a client sending them "
        "a byte at a time holds no connection for long)",
        metavar="SECONDS",
        option="--header-timeout",
    )
    ingest_in_flight: int = _setting(
        4, "ingest requests worked on at once; up to --ingest-queue more wait their turn", metavar="N"
    )
    ingest_queue: int = _setting(
        64, "ingest requests waiting their turn; more get 503 with Retry-After (the collector retries)", metavar="N"
    )
    ingest_batches_per_s: float = _setting(
        64.0,
        "batches a second one run may send in all: its collectors flush at most every world_size / N seconds "
        "(up to 60 s): a 1,024-rank job flushes every 16 s, 64 batches a second, what one process takes with "
        "headroom (docs/scale.md)",
        metavar="N",
    )
    retry_after_s: int = _setting(
        2, "the Retry-After a client gets with a 503 (busy, database unavailable)", metavar="SECONDS"
    )
    captures_per_hour: int = _setting(
        12, "capture requests one run accepts per hour; 429 with Retry-After beyond", metavar="N"
    )
    silent_after_s: float = _setting(
        DEFAULT_THRESHOLDS.silent_after_s,
        "seconds without news after which a run that has not ended is shown as silent",
        metavar="SECONDS",
        option="--silent-after",
        maximum=MAX_SILENT_AFTER_S,
    )
    allowed_hosts: tuple[str, ...] = _setting(
        (),
        "a Host header the service answers (repeat for several; '*' for any, '*.example.org' for a domain). "
        "Default: the loopback names when serving on a loopback address, any otherwise. Others get 400 "
        "(DNS rebinding)",
        metavar="HOST",
        many=True,
        shown="loopback names",
    )
    cors_origins: tuple[str, ...] = _setting(
        (),
        "an origin whose pages may call the API from a browser (repeat for several). Default: none, "
        "so no other site's page can read from or write to the service",
        metavar="ORIGIN",
        many=True,
        shown="none",
    )

    # ---- alert rules (docs/alerts.md); a run overrides any of them with its config's "alerts" key
    alert_interval_s: float = _setting(
        10.0,
        "seconds between the service's own evaluations of the alert rules (they also run after each ingest)",
        metavar="SECONDS",
        option="--alert-interval",
    )
    metrics_interval_s: float = _setting(
        15.0,
        "seconds between refreshes of /metrics' per-run series (computed in the background, served from memory)",
        metavar="SECONDS",
        option="--metrics-interval",
    )
    metrics_max_runs: int = _setting(
        1000,
        "most runs /metrics exports series for: those with a firing alert first, then the most recently heard",
        metavar="N",
    )
    hung_after_s: float = _setting(
        DEFAULT_THRESHOLDS.hung_after_s,
        "a run whose ranks are heard from but finish no step for this long (or 5 median steps, if longer) is hung",
        metavar="SECONDS",
        option="--hung-after",
    )
    regression_percent: float = _setting(
        DEFAULT_THRESHOLDS.regression_percent,
        "step-time regression: the recent median step this much slower than the run's baseline",
        metavar="PCT",
    )
    regression_for_s: float = _setting(
        DEFAULT_THRESHOLDS.regression_for_s,
        "step-time regression: for this long before it fires",
        metavar="SECONDS",
        option="--regression-for",
    )
    bubble_over_floor_points: float = _setting(
        DEFAULT_THRESHOLDS.bubble_over_floor_points,
        "bubble above floor: the measured bubble this many points (of 100) above the schedule's",
        metavar="PTS",
    )
    bubble_for_steps: int = _setting(
        DEFAULT_THRESHOLDS.bubble_for_steps, "bubble above floor: in each of this many recent steps", metavar="N"
    )
    external_url: str | None = _setting(
        None,
        "the service's address as people reach it, for the links in alerts (default: http://HOST:PORT)",
        metavar="URL",
        kind=str,
    )
    # ---- alert delivery (docs/alerting.md)
    alertmanager_urls: tuple[str, ...] = _setting(
        (),
        "an Alertmanager to push alerts to (its base URL; repeat for several)",
        metavar="URL",
        many=True,
        option="--alertmanager-url",
        shown="none",
    )
    webhook_urls: tuple[str, ...] = _setting(
        (),
        "a URL that receives each alert's firing and resolution as signed JSON (repeat for several)",
        metavar="URL",
        many=True,
        option="--webhook-url",
        shown="none",
    )
    webhook_secret_file: str | None = _setting(
        None,
        "a file holding the key that signs webhook bodies (HMAC-SHA256 in X-Bubblescope-Signature)",
        metavar="PATH",
        kind=str,
    )
    alert_resend_s: float = _setting(
        60.0,
        "seconds between re-sends of the firing alerts to Alertmanager (it expects them while they fire)",
        metavar="SECONDS",
        option="--alert-resend",
    )
    # ---- access (docs/access.md)
    auth: bool = _setting(
        False, "require an API token (or a signed-in session) on every endpoint but health", kind=bool
    )
    insecure: bool = _setting(
        False, "serve on a non-loopback address without --auth (anyone who reaches it can write and delete)", kind=bool
    )
    trusted_user_header: str | None = _setting(
        None,
        "with --auth: a reverse proxy's header naming a signed-in user (SSO), who gets read access",
        metavar="HEADER",
        kind=str,
    )
    trusted_proxies: tuple[str, ...] = _setting(
        (),
        "with --trusted-user-header: the address (or network, 10.0.0.0/8) of a proxy that sets it (repeat for "
        "several); the header is honoured only on connections from these, and it is required",
        metavar="ADDRESS",
        many=True,
        shown="none",
        option="--trusted-proxy",
    )
    unknown_tokens_per_minute: int = _setting(
        20,
        "with --auth: unknown tokens one client may send in a minute; past it 429 until the minute is over "
        "(token guessing, each a database lookup); a token already seen valid still passes",
        metavar="N",
    )
    retain_days: float | None = _setting(
        None, "delete runs not heard from for this many days (checked hourly)", metavar="DAYS", kind=float
    )
    retain_spans_days: float | None = _setting(
        None,
        "delete the spans of runs not heard from for this many days, keeping the runs, ranks, per-step "
        "aggregates and alerts: summaries, step times and stragglers stay, the timelines go (checked hourly)",
        metavar="DAYS",
        kind=float,
    )

    def __post_init__(self) -> None:
        if self.trusted_user_header and not self.trusted_proxies:
            raise ValueError(
                "--trusted-user-header needs --trusted-proxy: the addresses of the proxies that set the header "
                "(anyone else could send it and be let in)"
            )
        for proxy in self.trusted_proxies:
            try:
                ipaddress.ip_network(proxy, strict=False)
            except ValueError:
                raise ValueError(f"--trusted-proxy {proxy!r} is not an IP address or network") from None
        floor = max(self.max_json_bytes, SMALL_BODY_BYTES)
        if self.max_bodies_bytes < floor:
            raise ValueError(
                f"--max-bodies-bytes ({self.max_bodies_bytes}) must be at least --max-json-bytes and 1 MiB "
                f"({floor}): a body within its own limits would be refused forever"
            )

    def hosts_for(self, bind_host: str) -> tuple[str, ...]:
        """The Host allowlist in force when serving on ``bind_host`` (``("*",)``: any)."""
        if self.allowed_hosts:
            return self.allowed_hosts
        return LOOPBACK_HOSTS if is_loopback(bind_host) else ("*",)


def settings_of(request: Request) -> ServiceSettings:
    """The settings of the app serving ``request`` (set by ``create_app``)."""
    settings: ServiceSettings = request.app.state.settings
    return settings


PEER_KEY = "bubblescope.peer"
"""The ASGI scope's key for the address a connection came from (``server.PeerAddress``)."""


def peer_address(request: Request) -> str | None:
    """The address the request's connection came from, whatever X-Forwarded-For said."""
    if PEER_KEY in request.scope:
        peer: str | None = request.scope[PEER_KEY]
        return peer
    return request.client.host if request.client else None


def from_trusted_proxy(settings: ServiceSettings, address: str | None) -> bool:
    """Whether a connection from ``address`` comes from one of ``--trusted-proxy``."""
    if address is None:
        return False
    try:
        peer = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(peer, ipaddress.IPv6Address) and peer.ipv4_mapped is not None:
        peer = peer.ipv4_mapped  # a dual-stack listener shows an IPv4 proxy as ::ffff:10.0.0.5
    return any(peer in ipaddress.ip_network(proxy, strict=False) for proxy in settings.trusted_proxies)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def option_name(setting: dataclasses.Field[Any]) -> str:
    if setting.metadata["option"]:
        return str(setting.metadata["option"])
    singular = setting.name.removesuffix("s") if setting.metadata["many"] else setting.name
    return "--" + singular.replace("_", "-")


def serve_options(parser: argparse.ArgumentParser) -> None:
    """One ``serve`` option per setting."""
    for setting in dataclasses.fields(ServiceSettings):
        if setting.metadata["many"]:
            parser.add_argument(
                option_name(setting),
                dest=setting.name,
                action="append",
                default=[],
                metavar=setting.metadata["metavar"],
                help=setting.metadata["help"],
            )
            continue
        kind = setting.metadata["kind"]
        if kind is bool:
            parser.add_argument(
                option_name(setting), dest=setting.name, action="store_true", help=setting.metadata["help"]
            )
            continue
        if kind is str:
            parser.add_argument(
                option_name(setting),
                dest=setting.name,
                default=setting.default,
                metavar=setting.metadata["metavar"],
                help=setting.metadata["help"],
            )
            continue
        parser.add_argument(
            option_name(setting),
            dest=setting.name,
            type=_positive(kind, setting.metadata["maximum"]),
            default=setting.default,
            metavar=setting.metadata["metavar"],
            help=f"{setting.metadata['help']} (default: %(default)s)",
        )


def _positive(kind: type[int] | type[float], maximum: float | None) -> Any:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a{'n integer' if kind is int else ' number'}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text} is not above 0")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"{text} is above the maximum, {maximum:.0f}")
        return value

    return parse


def from_options(args: argparse.Namespace) -> ServiceSettings:
    """The settings ``serve_options`` parsed (an option absent from ``args`` keeps its default);
    ValueError for a combination that cannot work."""
    values: dict[str, Any] = {}
    for setting in dataclasses.fields(ServiceSettings):
        if hasattr(args, setting.name):
            value = getattr(args, setting.name)
            values[setting.name] = tuple(value) if setting.metadata["many"] else value
    return ServiceSettings(**values)


def limits_table() -> str:
    """The Markdown table of docs/limits.md."""
    rows = ["| `serve` option | default | what it sets |", "|---|---|---|"]
    for setting in dataclasses.fields(ServiceSettings):
        default = setting.metadata["shown"] or _shown(setting.default)
        rows.append(f"| `{option_name(setting)}` | {default} | {setting.metadata['help']} |")
    return "\n".join(rows) + "\n"


def _shown(default: Any) -> str:
    if isinstance(default, bool):
        return "off"
    if default is None:
        return "none"
    return f"{default:,}" if isinstance(default, (int, float)) else str(default)


if __name__ == "__main__":
    print(limits_table(), end="")
