"""Signing in to the dashboard in real headless Chromium (Debian's), on ``serve --auth``: without a
session the run list lands on the sign-in page; a read token brings the browser back to the page it
asked for, with the run list shown; the cookie is out of the page's scripts' reach."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from bubblescope.backend.auth.scopes import Scope
from tests.auth.support import Tokens, bearer
from tests.support import LiveServer

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def run_key(auth_server: LiveServer, tokens: Tokens) -> str:
    key = f"signin-{uuid.uuid4().hex[:8]}"
    with auth_server.client() as client:
        answer = client.put(
            f"/api/v1/runs/{key}",
            json={"name": "signed-in view", "world_size": 1},
            headers=bearer(tokens.valid[Scope.INGEST]),
        )
    assert answer.status_code == 200, answer.text
    return key


def sign_in(page: Any, token: str) -> None:
    page.fill("#token", token)
    page.click("#signin-submit")


def test_the_run_list_needs_a_session_and_shows_after_signing_in(
    browser: Any, auth_server: LiveServer, tokens: Tokens, run_key: str, output_dir: Path
) -> None:
    context = browser.new_context()
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(f"{auth_server.url}/")
    page.wait_for_url(f"{auth_server.url}/signin?next=%2F", timeout=15_000)
    assert page.locator(f"a[href='/runs/{run_key}']").count() == 0
    page.screenshot(path=str(output_dir / "signin-page.png"))

    sign_in(page, tokens.valid[Scope.READ])
    page.wait_for_url(f"{auth_server.url}/", timeout=15_000)
    page.wait_for_selector(f"a[href='/runs/{run_key}']", timeout=15_000)
    [cookie] = [c for c in context.cookies() if c["name"] == "bubblescope_session"]
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and not cookie["secure"]
    assert "bubblescope_session" not in page.evaluate("() => document.cookie")  # HttpOnly: no script reads it
    assert errors == []
    context.close()


def test_a_deep_link_comes_back_after_signing_in(
    browser: Any, auth_server: LiveServer, tokens: Tokens, run_key: str
) -> None:
    context = browser.new_context()
    page = context.new_page()
    page.goto(f"{auth_server.url}/runs/{run_key}")
    page.wait_for_url(f"{auth_server.url}/signin?next={quote(f'/runs/{run_key}', safe='')}", timeout=15_000)
    sign_in(page, tokens.valid[Scope.ADMIN])
    page.wait_for_url(f"{auth_server.url}/runs/{run_key}", timeout=15_000)
    context.close()


def test_an_ingest_token_does_not_sign_in_and_signing_out_ends_the_session(
    browser: Any, auth_server: LiveServer, tokens: Tokens
) -> None:
    context = browser.new_context()
    page = context.new_page()
    page.goto(f"{auth_server.url}/signin?next=%2F")
    sign_in(page, tokens.valid[Scope.INGEST])
    page.wait_for_selector("#signin-error:not([hidden])", timeout=10_000)
    assert "has scope 'ingest'" in page.inner_text("#signin-error")
    assert page.url.startswith(f"{auth_server.url}/signin")

    sign_in(page, tokens.valid[Scope.READ])
    page.wait_for_url(f"{auth_server.url}/", timeout=15_000)
    page.goto(f"{auth_server.url}/signin")
    page.click("#signout")
    page.wait_for_selector("#signin-status:not([hidden])", timeout=10_000)
    page.goto(f"{auth_server.url}/")
    page.wait_for_url(re.compile(r".*/signin\?next=%2F$"), timeout=15_000)
    context.close()


def test_next_never_leads_to_another_site(browser: Any, auth_server: LiveServer, tokens: Tokens) -> None:
    context = browser.new_context()
    page = context.new_page()
    for target in ("https://evil.example/phish", "//evil.example/phish"):
        page.goto(f"{auth_server.url}/signin?next={quote(target, safe='')}")
        sign_in(page, tokens.valid[Scope.READ])
        page.wait_for_url(f"{auth_server.url}/", timeout=15_000)
    context.close()


def test_without_javascript_the_token_never_lands_in_the_address(
    browser: Any, auth_server: LiveServer, tokens: Tokens
) -> None:
    """The probe's finding: with JavaScript off (or before the script loads) the form was sent by GET,
    /signin?token=bs_...: browser history and proxy logs. It posts now, and the answer stores nothing."""
    context = browser.new_context(java_script_enabled=False)
    page = context.new_page()
    page.goto(f"{auth_server.url}/signin?next=%2F")
    token = tokens.valid[Scope.READ]
    page.fill("#token", token)
    with page.expect_response(lambda response: response.url.startswith(f"{auth_server.url}/signin")) as posted:
        page.click("#signin-submit")
    answer = posted.value
    assert answer.request.method == "POST" and answer.status == 400
    assert token not in page.url and "token=" not in page.url
    assert "needs JavaScript" in page.content() and token not in page.content()
    assert not [c for c in context.cookies() if c["name"] == "bubblescope_session"]
    context.close()
