"""The collector's settings: one typed object, from ``init()`` arguments, then ``BUBBLESCOPE_*`` variables.

Every setting is a field of :class:`CollectorConfig`: its default, its environment variable, how
that variable is parsed and checked, and its docstring right under it. ``config_table`` renders
them as the table in docs/configuration.md (``python -m bubblescope.collector.config_table``).

Nothing is read at import: :meth:`CollectorConfig.resolve` reads the environment when the
collector initialises (and :func:`env_setting` when a module needs one setting on first use).
A malformed value never stops the job: it is reported once per process, naming the variable and
the value, and the default applies. An empty (or blank) variable counts as unset.
"""

from __future__ import annotations

import logging
import math
import os
import tempfile
import threading
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import Field, dataclass, field, fields
from pathlib import Path
from typing import Any

from bubblescope import wire

log = logging.getLogger("bubblescope.collector")

DEFAULT_FULL_SPANS_EVERY = 10
"""Full spans of every 10th step (aggregates of every step): a tenth of the span volume, and
still a sampled step every few seconds at typical step times. Capture requests add steps."""

MAX_SECONDS = 3600.0  # no wait or interval of the collector's needs more than an hour
MAX_SKEW_NS = 86_400 * 10**9  # a day: any real skew between hosts is far less


@dataclass(frozen=True, slots=True)
class Parser:
    """How a variable's text becomes a value: ``parse`` raises ValueError when it is bad, and
    ``accepts`` says what it takes (for the warning and the table)."""

    parse: Callable[[str], Any]
    accepts: str


def _text(raw: str) -> str:
    return raw


def _path(raw: str) -> Path:
    return Path(raw)


def _http_url(raw: str) -> str:
    """An http(s) URL of the service's root: trailing slashes and the API prefix (``/api/v1``, which the
    collector adds to every path itself) are dropped."""
    parts = urllib.parse.urlsplit(raw)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(raw)
    url = raw.rstrip("/")
    if url.endswith(wire.API_PREFIX):
        url = url[: -len(wire.API_PREFIX)].rstrip("/")
    return url


_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


def _flag(raw: str) -> bool:
    word = raw.lower()
    if word in _TRUE or word in _FALSE:
        return word in _TRUE
    raise ValueError(raw)


def _integer(raw: str) -> int:
    """An integer, also written as an exact float (``1e6``, ``1000.0``)."""
    try:
        return int(raw)
    except ValueError:
        value = float(raw)  # ValueError when it is no number at all
    if not math.isfinite(value) or not value.is_integer():
        raise ValueError(raw)
    return int(value)


def _within(parse: Callable[[str], float], minimum: float, maximum: float | None) -> Callable[[str], Any]:
    def checked(raw: str) -> Any:
        value = parse(raw)
        if not math.isfinite(value) or value < minimum or (maximum is not None and value > maximum):
            raise ValueError(raw)
        return value

    return checked


def _range(minimum: float, maximum: float | None) -> str:
    def number(value: float) -> str:
        return str(value) if isinstance(value, int) else f"{value:g}"

    return f">= {number(minimum)}" if maximum is None else f"from {number(minimum)} to {number(maximum)}"


TEXT = Parser(_text, "any text")
PATH = Parser(_path, "a directory path")
URL = Parser(_http_url, "an http:// or https:// URL")
FLAG = Parser(_flag, "one of 1/0, true/false, yes/no, on/off")


def integer(minimum: int, maximum: int | None = None) -> Parser:
    return Parser(_within(_integer, minimum, maximum), f"an integer {_range(minimum, maximum)}")


def seconds(minimum: float, maximum: float = MAX_SECONDS) -> Parser:
    return Parser(_within(float, minimum, maximum), f"a number of seconds {_range(minimum, maximum)}")


