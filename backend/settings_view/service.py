"""The settings in force, as an admin may see them: every ``ServiceSettings`` field, with what could
be a secret left out. A webhook URL often is one (a chat service's URL carries its key in the
path): only its scheme and host are shown; any other URL loses its password. ``webhook_secret_file``
is where the signing key is, not the key, and is shown."""

from __future__ import annotations

import dataclasses
from typing import Any, Final
from urllib.parse import urlsplit

from bubblescope.backend.settings import ServiceSettings

HIDDEN: Final = "<hidden>"
URL_FIELDS_SHOWN_BY_HOST: Final = frozenset({"webhook_urls"})
URL_FIELDS: Final = frozenset({"alertmanager_urls", "external_url"})


def settings_shown(settings: ServiceSettings) -> dict[str, Any]:
    shown: dict[str, Any] = {}
    for setting in dataclasses.fields(ServiceSettings):
        value = getattr(settings, setting.name)
        if setting.name in URL_FIELDS_SHOWN_BY_HOST:
            value = [_host_only(url) for url in value]
        elif setting.name in URL_FIELDS:
            value = [_no_password(url) for url in value] if isinstance(value, tuple) else _no_password(value)
        elif isinstance(value, tuple):
            value = list(value)
        shown[setting.name] = value
    return shown


def _host_only(url: str) -> str:
    try:
        parts = urlsplit(url)
        port = f":{parts.port}" if parts.port else ""
    except ValueError:  # not a URL one can read: all of it hidden
        return HIDDEN
    return f"{parts.scheme}://{parts.hostname or ''}{port}/{HIDDEN}"


def _no_password(url: str | None) -> str | None:
    if url is None:
        return None
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return HIDDEN
    return parts._replace(netloc=f"{parts.username}:{HIDDEN}@{parts.hostname}{port}").geturl()
