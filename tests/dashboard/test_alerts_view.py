"""The alerts on the dashboard, in real headless Chromium against a real server whose rules raise
them: the run page's banner and its evidence links, the run list's alert column, the hung view of
the ranks table (what each rank is blocked in, the lagging ranks first and highlighted), for a few
ranks and for 1,024; server text shown as text."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from bubblescope.backend.db import migrate
from tests.support import LiveServer, post_gzip, start_server

pytestmark = [pytest.mark.browser]

EMPTY_SPANS: dict[str, list[Any]] = {"step": [], "kind": [], "start_ns": [], "end_ns": []}
STEP_NS = 50_000_000
XSS_ERROR = "RuntimeError: <img src=x onerror=window.__pwned=1> boom"
MARKUP_HOST = "<i>node-a</i>"
WIDTHS = (1440, 900)


@pytest.fixture(scope="module")
def alerting_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A server of its own (the run list shows only this module's runs) whose rules call a run hung
    after 2 s without a finished step, evaluated every second."""
    url = f"sqlite:///{tmp_path_factory.mktemp('alerts-view-db') / 'bubblescope.db'}"
    migrate.upgrade(url)
    live = start_server(
        url, tmp_path_factory.mktemp("alerts-view"), extra_args=["--hung-after", "2", "--alert-interval", "1"]
    )
    yield live
    live.stop()


def in_parallel(calls: list[Callable[[], httpx.Response]]) -> None:
    with ThreadPoolExecutor(8) as pool:
        for response in pool.map(lambda call: call(), calls):
            assert response.is_success, response.text


def register(client: httpx.Client, key: str, world: int, name: str, host: Callable[[int], str]) -> None:
    assert client.put(f"/api/v1/runs/{key}", json={"name": name, "world_size": world}).status_code == 200
    rank = {"pid": 0, "clock_offset_ns": 0, "clock_uncertainty_ns": 0}
    in_parallel(
        [
            lambda r=r: client.put(  # type: ignore[misc]
                f"/api/v1/runs/{key}/ranks/{r}", json={**rank, "host": host(r), "pid": 1000 + r, "stage": r % 8}
            )
            for r in range(world)
        ]
    )


def steps_batch(key: str, rank: int, seq: int, steps: range, start: int) -> dict[str, Any]:
    aggregates = [
        {
            "step": step,
            "start_ns": start + i * STEP_NS,
            "end_ns": start + (i + 1) * STEP_NS,
            "compute_ns": STEP_NS - 10_000_000,
            "comm_ns": 0,
            "exposed_comm_ns": 0,
            "idle_ns": 10_000_000,
            "span_count": 0,
        }
        for i, step in enumerate(steps)
    ]
    return {"run_key": key, "rank": rank, "seq": seq, "steps": aggregates, "spans": EMPTY_SPANS}


def send_steps(client: httpx.Client, key: str, world: int, seq: int, steps: range) -> None:
    """Every rank's aggregates of ``steps``, which ran in step on every rank (of 50 ms each) just now."""
    start = time.time_ns() - len(steps) * STEP_NS
    in_parallel([lambda r=r: post_gzip(client, steps_batch(key, r, seq, steps, start)) for r in range(world)])  # type: ignore[misc]


def send_in_flight(client: httpx.Client, key: str, reports: dict[int, dict[str, Any]], seq: int) -> None:
    in_parallel(
        [
            lambda r=r, report=report: post_gzip(  # type: ignore[misc]
                client, {"run_key": key, "rank": r, "seq": seq, "steps": [], "spans": EMPTY_SPANS, "in_flight": report}
            )
            for r, report in reports.items()
        ]
    )


def wait_for_alert(
    client: httpx.Client,
    key: str,
    alertname: str,
    state: str = "firing",
    only: Callable[[dict[str, Any]], bool] | None = None,
) -> dict[str, Any]:
    """The newest alert of the run with this name and state (and ``only`` true), once the rules raised it."""
    deadline = time.monotonic() + 40
    alerts: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        alerts = client.get("/api/v1/alerts", params={"run": key, "state": state}).json()["alerts"]
        found = [a for a in alerts if a["labels"]["alertname"] == alertname and (only is None or only(a))]
        if found:
            return found[0]
        time.sleep(0.3)
    raise AssertionError(f"no {state} {alertname} for {key}: {alerts}")


def op(kind: str, name: str | None, peer: int | None, group: str, elapsed_s: float) -> dict[str, Any]:
    return {"kind": kind, "name": name, "group": group, "peer": peer, "bytes": 1 << 20, "elapsed_s": elapsed_s}


