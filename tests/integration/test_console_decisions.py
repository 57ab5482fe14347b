"""A lever answers back, on a real Postgres: one on a saga that does not exist is refused at once and nothing is
queued; one that is queued is decided by the orchestrator's service (which takes the queued command as its
consumer would) and the API and the page say what it decided: applied and what followed, refused and why, or
dead-lettered because the saga is quarantined."""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import pytest_asyncio

from saga_orchestrator.console.app import console_app
from saga_orchestrator.console.identity import add_user
from saga_orchestrator.infra.db import create_pool
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.orchestrator.bootstrap import prepare
from saga_orchestrator.orchestrator.domain.builder import TimerKind
from saga_orchestrator.orchestrator.domain.definition import DefinitionRegistry
from saga_orchestrator.orchestrator.inbound import RecordParser
from saga_orchestrator.orchestrator.outbound import summary_of
from saga_orchestrator.orchestrator.ports import StoredEvent, Writes
from saga_orchestrator.orchestrator.service import SagaService
from saga_orchestrator.orchestrator.store.postgres import PostgresStore, migrate
from saga_orchestrator.participants.trip.definition import TRIP, trip_definitions
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.records import ConsumedRecord
from saga_orchestrator.schemas.registry import default_registry
from saga_orchestrator.schemas.topics import Topics
from saga_orchestrator.testing.history import SagaRun

pytestmark = pytest.mark.integration
SIGNED = {"Authorization": "Basic " + base64.b64encode(b"anna:a long password").decode()}


def _runs(suffix: str) -> list[SagaRun]:
    now = time.time_ns() // 1_000_000
    waiting = SagaRun(TRIP, saga_id=f"decide-waiting-{suffix}", now=now - 60_000)
    waiting.start()
    waiting.ok("book_flight")
    waiting.fail("book_hotel", "HotelBusy", retryable=True)
    waiting.fire(TimerKind.STEP_RETRY, "book_hotel")
    waiting.fail("book_hotel", "HotelBusy", retryable=True)
    stuck = SagaRun(TRIP, saga_id=f"decide-unfolded-{suffix}", now=now - 60_000)
    stuck.start()
    stuck.ok("book_flight")
    return [waiting, stuck]


@pytest_asyncio.fixture(loop_scope="module")
async def pool(settings: Settings) -> AsyncIterator[asyncpg.Pool]:
    await prepare(settings)
    found = await create_pool(settings.dsn(), 2)
    await migrate(found)
    yield found
    await found.close()


@pytest_asyncio.fixture(loop_scope="module")
async def runs(pool: asyncpg.Pool) -> dict[str, SagaRun]:
    recorded = _runs(str(time.time_ns()))
    async with PostgresStore(pool).begin() as uow:
        await uow.write(Writes(
            events=[StoredEvent(saga_id=e.saga_id, seq=e.seq, event_type=type(e).__name__, body=wire.encode_event(e),
                                recorded_at_ms=e.occurred_at) for run in recorded for e in run.events],
            summaries=[summary_of(run.saga) for run in recorded]))
    return {run.saga_id.rsplit("-", 1)[0]: run for run in recorded}


