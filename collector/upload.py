"""Re-send spooled messages to a service later (``bubblescope upload-spool``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from bubblescope.collector.config import URL, default_spool_dir, env_setting
from bubblescope.collector.spool import Spool
from bubblescope.collector.transport import Verdict, readable, send

STALE_TEMPORARY_S = 60.0  # a live writer renames its temporary file within milliseconds


@dataclass(frozen=True)
class UploadResult:
    delivered: int
    rejected: int
    remaining: int
    unreadable: int = 0  # corrupt files moved aside as *.bad (never sent, never blocking)
    refused_token: str | None = None  # the service's 401/403 answer: the upload stopped, nothing removed
    misaddressed: str | None = None  # the URL has no bubblescope API behind it: the upload stopped, nothing removed


def upload_spool(
    spool_dir: str | os.PathLike[str] | None = None,
    url: str | None = None,
    token: str | None = None,
    timeout_s: float = 30.0,
) -> UploadResult:
    """Send every spooled message oldest first; stop at the first the service cannot take now.

        What is not given comes from the collector's settings, as the job that spooled read them
        (``BUBBLESCOPE_SPOOL_DIR``, ``BUBBLESCOPE_URL``, ``BUBBLESCOPE_TOKEN``); ValueError without
        any URL. Delivered and rejected (4xx other than 401/403/408/429) messages are removed; a
    refused token (401/403), or a URL with no bubblescope API behind it (404, no such route), stops the upload
        with everything kept; a retried
        batch the service already has is answered as delivered, so an upload can be repeated safely.
        Temporary files left by a process killed mid-write are deleted once stale; they were never
        messages.
    """
    if url is not None:  # given explicitly: a bad one is an error, not a fallback to somewhere else
        try:
            url = URL.parse(url)
        except ValueError:
            raise ValueError(f"url {url!r} is not {URL.accepts}") from None
    url = url or env_setting("url")
    if url is None:
        raise ValueError("no service URL: give one (--url) or set BUBBLESCOPE_URL")
    token = token or env_setting("token")
    folder = Path(spool_dir) if spool_dir else env_setting("spool_dir") or default_spool_dir()
    spool = Spool(folder, max_bytes=1 << 62)
    spool.remove_stale_temporaries(STALE_TEMPORARY_S)
    delivered = rejected = 0
    refused: str | None = None
    misaddressed: str | None = None
    for path, message in spool.pending():
        response = send(url, message, token, timeout_s)
        if response.verdict is Verdict.UNAUTHORIZED:
            refused = f"HTTP {response.status}: {readable(response.body)}"
            break
        if response.verdict is Verdict.MISADDRESSED:
            misaddressed = f"{url} has no bubblescope API (HTTP 404 for {message.path})"
            break
        if response.verdict is Verdict.RETRY:
            break
        if response.verdict is Verdict.DELIVERED:
            delivered += 1
        else:
            rejected += 1
        spool.remove(path)
    return UploadResult(delivered, rejected, len(spool.files()), spool.unreadable, refused, misaddressed)
