"""Direction controls shown as visible escapes (``backend/visible_text.py``), and the dashboard's copy of the list
(``frontend/format.js``) the same as the service's."""

from __future__ import annotations

import re
import unicodedata

from bubblescope.backend.visible_text import BIDI_CONTROLS, visible
from tests.support import REPO


def test_every_bidi_control_is_escaped_and_nothing_else() -> None:
    classes = {"LRE", "RLE", "LRO", "RLO", "PDF", "LRI", "RLI", "FSI", "PDI"}  # embeddings, overrides, isolates
    formatting = {chr(c) for c in range(0x110000) if unicodedata.bidirectional(chr(c)) in classes}
    marks = {unicodedata.lookup(name) for name in ("LEFT-TO-RIGHT MARK", "RIGHT-TO-LEFT MARK", "ARABIC LETTER MARK")}
    assert formatting | marks == set(BIDI_CONTROLS)  # Unicode's Bidi_Control property
    assert visible("report\u202egnp.exe") == "report<U+202E>gnp.exe"
    assert visible("a\u2066b\u2069\u200fc") == "a<U+2066>b<U+2069><U+200F>c"
    assert visible("plain, ünïcode ✓ 中文") == "plain, ünïcode ✓ 中文"


def test_the_dashboard_escapes_the_same_characters() -> None:
    source = (REPO / "frontend" / "format.js").read_text()
    found = re.search(r"const BIDI_CONTROL = /(\[[^\]]+\])/g;", source)
    assert found, "BIDI_CONTROL not found in format.js"
    pattern = re.compile(found.group(1))  # the class is written the same way in both regex dialects
    assert {chr(c) for c in range(0x10000) if pattern.fullmatch(chr(c))} == set(BIDI_CONTROLS)
