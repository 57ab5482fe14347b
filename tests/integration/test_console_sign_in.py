"""The console's sign-in and its guard on a real Postgres: sessions that end at sign-out, throttled guessing,
an on-site redirect, security headers, and malformed input answered 4xx with nothing audited or queued."""

from __future__ import annotations

import base64
import itertools
import re
from collections.abc import AsyncIterator
from html import unescape
from urllib.parse import quote, unquote

import httpx
import pytest
import pytest_asyncio
from fastapi import FastAPI

from saga_orchestrator.console.app import console_app
from saga_orchestrator.console.identity import add_user
from saga_orchestrator.console.pages import SESSION_ENDED
from saga_orchestrator.console.throttle import PAIR_FAILURES
from saga_orchestrator.infra.db import create_pool
from saga_orchestrator.infra.settings import Settings
from tests.integration.recorded import running_trip

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

NAME, PASSWORD = "anna", "a long enough password"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[FastAPI]:
    """One console for the module (levers on, one login); each test comes from addresses of its own, so one
    test's failed sign-ins do not throttle another's."""
    users = tmp_path_factory.mktemp("users") / "users"
    add_user(users, NAME, PASSWORD)
    app = console_app(settings.model_copy(update={"saga_console_levers": True, "saga_console_users": str(users)}))
    async with app.router.lifespan_context(app):
        yield app


_addresses = itertools.count(1)


def _client_of(app: FastAPI) -> httpx.AsyncClient:
    address = f"10.0.{next(_addresses)}.7"
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=(address, 50000)),
                             base_url="http://console")


