"""Text a job wrote, made safe to show: Unicode's direction controls (U+202E and its kin) become visible escapes.

A run name, a host or an error message is the job's text. With a RIGHT-TO-LEFT OVERRIDE in it,
``report\\u202egnp.exe`` reads ``reportexe.png``, and the service's own words after it come out reversed. Every
place that shows such text to a person or a receiver (alerts, webhooks and Alertmanager, /metrics' labels; the
dashboard does the same in ``frontend/format.js``, ``visible``) replaces each control with ``<U+XXXX>``: the reader
sees that it is there and what it is, and nothing is reordered. The stored text is left as the job sent it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

BIDI_CONTROLS: Final = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
"""ARABIC LETTER MARK, LEFT-TO-RIGHT and RIGHT-TO-LEFT MARK, the embeddings, overrides and their POP, the isolates
and theirs (Unicode's Bidi_Control property)."""
_CONTROL = re.compile(f"[{BIDI_CONTROLS}]")


def visible(text: str) -> str:
    """``text`` with each direction control shown as ``<U+202E>``."""
    return _CONTROL.sub(lambda match: f"<U+{ord(match.group()):04X}>", text)


def visible_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """A mapping's text values made ``visible`` (alert labels and annotations)."""
    return {name: visible(value) if isinstance(value, str) else value for name, value in values.items()}
