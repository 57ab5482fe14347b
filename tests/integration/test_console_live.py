"""One stream per browser for its saga pages (``GET /live``) on a real Postgres and a real HTTP server: one stream
serves two pages, each sent only what it does not show yet, as its own ``watch``; a malformed ask is a 400."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
import uvicorn

from saga_orchestrator.console.app import console_app
from saga_orchestrator.console.pages import MAX_WATCHES
from saga_orchestrator.infra.db import create_pool
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.orchestrator.bootstrap import prepare
from saga_orchestrator.orchestrator.store.postgres import migrate
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.testing.history import SagaRun
from tests.conftest import free_port
from tests.integration.test_console_api import _record

pytestmark = pytest.mark.integration

DONE, GOING = "live/done?#1", "live-going"  # an id that needs encoding in a path, fine in a query


def _runs() -> dict[str, SagaRun]:
    done, going = SagaRun(TRIP, saga_id=DONE), SagaRun(TRIP, saga_id=GOING)
    for run in (done, going):
        run.start()
        run.ok("book_flight")
    for step in ("book_hotel", "charge_card", "send_itinerary"):
        done.ok(step)
    return {DONE: done, GOING: going}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served(settings: Settings) -> AsyncIterator[tuple[str, dict[str, SagaRun]]]:
    """The console served over HTTP on a free port, and the sagas recorded."""
    await prepare(settings)
    pool = await create_pool(settings.dsn(), 2)
    await migrate(pool)
    runs = _runs()
    await _record(pool, runs)
    await pool.close()
    server = uvicorn.Server(uvicorn.Config(console_app(settings), port=(port := free_port()), log_level="warning"))
    serving = asyncio.create_task(server.serve())
    for _ in range(200):  # it answers within 10 s
        if server.started:
            break
        await asyncio.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}", runs
    finally:
        server.should_exit = True
        await serving


async def _updates(lines: AsyncIterator[str], count: int) -> list[dict[str, Any]]:
    """The next ``count`` update events of a stream's ``lines``."""
    found: list[dict[str, Any]] = []
    event = ""
    async for line in lines:
        if line.startswith("event: "):
            event = line.removeprefix("event: ")
        elif line.startswith("data: ") and event == "update":
            found.append(json.loads(line.removeprefix("data: ")))
            if len(found) == count:
                return found
    raise AssertionError(f"the stream ended after {found}")


@pytest.mark.asyncio(loop_scope="module")
async def test_one_stream_serves_two_pages_each_what_it_does_not_show(
        served: tuple[str, dict[str, SagaRun]], settings: Settings) -> None:
    url, runs = served
    done_last, going_last = runs[DONE].events[-1].seq, runs[GOING].events[-1].seq
    shown = 2  # the page of DONE was drawn when it had its first two events
    params = httpx.QueryParams([("watch", "3"), ("saga", DONE), ("after", str(shown)), ("watch", "9"), ("saga", GOING),
              ("after", str(going_last))])
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(5, read=30)) as client, \
            client.stream("GET", "/live", params=params) as stream:
        assert stream.status_code == 200 and stream.headers["content-type"].startswith("text/event-stream")
        lines = stream.aiter_lines()
        [first] = await asyncio.wait_for(_updates(lines, 1), 30)
        assert (first["watch"], first["seq"]) == ("3", done_last)  # the page that shows all of GOING gets nothing
        parts = dict(first["parts"])
        assert {"timeline", "status", "steps", "levers", "timers"} <= set(parts), list(parts)
        # What the page shows is not sent again, but for the retry loop its timeline ended in (the tail: ev-2).
        assert f'id="ev-{shown + 1}"' in parts["timeline"] and 'id="ev-1"' not in parts["timeline"]
        assert "COMPLETED" in parts["status"]
        # GOING moves on: its page, and only its page, is sent the new event.
        runs[GOING].ok("book_hotel")
        pool = await create_pool(settings.dsn(), 1)
        try:
            await _record(pool, {GOING: _only_after(runs[GOING], going_last)})
        finally:
            await pool.close()
        [second] = await asyncio.wait_for(_updates(lines, 1), 30)
        assert (second["watch"], second["seq"]) == ("9", runs[GOING].events[-1].seq)
        assert f'id="ev-{going_last + 1}"' in dict(second["parts"])["timeline"]


def _only_after(run: SagaRun, seq: int) -> SagaRun:
    """``run`` with only its events after ``seq`` (the ones not recorded yet)."""
    run.events[:] = [event for event in run.events if event.seq > seq]
    return run


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(("query", "said"), [
    ("", "name 1 to"),
    ("watch=1&saga=a&after=1&saga=b", "name 1 to"),
    ("watch=1&saga=a&after=one", "a number"),
    ("&".join(f"watch={n}&saga=s{n}&after=0" for n in range(MAX_WATCHES + 1)), "name 1 to"),
])
async def test_a_malformed_ask_is_a_400_naming_the_form(served: tuple[str, dict[str, SagaRun]], query: str,
                                                        said: str) -> None:
    url, _ = served
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        answer = await client.get(f"/live?{query}")
    assert answer.status_code == 400 and said in answer.text, answer.text
