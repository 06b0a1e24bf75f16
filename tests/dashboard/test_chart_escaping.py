"""Plotly reads a subset of HTML in tick labels, trace names and hover text: what a run's ranks, spans
and registration carry is shown there as literal text, never as a link, a style or a line break."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from bubblescope.analysis.warmup import WARMUP_STEPS
from tests.dashboard.synthetic import gpipe_batch
from tests.support import LiveServer, post_gzip

pytestmark = [pytest.mark.browser]

LINK = '<a href="https://evil.example/x">LINK</a>'
BIG = '<span style="font-size:80px;color:red">BIG</span>'
MARKUP = "<b>bold</b><br>&amp; 'q'"
HOSTS = [LINK, BIG, MARKUP, LINK]  # two ranks on the one host
SPAN_NAME = '<a href="https://evil.example/s">span</a>'
GROUP = '<a href="//evil.example">g</a>'  # groups are at most 32 characters
STAGES, MICROBATCHES, STEPS = 4, 4, 11
SCORED = STEPS - WARMUP_STEPS  # the heat map's default steps leave the warm-up out

NO_INJECTION = """() => {
  const xlink = "http://www.w3.org/1999/xlink";
  const links = [...document.querySelectorAll("a")].filter((a) => (
    `${a.getAttribute("href")} ${a.getAttributeNS(xlink, "href")}`.includes("evil.example")));
  const big = [...document.querySelectorAll("*")].filter((e) => (
    getComputedStyle(e).fontSize === "80px" || (e.getAttribute("style") || "").includes("80px")));
  return {
    links: links.length + document.querySelectorAll('a[href*="evil.example"]').length,
    svgLinks: document.querySelectorAll("svg a").length,
    big: big.length,
    bold: [...document.querySelectorAll("svg tspan")].filter((t) => /bold/.test(t.getAttribute("style") || "")).length,
  };
}"""
CLEAN = {"links": 0, "svgLinks": 0, "big": 0, "bold": 0}


def register_and_ingest(client: httpx.Client, key: str) -> None:
    config = {"schedule": LINK, "num_stages": STAGES, "num_microbatches": MICROBATCHES}
    response = client.put(f"/api/v1/runs/{key}", json={"name": BIG, "world_size": STAGES, "config": config})
    assert response.status_code == 200, response.text
    for rank, host in enumerate(HOSTS):
        response = client.put(f"/api/v1/runs/{key}/ranks/{rank}", json={"host": host, "pid": rank, "stage": rank})
        assert response.status_code == 200, response.text
    # rank 1 (on BIG) slow throughout, rank 2 (on MARKUP) slow once: a red band and a ringed cell
    for steps in (range(STEPS - 1), range(STEPS - 1, STEPS)):
        for rank in range(STAGES):
            slow = 1.6 if rank == 1 or (rank == 2 and steps.start == STEPS - 1) else 1.0
            batch = gpipe_batch(key, rank, STAGES, MICROBATCHES, steps, slow)
            count = len(batch["spans"]["kind"])
            batch["spans"] |= {"name": [SPAN_NAME] * count, "group": [GROUP] * count}
            response = post_gzip(client, batch)
            assert response.is_success, response.text


def hover_text(page: Any, chart: str, x: float, y: float) -> str:
    """The hover label's text at (x, y), the label of an earlier point gone first."""
    label = page.locator(f"#{chart} .hoverlayer .hovertext").first
    page.mouse.move(0, 0)
    label.wait_for(state="detached", timeout=5_000)
    page.mouse.move(x, y)
    label.wait_for(timeout=5_000)
    return label.text_content()


def test_user_supplied_strings_show_as_text_in_every_chart(
    browser: Any, sqlite_server: LiveServer, output_dir: Path
) -> None:
    key = f"escaping-{uuid.uuid4().hex[:8]}"
    with sqlite_server.client() as client:
        register_and_ingest(client, key)
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(f"{sqlite_server.url}/runs/{key}")
    page.wait_for_selector(f"body[data-rendered-step='{STEPS - 1}'][data-stragglers-steps='{SCORED}']", timeout=20_000)
    assert page.locator("#run-title").inner_text() == BIG

    ticks = page.locator("#straggler-heatmap .ytick text").all_text_contents()
    assert sorted(ticks) == sorted(f"rank {rank} · {host} · stage {rank}" for rank, host in enumerate(HOSTS))
    assert page.evaluate(NO_INJECTION) == CLEAN

    page.locator("#straggler-heatmap").scroll_into_view_if_needed()
    box = page.locator("#straggler-heatmap .nsewdrag").bounding_box()  # rank 0 on top, the last step right
    for rank, host in enumerate(HOSTS):
        x, y = box["x"] + box["width"] * (SCORED - 0.5) / SCORED, box["y"] + box["height"] * (rank + 0.5) / STAGES
        text = hover_text(page, "straggler-heatmap", x, y)  # the last step's cell of the rank's row
        assert text.startswith(f"rank {rank} · {host} · stage {rank}step {STEPS - 1}"), text
        assert ("flagged" in text) == (rank == 2), text
        assert page.evaluate(NO_INJECTION) == CLEAN

    page.locator("#timeline").scroll_into_view_if_needed()
    bars = page.locator("#timeline .barlayer .point path")
    widest = max((bars.nth(i).bounding_box() for i in range(bars.count())), key=lambda b: b["width"])
    text = hover_text(page, "timeline", widest["x"] + widest["width"] / 2, widest["y"] + widest["height"] / 2)
    assert SPAN_NAME in text and f"group {GROUP}" in text, text
    assert page.evaluate(NO_INJECTION) == CLEAN
    page.screenshot(path=str(output_dir / "escape-hover.png"))

    page.mouse.move(0, 0)
    page.screenshot(path=str(output_dir / "escape-1440.png"), full_page=True)
    page.set_viewport_size({"width": 900, "height": 1000})
    page.wait_for_timeout(1_000)  # the charts follow the window's width
    assert page.evaluate(NO_INJECTION) == CLEAN
    page.screenshot(path=str(output_dir / "escape-900.png"), full_page=True)
    assert errors == [], errors
    page.close()
