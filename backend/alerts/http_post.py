"""One POST of a JSON body to a webhook or an Alertmanager, and what its answer means for a retry.

Standard library only (urllib). Redirects are not followed (a POST turned into a GET would lose the
body): a 3xx is a refusal like a 4xx. Proxies are taken from the environment (``https_proxy``,
``no_proxy``) as urllib does. A 2xx is delivered; no answer (refused, reset, timed out), a 5xx, a 408
or a 429 may succeed later; any other answer will not.
"""

from __future__ import annotations

import http.client
import urllib.error
import urllib.request
from dataclasses import dataclass
from email.message import Message
from urllib.parse import urlsplit

from bubblescope import __version__

USER_AGENT = f"bubblescope/{__version__}"
RETRYABLE_STATUSES = frozenset({408, 429})
ANSWER_SHOWN_BYTES = 300


@dataclass(frozen=True)
class PostResult:
    status: int | None  # the HTTP status; None when no answer came
    error: str | None  # None when delivered
    retryable: bool
    retry_after_s: float | None = None  # the answer's Retry-After, in seconds, when it gave one

    @property
    def delivered(self) -> bool:
        return self.error is None


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *_args: object, **_kwargs: object) -> None:
        return None  # urllib then raises HTTPError with the 3xx


_OPENER = urllib.request.build_opener(_NoRedirects)


def shown(url: str) -> str:
    """The URL as logs show it: scheme, host and port only (a webhook's path often holds a token)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname or ''}{f':{parts.port}' if parts.port else ''}"


def post_json(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> PostResult:
    request = urllib.request.Request(url, data=body, method="POST")
    for name, value in {"Content-Type": "application/json", "User-Agent": USER_AGENT, **headers}.items():
        request.add_header(name, value)
    try:
        with _OPENER.open(request, timeout=timeout_s) as answer:
            answer.read(ANSWER_SHOWN_BYTES)
            return PostResult(answer.status, None, retryable=False)
    except urllib.error.HTTPError as refusal:
        status = refusal.code
        try:
            text = refusal.read(ANSWER_SHOWN_BYTES).decode(errors="replace").strip()
        except (OSError, http.client.HTTPException):
            text = ""
        return PostResult(
            status,
            f"HTTP {status}" + (f": {text}" if text else ""),
            retryable=status >= 500 or status in RETRYABLE_STATUSES,
            retry_after_s=_retry_after(refusal.headers),
        )
    except ValueError as error:  # not an http(s) URL: it will never work
        return PostResult(None, f"invalid URL: {error}", retryable=False)
    except (OSError, http.client.HTTPException) as error:  # refused, reset, timed out, garbled answer
        reason = error.reason if isinstance(error, urllib.error.URLError) else error
        return PostResult(None, f"no answer: {reason or type(error).__name__}", retryable=True)


def _retry_after(headers: Message) -> float | None:
    value = headers.get("Retry-After")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: rare; the backoff applies