def new_page(browser: Any, width: int, height: int = 900) -> tuple[Any, list[str]]:
    page = browser.new_page(viewport={"width": width, "height": height})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    return page, errors


def in_view(page: Any, selector: str) -> bool:
    return bool(
        page.evaluate(
            f"() => {{ const r = document.querySelector({selector!r}).getBoundingClientRect();"
            " return r.top >= 0 && r.top < window.innerHeight; }"
        )
    )


def test_a_failed_rank_shows_in_the_banner_the_list_and_the_ranks_table(
    browser: Any, alerting_server: LiveServer, output_dir: Path
) -> None:
    failed, healthy = f"failed-{uuid.uuid4().hex[:8]}", f"healthy-{uuid.uuid4().hex[:8]}"
    with alerting_server.client() as client:
        register(client, failed, 2, "broken-run", lambda r: MARKUP_HOST if r == 1 else "node-b")
        register(client, healthy, 2, "fine-run", lambda r: "node-c")
        send_steps(client, healthy, 2, 0, range(3))
        for rank in (0, 1):
            end = {"outcome": "finished", "end_ns": time.time_ns()}
            assert client.put(f"/api/v1/runs/{healthy}/ranks/{rank}/end", json=end).status_code == 200
        end = {"outcome": "failed", "error": XSS_ERROR, "end_ns": time.time_ns()}
        assert client.put(f"/api/v1/runs/{failed}/ranks/1/end", json=end).status_code == 200
        alert = wait_for_alert(client, failed, "BubblescopeRunFailed")
        assert alert["labels"]["rank"] == "1" and alert["generatorURL"].endswith(f"/runs/{failed}#ranks")
        assert client.get("/api/v1/alerts", params={"run": healthy}).json()["alerts"] == []

    # the run list: one alerts request per round for the whole list; a column only the failed run fills
    for width in WIDTHS:
        page, errors = new_page(browser, width, 700)
        asked: list[str] = []
        page.on("request", lambda r: asked.append(r.url) if "/api/v1/" in r.url else None)
        page.goto(f"{alerting_server.url}/")
        bad = page.locator(f"#runs tbody tr[data-run='{failed}']")
        expect(bad.locator(".alert-count")).to_have_text("1", timeout=15_000)
        link = bad.locator("a.alert-link")
        assert f"failed on rank 1 (host {MARKUP_HOST})" in link.inner_text()
        assert link.get_attribute("href") == f"/runs/{failed}#ranks"
        good = page.locator(f"#runs tbody tr[data-run='{healthy}']")
        assert good.locator(".alert-count").count() == 0 and good.locator("td.alerts").inner_text() == "—"
        assert page.locator("#runs i").count() == 0  # the host's markup is text
        alerts_asked = [url for url in asked if "/api/v1/alerts" in url]
        runs_asked = [url for url in asked if url.endswith("/api/v1/runs?limit=50")]  # the first page
        assert alerts_asked and set(alerts_asked) == {f"{alerting_server.url}/api/v1/alerts?state=firing&limit=1000"}
        assert len(alerts_asked) <= len(runs_asked) + 1 and len(asked) == len(alerts_asked) + len(runs_asked), asked
        page.screenshot(path=str(output_dir / f"alerts-run-list-{width}.png"), full_page=True)
        assert errors == [], errors
        page.close()

    for width in WIDTHS:
        page, errors = new_page(browser, width, 700)
        page.goto(f"{alerting_server.url}/runs/{failed}")
        item = page.locator("#alert-banner li.alert")
        expect(item).to_have_count(1, timeout=15_000)
        assert "sev-critical" in (item.get_attribute("class") or "")
        assert f"Run {failed} failed on rank 1 (host {MARKUP_HOST})" in item.locator(".summary").inner_text()
        assert XSS_ERROR in item.locator(".description").inner_text()  # as text, the markup too
        assert f"Read rank 1's log first, on host {MARKUP_HOST} (PID " in item.locator(".action").inner_text()
        assert re.fullmatch(r"started (just now|\d+ s ago)", item.locator(".since").inner_text())
        assert item.locator("a.evidence").inner_text() == "See the ranks →"
        row = page.locator("#ranks-table tbody tr[data-rank='1']")
        assert "named" in (row.get_attribute("class") or "") and "failed first" in row.inner_text()
        assert row.locator("td.doing").inner_text() == f"failed: {XSS_ERROR}"
        assert page.locator("main img, main i").count() == 0 and page.evaluate("() => window.__pwned") is None
        page.screenshot(path=str(output_dir / f"alerts-run-banner-{width}.png"))
        # the evidence link stays on the page: no reload, the URL takes its hash, the ranks scroll into view
        assert not in_view(page, "#ranks")
        page.evaluate("() => { window.__samePage = true; }")
        item.locator("a.evidence").click()
        page.wait_for_function("() => location.hash === '#ranks'", timeout=5_000)
        page.wait_for_function(
            "() => { const top = document.getElementById('ranks').getBoundingClientRect().top;"
            " return top >= 0 && top < window.innerHeight; }",
            timeout=5_000,
        )
        assert page.evaluate("() => window.__samePage") is True
        assert errors == [], errors
        page.close()


