"""In Chromium: a page on another port of the same host (same site, another origin) tries to pull a lever
as the signed-in operator with a form post and a fetch, and to frame the console. Both changes are refused
and change nothing; the console's own page, in the same browser session, acts."""

from __future__ import annotations

import asyncio
import http.server
import threading
from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest
from playwright.async_api import Browser, Page

from saga_orchestrator.infra.settings import Settings
from tests.browser.conftest import serve_console, signed_in_page
from tests.integration.recorded import running_trip

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def lone_console(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``saga console`` alone on the module's database: no saga has to run for a lever to be queued."""
    yield from serve_console(settings, tmp_path_factory.mktemp("console"))


@pytest.fixture(scope="module")
def targets(settings: Settings) -> dict[str, str]:
    """Running trips to pull the levers on, by the way they are pulled: each exists, so only the guard can refuse
    a lever on it (a lever on an id no saga has is refused anyway)."""
    return {way: asyncio.run(running_trip(settings, f"csrf-{way}")) for way in ("form", "fetch", "own")}


@pytest.fixture(scope="module")
def other_origin(lone_console: str, targets: dict[str, str]) -> Iterator[str]:
    """A page on another port of 127.0.0.1 that posts a lever to the console, fetches one, and frames it."""
    page = f"""<!doctype html><title>elsewhere</title>
<form id="f" method="post" action="{lone_console}/sagas/{targets["form"]}/actions">
<input name="action" value="Pause"><input name="reason" value="from elsewhere"></form>
<iframe id="framed" src="{lone_console}/login"></iframe>
<script>
fetch("{lone_console}/sagas/{targets["fetch"]}/actions", {{method: "POST", credentials: "include", mode: "no-cors",
      body: new URLSearchParams({{action: "Pause", reason: "fetched from elsewhere"}})}})
  .finally(() => {{ document.title = "fetched"; }});
</script>""".encode()

    class Elsewhere(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Elsewhere)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()


@pytest.fixture
async def signed_in(browser: Browser, lone_console: str) -> AsyncIterator[Page]:
    async for page in signed_in_page(browser, lone_console):
        yield page


async def _counts(settings: Settings, saga_id: str) -> tuple[int, int]:
    conn = await asyncpg.connect(settings.dsn())
    try:
        queued = await conn.fetchval("SELECT count(*) FROM saga.outbox WHERE message_key = $1", saga_id)
        audited = await conn.fetchval("SELECT count(*) FROM saga.operator_audit WHERE target = $1", f"saga {saga_id}")
    finally:
        await conn.close()
    return queued, audited


async def test_another_origin_of_the_same_host_cannot_act_or_frame_the_console(
        signed_in: Page, lone_console: str, other_origin: str, settings: Settings, targets: dict[str, str]) -> None:
    elsewhere = await signed_in.context.new_page()
    await elsewhere.goto(other_origin)
    await elsewhere.wait_for_function("document.title === 'fetched'")
    framed = next(frame for frame in elsewhere.frames if frame != elsewhere.main_frame)
    assert await framed.query_selector("form.login") is None  # Chromium refused to draw the console in a frame
    async with elsewhere.expect_navigation():
        await elsewhere.evaluate("document.getElementById('f').submit()")
    assert "refused" in await elsewhere.content()
    assert await _counts(settings, targets["form"]) == (0, 0)
    assert await _counts(settings, targets["fetch"]) == (0, 0)

    # The same session from the console's own page: its token and origin pass.
    await signed_in.goto(f"{lone_console}/audit")
    status = await signed_in.evaluate("""async (sagaId) => {
        const token = document.querySelector("input[name=csrf_token]").value;
        const answer = await fetch(`/sagas/${sagaId}/actions`, {method: "POST", headers: {"HX-Request": "true"},
            body: new URLSearchParams({action: "Pause", reason: "from the console", csrf_token: token})});
        return answer.status; }""", targets["own"])
    assert status == 200  # the flash htmx shows
    assert await _counts(settings, targets["own"]) == (1, 1)
