"""GET /api/v1/span-kinds: every span kind of the wire, with its category and a colour, from one place."""

from __future__ import annotations

import re

from bubblescope import analysis, wire
from bubblescope.backend.web.bubble_causes import CAUSE_COLORS
from bubblescope.backend.web.router import FRONTEND_DIR
from tests.support import LiveServer

CSS_HEX = re.compile(r"^#[0-9a-f]{6}$")


def test_every_wire_kind_is_served_with_its_category_and_a_colour(sqlite_server: LiveServer) -> None:
    with sqlite_server.client() as client:
        response = client.get("/api/v1/span-kinds")
    assert response.status_code == 200, response.text
    served = response.json()
    kinds = {k["kind"]: k for k in served["kinds"]}
    assert len(kinds) == len(served["kinds"]) and set(kinds) == wire.SPAN_KINDS
    assert {k for k, v in kinds.items() if v["category"] == "compute"} == wire.COMPUTE_KINDS
    assert {k for k, v in kinds.items() if v["category"] == "communication"} == wire.COMMUNICATION_KINDS
    assert all(CSS_HEX.match(k["color"]) for k in served["kinds"]), served
    assert len({k["color"] for k in served["kinds"]}) == len(kinds)  # each kind tells apart on the timeline
    categories = {c["category"]: c["color"] for c in served["categories"]}
    assert set(categories) == {"compute", "communication"} and all(CSS_HEX.match(c) for c in categories.values())


def test_the_pages_api_client_uses_the_wire_prefix() -> None:
    source = (FRONTEND_DIR / "api.js").read_text()
    assert f'export const API_PREFIX = "{wire.API_PREFIX}";' in source
    others = [
        p.name for p in FRONTEND_DIR.glob("*.js") if p.name != "api.js" and re.search(r"\bfetch\(|/api/", p.read_text())
    ]
    assert others == [], f"{others} ask the API without the client in api.js"


def test_every_cause_the_analysis_names_is_served_with_its_label_and_a_colour(sqlite_server: LiveServer) -> None:
    """The causes' one home is the analysis (``CAUSE_KINDS``, which the attribution names, then ``STEP_PARTS``,
    a step split's); their colours are backend/web/bubble_causes.py's; the pages draw what the service serves
    (frontend/causes.js)."""
    with sqlite_server.client() as client:
        response = client.get("/api/v1/bubble-causes")
    assert response.status_code == 200, response.text
    served = response.json()["causes"]
    kinds = [*analysis.CAUSE_KINDS, *analysis.STEP_PARTS]
    assert [c["name"] for c in served] == [kind.name for kind in kinds]
    assert [c["label"] for c in served] == [kind.label for kind in kinds]
    assert all(CSS_HEX.match(c["color"]) for c in served) and len({c["color"] for c in served}) == len(served)
    assert set(CAUSE_COLORS) == {kind.name for kind in kinds}  # no colour for a cause that is gone
    causes_js = (FRONTEND_DIR / "causes.js").read_text()
    assert "#" not in causes_js.replace("#777", ""), "frontend/causes.js keeps no colour of its own"