def test_the_hung_view_says_what_each_rank_waits_for_and_puts_the_lagging_rank_first(
    browser: Any, alerting_server: LiveServer, output_dir: Path
) -> None:
    key = f"hung-{uuid.uuid4().hex[:8]}"
    with alerting_server.client() as client:
        register(client, key, 3, "hung-run", lambda r: f"node-{r}")
        send_steps(client, key, 3, 0, range(3))
        reports = {
            0: {"step": 3, "in_step": True, "elapsed_s": 40, "op": op("recv", "bwd", 1, "pp", 39)},
            1: {"step": 3, "in_step": True, "elapsed_s": 41, "op": None},
            2: {"step": 3, "in_step": True, "elapsed_s": 40, "op": op("send", "fwd", 1, "pp", 39)},
        }
        send_in_flight(client, key, reports, 1)
        alert = wait_for_alert(client, key, "BubblescopeRunHung")
        assert alert["labels"]["rank"] == "1" and alert["generatorURL"].endswith(f"/runs/{key}?view=hung#ranks")

    page, errors = new_page(browser, 1300, 700)
    page.goto(f"{alerting_server.url}/runs/{key}")  # without the view: by rank
    page.wait_for_selector("body[data-alerts-firing='1'][data-ranks-shown='3']", timeout=15_000)
    assert page.locator("#ranks-table tbody tr").first.get_attribute("data-rank") == "0"
    evidence = page.locator("#alert-banner a.evidence")
    assert evidence.get_attribute("href") == f"/runs/{key}?view=hung#ranks"
    evidence.click()  # the view and the order change in place
    page.wait_for_function("() => location.search === '?view=hung' && location.hash === '#ranks'", timeout=5_000)
    expect(page.locator("#ranks-table tbody tr").first).to_have_attribute("data-rank", "1")
    page.close()

    page, errors = new_page(browser, 1300, 700)
    page.goto(f"{alerting_server.url}/runs/{key}?view=hung#ranks")
    page.wait_for_selector("body[data-alerts-firing='1'][data-ranks-shown='3']", timeout=15_000)
    rows = page.locator("#ranks-table tbody tr")
    assert [rows.nth(i).get_attribute("data-rank") for i in range(3)] == ["1", "0", "2"]  # lagging, then blocked
    lagging = page.locator("#ranks-table tr[data-rank='1']")
    assert "lagging" in (lagging.get_attribute("class") or "")
    assert "lagging" in lagging.locator("td").first.inner_text()
    assert re.fullmatch(r"in step 3 outside any collective for (\d+) s", lagging.locator("td.doing").inner_text())
    waiting = page.locator("#ranks-table tr[data-rank='0']").locator("td.doing").inner_text()
    found = re.fullmatch(r"recv 'bwd' from rank 1 on pp for (\d+) s \(in step 3\)", waiting)
    assert found and int(found[1]) >= 39, waiting  # the report's 39 s plus the time since it came
    assert "send 'fwd' to rank 1 on pp" in page.locator("#ranks-table tr[data-rank='2'] td.doing").inner_text()
    for rank in ("0", "2"):
        assert "lagging" not in (page.locator(f"#ranks-table tr[data-rank='{rank}']").get_attribute("class") or "")
    assert page.locator("#ranks-table tr[data-rank='0'] td").nth(4).inner_text() == "2"  # last finished step
    page.wait_for_selector("body[data-drawn]", timeout=15_000)
    assert page.evaluate("() => window.scrollY") > 0 and in_view(page, "#ranks")
    page.screenshot(path=str(output_dir / "alerts-hung-3-ranks.png"))

    # the ranks move again: the alert resolves, the banner goes, the resolved list has it
    with alerting_server.client() as client:
        send_steps(client, key, 3, 2, range(3, 4))
        wait_for_alert(client, key, "BubblescopeRunHung", state="resolved")
    page.wait_for_selector("body[data-alerts-firing='0']", timeout=15_000)
    assert page.locator("#alert-banner").is_hidden()
    resolved = page.locator("#alerts-resolved")
    expect(resolved).to_be_visible()
    assert resolved.locator("li").count() == 1 and not resolved.evaluate("(node) => node.open")
    resolved.locator("summary").click()
    assert f"Run {key} is hung" in resolved.locator("li").inner_text()
    assert page.locator("#ranks-table tr.lagging").count() == 0
    assert errors == [], errors
    page.close()