@pytest_asyncio.fixture(loop_scope="module")
async def console(served: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with _client_of(served) as client:
        yield client


async def _sign_in(client: httpx.AsyncClient, password: str = PASSWORD, next_path: str = "/") -> httpx.Response:
    return await client.post("/login", data={"name": NAME, "password": password, "next": next_path})


def _csrf(page: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert found, page
    return found.group(1)


async def test_a_cookie_kept_from_before_sign_out_reads_nothing(console: httpx.AsyncClient) -> None:
    signed_in = await _sign_in(console)
    assert signed_in.status_code == 303 and signed_in.headers["location"] == "/"
    cookie = signed_in.cookies["saga_console"]
    assert "httponly" in signed_in.headers["set-cookie"].lower()
    assert "samesite=strict" in signed_in.headers["set-cookie"].lower()
    assert (await console.get("/api/v1/sagas")).status_code == 200
    page = await console.get("/audit")
    assert page.status_code == 200 and NAME in page.text
    out = await console.post("/logout", data={"csrf_token": _csrf(page.text)})
    assert out.status_code == 303
    console.cookies.clear()
    console.cookies.set("saga_console", cookie)  # the cookie saved before signing out
    assert (await console.get("/api/v1/sagas")).status_code == 401
    again = await console.get("/audit")
    assert again.status_code == 303 and again.headers["location"].startswith("/login")
    console.cookies.clear()


async def test_sign_out_needs_the_pages_token(console: httpx.AsyncClient) -> None:
    await _sign_in(console)
    refused = await console.post("/logout")
    assert refused.status_code == 403
    assert (await console.get("/api/v1/sagas")).status_code == 200  # still signed in
    console.cookies.clear()


async def test_a_change_from_another_origin_of_the_same_host_is_refused(console: httpx.AsyncClient,
                                                                        settings: Settings) -> None:
    saga_id = await running_trip(settings, "guard")  # a saga that exists: only the guard can refuse the lever
    await _sign_in(console)
    page = await console.get("/audit")
    token = _csrf(page.text)
    from_elsewhere = await console.post(f"/sagas/{saga_id}/actions", data={"action": "Pause", "csrf_token": token},
                                        headers={"Origin": "http://console:9000", "Sec-Fetch-Site": "same-site"})
    without_token = await console.post(f"/sagas/{saga_id}/actions", data={"action": "Pause"})
    own = await console.post(f"/sagas/{saga_id}/actions", data={"action": "Pause", "reason": "", "csrf_token": token},
                             headers={"Origin": "http://console", "Sec-Fetch-Site": "same-origin"})
    console.cookies.clear()
    assert (from_elsewhere.status_code, without_token.status_code, own.status_code) == (403, 403, 303)
    pool = await create_pool(settings.dsn(), 1)
    try:
        queued = await pool.fetchval("SELECT count(*) FROM saga.outbox WHERE message_key = $1", saga_id)
        audited = await pool.fetchval("SELECT count(*) FROM saga.operator_audit WHERE target = $1", f"saga {saga_id}")
    finally:
        await pool.close()
    assert (queued, audited) == (1, 1)  # the console's own page only


async def test_guessing_is_throttled_even_for_the_right_password_then(console: httpx.AsyncClient,
                                                                      served: FastAPI) -> None:
    for _ in range(PAIR_FAILURES):
        wrong = await _sign_in(console, "guess")
        assert "not accepted" in unquote(wrong.headers["location"])
    locked = await _sign_in(console, PASSWORD)
    assert "too many failed sign-ins" in unquote(locked.headers["location"]) and "saga_console" not in locked.cookies
    basic = {"Authorization": "Basic " + base64.b64encode(f"{NAME}:{PASSWORD}".encode()).decode()}
    api = await console.get("/api/v1/sagas", headers=basic)
    assert api.status_code == 429 and int(api.headers["retry-after"]) > 0
    async with _client_of(served) as from_her_desk:
        assert (await from_her_desk.get("/api/v1/sagas", headers=basic)).status_code == 200


async def test_the_redirect_after_sign_in_stays_on_site(console: httpx.AsyncClient) -> None:
    for asked in ("//evil.example/x", "https://evil.example", "/\\evil.example"):
        answer = await console.post("/login", data={"name": "bob", "password": "x", "next": asked})
        assert "evil.example" not in answer.headers["location"].split("next=")[0]
        page = await console.get("/login", params={"next": asked})
        assert 'name="next" value="/"' in page.text


async def test_the_sign_in_leads_back_to_a_saga_whose_id_holds_a_slash(served: FastAPI) -> None:
    saga_path = "/sagas/r%C3%A9s%2F%C3%BCm%C3%A9%201"  # the saga rés/ümé 1
    async with _client_of(served) as client:
        asked = await client.get(saga_path)
        assert asked.status_code == 303, asked.text
        login = await client.get(asked.headers["location"])
        found = re.search(r'name="next" value="([^"]+)"', login.text)
        assert found is not None, login.text
        signed = await _sign_in(client, next_path=unescape(found.group(1)))
        assert signed.headers["location"] == saga_path


PLACE = "/sagas?status=RUNNING&saga_type=trip"


async def test_the_sign_in_leads_back_to_the_page_with_its_query(console: httpx.AsyncClient) -> None:
    sent = await console.get(PLACE)
    assert sent.status_code == 303 and sent.headers["location"] == f"/login?next={quote(PLACE, safe='')}"
    page = await console.get(sent.headers["location"])
    assert f'name="next" value="{PLACE.replace("&", "&amp;")}"' in page.text and "session ended" not in page.text
    signed_in = await _sign_in(console, next_path=PLACE)
    assert signed_in.status_code == 303 and signed_in.headers["location"] == PLACE
    console.cookies.clear()
    refused = await console.post("/login", data={"name": NAME, "password": "wrong", "next": PLACE})
    assert unquote(refused.headers["location"]).endswith(f"next={PLACE}")  # the next try leads back there too


async def _ended_session(console: httpx.AsyncClient) -> None:
    """Signs in, then the session ends (signed out elsewhere) while the browser keeps its cookie."""
    cookie = (await _sign_in(console)).cookies["saga_console"]
    page = await console.get("/audit")
    await console.post("/logout", data={"csrf_token": _csrf(page.text)})
    console.cookies.set("saga_console", cookie)


async def test_a_page_that_meets_an_ended_session_says_so_and_keeps_the_place(console: httpx.AsyncClient) -> None:
    await _ended_session(console)
    sent = await console.get(PLACE)
    assert sent.status_code == 303
    assert sent.headers["location"] == f"/login?flash={quote(SESSION_ENDED)}&next={quote(PLACE, safe='')}"
    page = await console.get(sent.headers["location"])
    assert SESSION_ENDED in page.text and f'value="{PLACE.replace("&", "&amp;")}"' in page.text
    console.cookies.clear()


async def test_htmx_from_a_page_whose_session_ended_sends_the_whole_page_to_the_login(
        console: httpx.AsyncClient) -> None:
    await _ended_session(console)
    htmx = {"HX-Request": "true", "HX-Current-URL": f"http://console{PLACE}"}
    wanted = f"/login?flash={quote(SESSION_ENDED)}&next={quote(PLACE, safe='')}"
    fragment = await console.get("/fleet/body", headers=htmx)
    assert (fragment.status_code, fragment.headers.get("hx-redirect")) == (401, wanted)
    lever = await console.post("/sagas/ended-t1/actions", data={"action": "Pause", "reason": ""},
                               headers={**htmx, "Origin": "http://console", "Sec-Fetch-Site": "same-origin"})
    assert (lever.status_code, lever.headers.get("hx-redirect")) == (401, wanted)
    elsewhere = await console.get("/fleet/body", headers={**htmx, "HX-Current-URL": "https://evil.example//x"})
    assert elsewhere.headers["hx-redirect"].endswith("next=%2F")  # a place off the console leads to its start
    console.cookies.clear()


async def test_no_page_may_be_framed(console: httpx.AsyncClient) -> None:
    for path in ("/login", "/api/v1/sagas", "/static/console.css"):
        answer = await console.get(path)
        assert answer.headers["content-security-policy"] == "frame-ancestors 'none'", path
        assert answer.headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize(("method", "path", "body", "status"), [
    ("GET", "/search?q=a%00b", None, 400),
    ("GET", "/api/v1/search?q=a%00b", None, 400),
    ("GET", "/api/v1/sagas/a%00b", None, 400),
    ("GET", "/api/v1/sagas/x/history?after_seq=99999999999999999999", None, 400),
    ("GET", "/api/v1/bulk/jobs/99999999999999999999", None, 400),
    ("GET", "/api/v1/sagas?older_than_s=inf", None, 400),
    ("GET", "/api/v1/sagas?older_than_s=nan", None, 400),
    ("POST", "/api/v1/sagas/guard-t2/actions", {"action": "Terminate", "reason": "a\u0000b"}, 400),
    ("POST", "/api/v1/sagas/guard-t2/actions", {"action": "Terminate", "reason": "x" * 2_000_000}, 413),
    ("POST", "/api/v1/bulk/count", {"saga_type": "trip", "older_than_s": 1e300}, 400),
])
async def test_malformed_input_is_4xx_and_nothing_is_audited_or_queued(
        console: httpx.AsyncClient, settings: Settings, method: str, path: str, body: object, status: int) -> None:
    basic = {"Authorization": "Basic " + base64.b64encode(f"{NAME}:{PASSWORD}".encode()).decode()}
    answer = await console.request(method, path, json=body, headers=basic)
    assert answer.status_code == status, answer.text
    pool = await create_pool(settings.dsn(), 1)
    try:
        queued = await pool.fetchval("SELECT count(*) FROM saga.outbox WHERE message_key = 'guard-t2'")
        audited = await pool.fetchval("SELECT count(*) FROM saga.operator_audit WHERE target = 'saga guard-t2'")
    finally:
        await pool.close()
    assert (queued, audited) == (0, 0)


async def test_a_bulk_job_that_does_not_exist_is_not_found_and_one_that_ended_is_refused(
        console: httpx.AsyncClient, settings: Settings) -> None:
    basic = {"Authorization": "Basic " + base64.b64encode(f"{NAME}:{PASSWORD}".encode()).decode()}
    missing = await console.post("/api/v1/bulk/jobs/424242/cancel", headers=basic)
    assert missing.status_code == 404 and "no bulk job 424242" in missing.text
    pool = await create_pool(settings.dsn(), 1)
    try:
        ended = await pool.fetchval(
            "INSERT INTO saga.bulk_jobs (operator, reason, action, selection, rate_per_s, status, total)"
            " VALUES ('anna', 'ended', 'Pause', '{}', 1, 'DONE', 0) RETURNING id")
    finally:
        await pool.close()
    refused = await console.post(f"/api/v1/bulk/jobs/{ended}/cancel", headers=basic)
    assert refused.status_code == 400 and "already ended DONE" in refused.text