def setting(
    env: str,
    parser: Parser,
    default: Any = None,
    *,
    factory: Callable[[], Any] | None = None,
    shown: str | None = None,
    init: str | None = None,
) -> Any:
    """A field read from ``env``; ``shown`` is the default as the table shows it (when computed
    or clearer in words), ``init`` the ``collector.init`` keyword argument that sets it too."""
    metadata = {"env": env, "parser": parser, "shown": shown, "init": init}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def default_spool_dir() -> Path:
    """Where undeliverable batches wait for a later upload."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    if not os.access(os.path.dirname(base) or ".", os.W_OK):
        base = tempfile.gettempdir()
    return Path(base) / "bubblescope" / "spool"


@dataclass(frozen=True, kw_only=True, slots=True)
class CollectorConfig:
    """Everything the collector can be told; immutable once ``init`` has run."""

    url: str | None = setting("BUBBLESCOPE_URL", URL, init="url", shown="none: everything is spooled")
    """The service the timings stream into. Without one, every batch goes to the spool, to be
    delivered later with `bubblescope upload-spool`."""

    run_name: str = setting("BUBBLESCOPE_RUN", TEXT, "unnamed-run", init="run")
    """The run's name, as the dashboard lists it."""

    run_key: str | None = setting(
        "BUBBLESCOPE_RUN_ID", TEXT, init="run_key", shown="the name plus torchrun's run id, else rank 0's broadcast"
    )
    """Identifies this execution of the run; every rank must agree on it."""

    token: str | None = setting("BUBBLESCOPE_TOKEN", TEXT, init="token", shown="none")
    """Bearer token sent with every request to the service."""

    spool_dir: Path = setting(  # noqa: RUF009 - setting() returns a dataclasses.field, computed per instance
        "BUBBLESCOPE_SPOOL_DIR",
        PATH,
        factory=default_spool_dir,
        init="spool_dir",
        shown="`$XDG_CACHE_HOME/bubblescope/spool` (`~/.cache/...`)",
    )
    """Where batches the service could not take wait, one folder per run and rank."""

    full_spans_every: int = setting(
        "BUBBLESCOPE_FULL_SPANS_EVERY", integer(1), DEFAULT_FULL_SPANS_EVERY, init="full_spans_every"
    )
    """Every N-th step travels with all its spans; the others as per-step aggregates only (the
    service's capture requests add steps)."""

    gpu_timing: bool = setting("BUBBLESCOPE_GPU_TIMING", FLAG, True, shown="on when the job uses CUDA")
    """CUDA-event timing of GPU work (pipeline actions, `span(..., on_gpu=True)`) and of
    communication on CUDA tensors (collectives, DDP buckets, pipeline P2P)."""

    memory: bool = setting("BUBBLESCOPE_MEMORY", FLAG, True, shown="on")
    """Each step's peak memory: the process's peak resident set, and on a CUDA job the allocator's peak
    allocated and reserved bytes and its allocation retries (about 5 µs a step on a CPU). The peaks are
    reset each step: the process's `VmHWM` (which `getrusage`'s `ru_maxrss` reports) and
    `torch.cuda.max_memory_allocated`'s; turn this off where the job reads those itself."""

    trace_collectives: bool = setting("BUBBLESCOPE_TRACE_COLLECTIVES", FLAG, True, shown="on")
    """A span for every torch.distributed call made after `init`."""

    clock_resync_steps: int = setting("BUBBLESCOPE_CLOCK_RESYNC_STEPS", integer(0), 500)
    """Re-estimate the clock offset to rank 0 every N steps (0: only at start)."""

    clock_handshake_timeout_s: float = setting("BUBBLESCOPE_CLOCK_HANDSHAKE_TIMEOUT_S", seconds(0.1), 10.0)
    """How long the first clock round waits for the other ranks (one that never calls `init`
    costs the others this, once)."""

    flush_interval_s: float = setting("BUBBLESCOPE_FLUSH_INTERVAL_S", seconds(0.001), 1.0)
    """How often the background thread sends what the finished steps left; the service may ask a big
    run for longer (its ingest answers' `flush_interval_s`: world size / `--ingest-batches-per-s`)."""

    watchdog_after_s: float = setting("BUBBLESCOPE_WATCHDOG_AFTER_S", seconds(0.0), 10.0)
    """A step running this long, and 3 times its usual length, makes the background thread report
    it (and the op it is blocked in) every few seconds, for the service's hung alert (0: never)."""

    request_timeout_s: float = setting("BUBBLESCOPE_REQUEST_TIMEOUT_S", seconds(0.001), 5.0)
    """Timeout of one request to the service."""

    spool_max_bytes: int = setting(
        "BUBBLESCOPE_SPOOL_MAX_BYTES", integer(0), 256 * 1024 * 1024, shown="`268435456` (256 MiB)"
    )
    """Bound of this rank's spool; past it spans are dropped and counted (aggregates are kept)."""

    shutdown_timeout_s: float = setting("BUBBLESCOPE_SHUTDOWN_TIMEOUT_S", seconds(0.0), 10.0)
    """Longest wait for delivery at `shutdown()` (plus one request timeout); the rest stays spooled."""

    hostname: str | None = setting("BUBBLESCOPE_HOSTNAME", TEXT, shown="`socket.gethostname()`")
    """The host name this rank registers (e.g. to let one machine play several hosts in a test)."""

    disabled: bool = setting("BUBBLESCOPE_DISABLED", FLAG, False, shown="off")
    """Turns the collector off: every call is a no-op."""

    pure_python: bool = setting("BUBBLESCOPE_PURE_PYTHON", FLAG, False, shown="off: C when it was built")
    """The pipelining wrappers in Python instead of C (same spans, more cost per action)."""

    model_blocks: bool = setting("BUBBLESCOPE_MODEL_BLOCKS", FLAG, False, shown="off")
    """Integrations (torchtitan) price each block of the model (`instrument_model(model, blocks=...)` on its
    `layers`), for the run page's per-block costs, at a few microseconds a block call."""

    gpu: str | None = setting("BUBBLESCOPE_GPU", TEXT, shown="the CUDA device's name")
    """The GPU integrations (torchtitan) declare for the run's cluster, so the planner prices its suggestions: a
    planner GPU (`H100-SXM`, `H200`, `B200`...) or a device name as torch reports it (`NVIDIA H100 80GB HBM3`)."""

    stage_layers: bool = setting("BUBBLESCOPE_STAGE_LAYERS", FLAG, True, shown="on")
    """A pipeline's stages are timed layer by layer on detailed steps (at least 10 apart after the first 10 timed;
    with the default `full_spans_every`, every detailed step), so that a suggested rebalance moves measured time:
    each layer's own cost, and the work outside the layers (embedding, head, loss) staying on its stage. About 20
    µs a layer call on CPU, on those steps. Compiled layers are not timed."""

    clock_skew_ns: int = setting("BUBBLESCOPE_CLOCK_SKEW_NS", integer(-MAX_SKEW_NS, MAX_SKEW_NS), 0)
    """Shifts this process's clock by this many nanoseconds, applied at `init`: a way to check on
    one host that clock alignment undoes a skew between hosts."""

    @classmethod
    def resolve(
        cls, environ: Mapping[str, str] | None = None, *, given_to: str = "init", **given: Any
    ) -> CollectorConfig:
        """``given`` (the arguments of the function ``given_to``, by field name; None or "": not
        given) win over the environment, which wins over the defaults. A bad value of either is
        reported once, naming it, and left out."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for item in fields(cls):
            value = given.pop(item.name, None)
            if value is not None and value != "":
                what = f"{given_to}({item.metadata['init'] or item.name}={value!r})"
                value = _checked(item, what, str(value), f"{item.metadata['env']} or the default")
            if value is None:
                value = _from_env(item, environ)
            if value is not None:
                values[item.name] = value
        if given:
            raise TypeError(f"unknown settings: {sorted(given)}")
        return cls(**values)


_warned: set[str] = set()  # "VARIABLE='value'" (or "init(name=value)") already reported in this process
_warned_lock = threading.Lock()


def shown_default(item: Field[Any]) -> str:
    """The field's default in words (``shown``), or its value."""
    if item.metadata["shown"] is not None:
        return str(item.metadata["shown"])
    return str(item.default)


def _checked(item: Field[Any], what: str, raw: str, fallback: str) -> Any:
    """``raw`` parsed by the field's parser, or None (reported once per ``what``) if it is bad."""
    parser: Parser = item.metadata["parser"]
    try:
        return parser.parse(raw.strip())
    except (ValueError, OverflowError):
        pass
    with _warned_lock:
        first = what not in _warned
        _warned.add(what)
    if first:
        log.warning("bubblescope: %s is not %s; using %s instead", what, parser.accepts, fallback)
    return None


def _from_env(item: Field[Any], environ: Mapping[str, str]) -> Any:
    """The variable's value, or None when it is unset, blank or bad (reported once)."""
    name = item.metadata["env"]
    raw = environ.get(name, "")
    if not raw.strip():
        return None
    default = shown_default(item).replace("`", "")
    return _checked(item, f"{name}={raw!r}", raw, f"the default ({default})")


def env_setting(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """One field (``name``) as the environment sets it: None when unset or bad (reported once).

    For a setting a module needs on first use, after or without ``init``."""
    for item in fields(CollectorConfig):
        if item.name == name:
            return _from_env(item, os.environ if environ is None else environ)
    raise KeyError(name)