def test_the_hung_view_of_1024_ranks_scrolls_inside_its_card(
    browser: Any, alerting_server: LiveServer, output_dir: Path
) -> None:
    world, lagging = 1024, (700, 901)
    key = f"hung1024-{uuid.uuid4().hex[:8]}"
    with alerting_server.client() as client:
        register(client, key, world, "hung-1024", lambda r: f"gpu-node-{r // 8:03d}")
        send_steps(client, key, world, 0, range(4))
        reports: dict[int, dict[str, Any]] = {}
        for r in range(world):
            if r in lagging:
                reports[r] = {"step": 4, "in_step": True, "elapsed_s": 95.5, "op": None}
            elif r % 16 == 5:
                continue  # no report (yet) from these: most, not all, ranks have one
            elif r % 2:
                reports[r] = {"step": 4, "in_step": True, "elapsed_s": 94, "op": op("all_reduce", None, None, "dp", 93)}
            else:
                reports[r] = {"step": 4, "in_step": True, "elapsed_s": 94, "op": op("recv", "fwd", 700, "pp", 92)}
        send_in_flight(client, key, reports, 1)
        # while the reports come in, the rules may first blame rank 700 alone (the one the first reports wait on)
        alert = wait_for_alert(client, key, "BubblescopeRunHung", only=lambda a: "rank" not in a["labels"])
        assert "Lagging: rank 700 " in alert["annotations"]["description"]  # several lagging: the alert names none
        firing = client.get("/api/v1/alerts", params={"run": key, "state": "firing"}).json()["alerts"]
        assert [a["id"] for a in firing] == [alert["id"]], firing

    for width in WIDTHS:
        page, errors = new_page(browser, width)
        page.goto(f"{alerting_server.url}/runs/{key}?view=hung#ranks")
        page.wait_for_selector(f"body[data-alerts-firing='1'][data-ranks-shown='{world}']", timeout=20_000)
        rows = page.locator("#ranks-table tbody tr")
        assert rows.count() == world
        assert [rows.nth(i).get_attribute("data-rank") for i in range(3)] == ["700", "901", "0"]
        assert page.locator("#ranks-table tr.lagging").count() == 2
        assert "recv 'fwd' from rank 700 on pp for" in rows.nth(2).locator("td.doing").inner_text()
        box = page.evaluate(
            "() => { const s = document.querySelector('#ranks .ranks-scroll');"
            " return [s.scrollHeight, s.clientHeight, document.getElementById('ranks').getBoundingClientRect().height]; }"
        )
        assert box[0] > 10 * box[1] and box[2] < 600, box  # the rows scroll inside a card of bounded height
        page.wait_for_selector("body[data-drawn][data-stragglers-steps='4']", timeout=30_000)
        assert page.evaluate("() => window.scrollY") > 0 and in_view(page, "#ranks")
        page.screenshot(path=str(output_dir / f"alerts-hung-1024-{width}.png"))
        # a round updates the rows in place: the same row elements, their durations brought up to date
        page.evaluate("() => { window.__row = document.querySelector(\"#ranks-table tr[data-rank='0']\"); }")
        for _ in range(2):
            with page.expect_request(lambda r: r.url.endswith(f"/api/v1/runs/{key}?ranks_limit=1024"), timeout=15_000):
                pass
        page.wait_for_timeout(500)  # the round's answer rendered
        assert page.evaluate(
            "() => window.__row.isConnected && window.__row === document.querySelector(\"#ranks-table tr[data-rank='0']\")"
        )
        page.evaluate("() => window.scrollTo(0, 0)")
        page.screenshot(path=str(output_dir / f"alerts-hung-1024-top-{width}.png"))
        assert errors == [], errors
        page.close()

    for width in WIDTHS:  # the run list of every run of this module: failed, hung, resolved, healthy
        page, errors = new_page(browser, width, 700)
        page.goto(f"{alerting_server.url}/")
        row = page.locator(f"#runs tbody tr[data-run='{key}']")
        expect(row.locator(".alert-count")).to_have_text("1", timeout=15_000)
        assert row.locator("a.alert-link").get_attribute("href") == f"/runs/{key}?view=hung#ranks"
        page.screenshot(path=str(output_dir / f"alerts-run-list-all-{width}.png"), full_page=True)
        assert errors == [], errors
        page.close()