@pytest_asyncio.fixture(loop_scope="module")
async def client(settings: Settings, runs: dict[str, SagaRun], tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    users = tmp_path / "users"
    add_user(users, "anna", "a long password")
    app = console_app(settings.model_copy(update={"saga_console_levers": True, "saga_console_users": str(users)}))
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://console", headers=SIGNED) as found:
        yield found


async def _take(pool: asyncpg.Pool, settings: Settings, saga_id: str,
                definitions: DefinitionRegistry | None = None) -> None:
    """The orchestrator's service takes the commands queued for ``saga_id`` on saga.control, as its consumer
    would (parsed from the record the relay publishes), and the rows leave the outbox as the relay's do."""
    topics = Topics(settings.saga_topic_prefix)
    rows = await pool.fetch("DELETE FROM saga.outbox WHERE topic = $1 AND message_key = $2"
                            " RETURNING id, value, headers::text AS headers", topics.control, saga_id)
    registry = definitions if definitions is not None else trip_definitions()
    parser = RecordParser(topics, registry, default_registry(), ())
    service = SagaService(PostgresStore(pool), registry, topics, lambda: time.time_ns() // 1_000_000)
    for row in sorted(rows, key=lambda r: r["id"]):
        headers = tuple((name, value.encode()) for name, value in json.loads(row["headers"]).items())
        await service.handle(parser.parse(ConsumedRecord(topic=topics.control, key=saga_id.encode(),
                                                         value=bytes(row["value"]), headers=headers)))


async def _pull(client: httpx.AsyncClient, saga_id: str, **lever: Any) -> dict[str, Any]:
    sent = await client.post(f"/api/v1/sagas/{saga_id}/actions", json=lever)
    assert sent.status_code == 202, sent.text
    answer: dict[str, Any] = sent.json()
    return answer


async def _decision(client: httpx.AsyncClient, sent: dict[str, Any]) -> dict[str, Any]:
    answer = await client.get(sent["decision_url"])
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()
    return found


@pytest.mark.asyncio(loop_scope="module")
async def test_a_lever_on_a_saga_that_does_not_exist_is_refused_and_nothing_queued(
        client: httpx.AsyncClient, pool: asyncpg.Pool) -> None:
    refused = await client.post("/api/v1/sagas/decide-nobody/actions", json={"action": "Pause"})
    assert refused.status_code == 404 and "no saga 'decide-nobody'" in refused.json()["detail"]
    page = await client.post("/sagas/decide-nobody/actions", data={"action": "Pause"}, headers={"HX-Request": "true"})
    assert page.status_code == 200 and 'class="flash error"' in page.text and "no saga" in page.text
    assert await pool.fetchval("SELECT count(*) FROM saga.outbox WHERE message_key = 'decide-nobody'") == 0
    audit = (await client.get("/api/v1/audit")).json()
    assert (audit[0]["action"], audit[0]["target"]) == ("Pause", "saga decide-nobody")
    assert audit[0]["outcome"].startswith("refused: no saga")


@pytest.mark.asyncio(loop_scope="module")
async def test_the_decision_answers_back_applied_then_refused(
        client: httpx.AsyncClient, pool: asyncpg.Pool, settings: Settings, runs: dict[str, SagaRun]) -> None:
    saga_id = runs["decide-waiting"].saga_id
    shown = (await client.get(f"/sagas/{saga_id}")).text  # a destructive lever asks first, saying what it undoes
    card = shown.split('data-pending="book_hotel">', 1)[1].split("</div>", 1)[0]  # the step it waits on
    assert "at hotel" in card and "attempt 3" in card and "last error: <span class=\"error\">HotelBusy" in card
    cancel = shown.split('data-action="Cancel"', 1)[1].split(">", 1)[0]
    assert "Undone: book_flight. Not undone (no undo): none." in cancel and "hx-confirm" in cancel
    sent = await _pull(client, saga_id, action="Pause")
    assert sent["decision"]["outcome"] == "queued" and not sent["decision"]["decided"]
    assert sent["after_seq"] == runs["decide-waiting"].events[-1].seq
    await _take(pool, settings, saga_id)
    applied = await _decision(client, sent)
    assert applied["outcome"] == "applied" and applied["seq"] == sent["after_seq"] + 1, applied
    assert applied["said"].startswith("Pause applied")

    again = await _pull(client, saga_id, action="Pause")  # already paused: refused, and why
    await _take(pool, settings, saga_id)
    refused = await _decision(client, again)
    assert refused["outcome"] == "refused" and "paused" in refused["reason"], refused
    # The page's flash asks until it is decided, then says so.
    page = await client.post(f"/sagas/{saga_id}/actions", data={"action": "Unpause"}, headers={"HX-Request": "true"})
    assert 'data-outcome="queued"' in page.text and "hx-get=\"/lever-decision?" in page.text
    await _take(pool, settings, saga_id)
    asked = page.text.split('hx-get="', 1)[1].split('"', 1)[0].replace("&amp;", "&")
    flash = await client.get(asked)
    assert 'data-outcome="applied"' in flash.text and "Unpause applied" in flash.text and "hx-get" not in flash.text


@pytest.mark.asyncio(loop_scope="module")
async def test_a_lever_dead_lettered_by_a_quarantine_says_refused_and_why(
        client: httpx.AsyncClient, pool: asyncpg.Pool, settings: Settings, runs: dict[str, SagaRun]) -> None:
    saga_id = runs["decide-unfolded"].saga_id
    gone = DefinitionRegistry()  # the orchestrator no longer has the saga's definition: it quarantines the saga
    first = await _pull(client, saga_id, action="Pause")
    await _take(pool, settings, saga_id, gone)
    quarantined = await _decision(client, first)
    assert quarantined["outcome"] == "refused" and "quarantined" in quarantined["reason"], quarantined
    release = await _pull(client, saga_id, action="Release", reason="tried before the fix")
    await _take(pool, settings, saga_id, gone)  # a release before the fix: dead-lettered
    refused = await _decision(client, release)
    assert refused["outcome"] == "refused" and "release it again" in refused["reason"], refused
    page = await client.get(f"/lever-decision?saga_id={saga_id}&action_id={release['action_id']}&action=Release"
                            f"&after_seq={release['after_seq']}")
    assert 'class="flash error"' in page.text and "Release refused: dead-lettered" in page.text


@pytest.mark.asyncio(loop_scope="module")
async def test_a_bulk_job_from_the_page_starts_only_on_the_count_seen(client: httpx.AsyncClient) -> None:
    form = {"saga_type": "trip", "statuses": "COMPENSATION_FAILED", "action": "Terminate", "reason": "refunded by hand"}
    uncounted = await client.post("/bulk/start", data=form)
    assert 'class="flash error"' in uncounted.text and "count the sagas first" in uncounted.text
    counted = await client.post("/bulk/count", data=form)
    total = int(counted.text.split('data-count="', 1)[1].split('"', 1)[0])
    assert f'name="expected" value="{total}"' in counted.text
    stale = await client.post("/bulk/start", data={**form, "expected": str(total + 1)})
    assert f"matches {total} sagas now, not the {total + 1} counted" in stale.text
    for saga_id in re.findall(r'<a class="saga" href="/sagas/([^"]+)">', counted.text):
        assert (await client.get(f"/sagas/{saga_id}")).status_code == 200, saga_id  # the count's ids are links


@pytest.mark.asyncio(loop_scope="module")
async def test_a_bulk_job_by_the_api_starts_only_on_the_count_given_back(
        client: httpx.AsyncClient, runs: dict[str, SagaRun]) -> None:
    saga_id = runs["decide-waiting"].saga_id
    selection = {"saga_type": "trip", "statuses": ["RUNNING"], "tenant": None}
    job = {**selection, "action": "Pause", "reason": "maintenance", "rate_per_s": 1}
    uncounted = await client.post("/api/v1/bulk/jobs", json=job)
    assert uncounted.status_code == 422 and "count the sagas first" in uncounted.json()["detail"], uncounted.text
    counted = await client.post("/api/v1/bulk/count", json=selection)
    assert counted.status_code == 200 and saga_id in counted.json()["sample"], counted.text
    total = counted.json()["total"]
    stale = await client.post("/api/v1/bulk/jobs", json={**job, "expected": total + 1})
    assert stale.status_code == 409 and "count again" in stale.json()["detail"], stale.text
    started = await client.post("/api/v1/bulk/jobs", json={**job, "expected": total})
    assert started.status_code == 201 and started.json()["total"] == total, started.text
    cancelled = await client.post(f"/api/v1/bulk/jobs/{started.json()['id']}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    refusals = [e["outcome"] for e in (await client.get("/api/v1/audit")).json() if e["action"] == "BulkJob Pause"]
    assert any("count the sagas first" in outcome for outcome in refusals), refusals
