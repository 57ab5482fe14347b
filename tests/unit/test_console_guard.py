"""The console's guard on a small app (no database): malformed input, cross-origin changes, the CSRF token of
a session, the security headers; the sign-in throttle and the on-site redirect, pure."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from saga_orchestrator.console.guard import MAX_BODY, Caller, Guard, Scope, WhoAsks
from saga_orchestrator.console.pages import on_site
from saga_orchestrator.console.throttle import ADDRESS_FAILURES, LOCK_S, PAIR_FAILURES, WINDOW_S, SignInThrottle

CSRF = "the-session-token-for-forms"
changed: list[str] = []


async def _change(request: Request) -> PlainTextResponse:
    form = await request.form()
    changed.append(str(form.get("reason", "")))
    return PlainTextResponse(f"changed for {request.state.caller.operator}")


async def _read(request: Request) -> PlainTextResponse:
    return PlainTextResponse("read")


def _who(scope: Scope) -> WhoAsks:
    async def who(headers: Headers, token: str | None, address: str) -> Caller:
        return Caller("anna", token, CSRF) if token == "live" else Caller(None)
    return who


def _client(**headers: str) -> httpx.AsyncClient:
    app = Starlette(routes=[Route("/change", _change, methods=["POST"]), Route("/read", _read)])
    guarded = Guard(app, who_asks=_who, cookie="saga_console")
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=guarded), base_url="http://console:8089",
                             headers=headers, cookies={"saga_console": "live"})


@pytest.fixture(autouse=True)
def _nothing_changed_yet() -> None:
    changed.clear()


async def test_a_change_with_the_sessions_token_passes_and_every_answer_refuses_framing() -> None:
    async with _client() as client:
        answer = await client.post("/change", data={"reason": "ok", "csrf_token": CSRF})
        by_header = await client.post("/change", data={"reason": "htmx"}, headers={"X-CSRF-Token": CSRF})
    assert (answer.status_code, answer.text, by_header.status_code) == (200, "changed for anna", 200)
    assert changed == ["ok", "htmx"]
    assert answer.headers["content-security-policy"] == "frame-ancestors 'none'"
    assert answer.headers["x-frame-options"] == "DENY" and answer.headers["x-content-type-options"] == "nosniff"
    assert answer.headers["referrer-policy"] == "same-origin"


@pytest.mark.parametrize(("headers", "data"), [
    ({}, {"reason": "no token"}),
    ({}, {"reason": "wrong token", "csrf_token": "guessed"}),
    ({"Origin": "http://console:9999", "X-CSRF-Token": CSRF}, {"reason": "another port of the same host"}),
    ({"Origin": "null", "X-CSRF-Token": CSRF}, {"reason": "a sandboxed frame"}),
    ({"Sec-Fetch-Site": "same-site", "X-CSRF-Token": CSRF}, {"reason": "same site, other origin"}),
    ({"Sec-Fetch-Site": "cross-site", "X-CSRF-Token": CSRF}, {"reason": "another site"}),
])
async def test_a_change_from_elsewhere_is_refused_and_changes_nothing(headers: dict[str, str],
                                                                      data: dict[str, str]) -> None:
    async with _client() as client:
        answer = await client.post("/change", data=data, headers=headers)
        read = await client.get("/read", headers=headers)  # reading is not a change: a link from elsewhere works
    assert answer.status_code == 403, answer.text
    assert read.status_code == 200
    assert changed == []


async def test_the_consoles_own_origin_passes() -> None:
    async with _client(Origin="http://console:8089", **{"Sec-Fetch-Site": "same-origin"}) as client:
        answer = await client.post("/change", data={"reason": "own page", "csrf_token": CSRF})
    assert answer.status_code == 200 and changed == ["own page"]


@pytest.mark.parametrize(("path", "kwargs", "status"), [
    ("/read?q=a%00b", {}, 400),
    ("/read/a%00b", {}, 400),
    ("/change", {"data": {"reason": "a\x00b", "csrf_token": CSRF}}, 400),
    ("/change", {"content": b'{"reason": "a\\u0000b"}', "headers": {"Content-Type": "application/json",
                                                                      "X-CSRF-Token": CSRF}}, 400),
    ("/change", {"data": {"reason": "x" * (2 * 1024 * 1024), "csrf_token": CSRF}}, 413),
])
async def test_malformed_input_is_answered_4xx_and_changes_nothing(path: str, kwargs: dict[str, Any],
                                                                    status: int) -> None:
    method = "POST" if path == "/change" else "GET"
    async with _client() as client:
        answer = await client.request(method, path, **kwargs)
    assert answer.status_code == status, answer.text
    assert changed == []


async def test_a_body_just_under_the_limit_passes() -> None:
    async with _client() as client:
        answer = await client.post("/change", data={"reason": "x" * (MAX_BODY - 200), "csrf_token": CSRF})
    assert answer.status_code == 200


@pytest.mark.parametrize(("asked", "kept"), [
    ("/sagas/t-1", "/sagas/t-1"), ("/", "/"), ("/sagas?status=RUNNING&type=trip", "/sagas?status=RUNNING&type=trip"),
    ("//evil.example?x=/", "/"), ("//evil.example", "/"), ("/\\evil.example", "/"),
    ("https://evil.example", "/"), ("evil.example", "/"), ("/a\r\nSet-Cookie: x=1", "/"),
])
def test_a_sign_in_sends_nobody_off_site(asked: str, kept: str) -> None:
    assert on_site(asked) == kept


def test_guesses_lock_the_name_from_that_address_only() -> None:
    throttle = SignInThrottle()
    for second in range(PAIR_FAILURES):
        assert throttle.retry_after("anna", "10.0.0.66", float(second)) is None
        throttle.failed("anna", "10.0.0.66", float(second))
    assert throttle.retry_after("anna", "10.0.0.66", 10.0) == pytest.approx(LOCK_S - 6)
    assert throttle.retry_after("anna", "10.0.0.7", 10.0) is None  # anna herself, from her desk
    assert throttle.retry_after("bob", "10.0.0.66", 10.0) is None
    assert throttle.retry_after("anna", "10.0.0.66", PAIR_FAILURES + LOCK_S) is None  # the lock ran out


def test_guesses_at_many_names_lock_the_address() -> None:
    throttle = SignInThrottle()
    for n in range(ADDRESS_FAILURES):
        throttle.failed(f"name-{n}", "10.0.0.66", float(n))
    assert throttle.retry_after("someone-else", "10.0.0.66", float(ADDRESS_FAILURES)) is not None
    assert throttle.retry_after("someone-else", "10.0.0.7", float(ADDRESS_FAILURES)) is None


def test_failures_spread_wider_than_the_window_do_not_lock_and_a_success_starts_afresh() -> None:
    throttle = SignInThrottle()
    for n in range(PAIR_FAILURES):
        throttle.failed("anna", "10.0.0.7", n * (WINDOW_S / (PAIR_FAILURES - 1) + 1))
    assert throttle.retry_after("anna", "10.0.0.7", PAIR_FAILURES * WINDOW_S) is None
    for n in range(PAIR_FAILURES - 1):
        throttle.failed("anna", "10.0.0.7", 10_000.0 + n)
    throttle.succeeded("anna", "10.0.0.7")
    throttle.failed("anna", "10.0.0.7", 10_010.0)
    assert throttle.retry_after("anna", "10.0.0.7", 10_011.0) is None
