"""The levers of a parked outbox row on a real Postgres: the inbox links them, the Parked page offers them (Discard
asking first), a requeue moves the row back into its outbox under its id and out of the inbox, a discard deletes
it, each is audited with the operator and the reason; an unknown table or id is a 404 that changes nothing, and
nobody acts without an operator or while the levers are off."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from dataclasses import replace
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
from saga_orchestrator.orchestrator.store.operations.reads import PostgresReads
from saga_orchestrator.orchestrator.store.postgres import migrate
from saga_orchestrator.participants.kit.ddl import ensure_participant_schema
from saga_orchestrator.participants.kit.handling import Disposition, handle_command
from tests.integration.conftest import fresh_outbox
from tests.integration.test_participant_deferred import DESK
from tests.integration.test_participants import TOPICS, command, delivered, new_saga_id

pytestmark = pytest.mark.integration
SIGNED = {"Authorization": "Basic " + base64.b64encode(b"petra:a long password").decode()}


async def _park(pool: asyncpg.Pool, outbox: str, key: str, topic: str, reason: str) -> int:
    """A row written into ``outbox``, then parked as the relay parks one the broker refused for good; its id."""
    row_id: int = await pool.fetchval(
        f"INSERT INTO {outbox} (topic, message_key, value, headers, message_id) VALUES ($1, $2, $3, '[]', $4)"
        " RETURNING id", topic, key, b"value of " + key.encode(), f"m-{key}")
    await pool.execute(
        f"WITH moved AS (DELETE FROM {outbox} WHERE id = $1 RETURNING *)"
        f" INSERT INTO {outbox}_parked (id, topic, message_key, value, headers, message_id, available_at,"
        " created_at, shard, reason) SELECT id, topic, message_key, value, headers, message_id, available_at,"
        " created_at, shard, $2 FROM moved", row_id, reason)
    return row_id


@pytest_asyncio.fixture(loop_scope="module")
async def parked(settings: Settings) -> AsyncIterator[tuple[asyncpg.Pool, str, list[int]]]:
    """Two rows parked in an outbox of its own schema (the database is shared): its pool, the outbox, their ids."""
    pool = await create_pool(settings.dsn(), 2)
    await migrate(pool)
    outbox = await fresh_outbox(pool, "parkedlevers")
    ids = [await _park(pool, outbox, "pl-requeued", "flight.commands", "message too large"),
           await _park(pool, outbox, "pl-discarded", "flight.commands", "unknown topic")]
    yield pool, outbox, ids
    await pool.execute(f"DROP SCHEMA {outbox.partition('.')[0]} CASCADE")
    await pool.close()


async def _client(settings: Settings, users: Path | None, levers: bool = True,
                  headers: dict[str, str] | None = None) -> AsyncIterator[httpx.AsyncClient]:
    if users is not None:
        add_user(users, "petra", "a long password")
        settings = settings.model_copy(update={"saga_console_users": str(users)})
    app = console_app(settings.model_copy(update={"saga_console_levers": levers}))
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://console", headers=headers) as client:
        yield client


async def _items(client: httpx.AsyncClient, outbox: str) -> list[dict[str, Any]]:
    answer = await client.get("/api/v1/inbox", params={"kind": "parked", "limit": 500})
    assert answer.status_code == 200, answer.text
    return [item for item in answer.json()["items"] if f" in {outbox}_parked " in item["what"]]


async def _where(pool: asyncpg.Pool, outbox: str, row_id: int) -> tuple[bool, bool]:
    """Whether row ``row_id`` is in the outbox, and whether it is parked."""
    return (bool(await pool.fetchval(f"SELECT count(*) FROM {outbox} WHERE id = $1", row_id)),
            bool(await pool.fetchval(f"SELECT count(*) FROM {outbox}_parked WHERE id = $1", row_id)))


@pytest.mark.asyncio(loop_scope="module")
async def test_an_operator_requeues_and_discards_parked_rows_audited(
        settings: Settings, parked: tuple[asyncpg.Pool, str, list[int]], tmp_path: Path) -> None:
    pool, outbox, (requeued, discarded) = parked
    table = f"{outbox}_parked"
    async for client in _client(settings, tmp_path / "users", headers=SIGNED):
        items = await _items(client, outbox)
        assert [item["saga_id"] for item in items] == ["pl-requeued", "pl-discarded"]
        assert [(link["label"], link["href"]) for link in items[0]["levers"]] == [
            ("requeue", f"/parked#parked-{table}-{requeued}"), ("discard", f"/parked#parked-{table}-{requeued}"),
            ("open", "/sagas/pl-requeued")]
        page = await client.get("/parked")
        assert page.status_code == 200 and f'id="parked-{table}-{discarded}"' in page.text
        assert 'hx-post="/parked/requeue"' in page.text and 'hx-confirm="Discard row' in page.text

        answer = await client.post(f"/api/v1/parked/{table}/{requeued}/requeue", json={"reason": "topic raised"})
        assert answer.status_code == 200, answer.text
        assert answer.json()["operator"] == "petra" and answer.json()["done"].startswith(f"requeued into {outbox}")
        assert await _where(pool, outbox, requeued) == (True, False)  # back under its own id, published again
        assert [item["saga_id"] for item in await _items(client, outbox)] == ["pl-discarded"]
        again = await client.post(f"/api/v1/parked/{table}/{requeued}/requeue")
        assert again.status_code == 404 and "no longer" not in again.text, again.text  # not listed: unknown

        refused = await client.post(f"/api/v1/parked/{table}/{discarded}/discard", json={})
        assert refused.status_code == 400 and await _where(pool, outbox, discarded) == (False, True)
        form = await client.post("/parked/discard", data={"table": table, "row_id": str(discarded),
                                                          "reason": "payload obsolete"})
        assert form.status_code == 200 and f'data-handled="{discarded}"' in form.text, form.text
        assert await _where(pool, outbox, discarded) == (False, False)
        assert await _items(client, outbox) == []

        for path in (f"/api/v1/parked/{table}/987654321/requeue", "/api/v1/parked/nowhere.outbox_parked/1/discard",
                     f"/api/v1/parked/{outbox}/{requeued}/discard", f"/api/v1/parked/{table}%3B%20drop/1/requeue"):
            unknown = await client.post(path, json={"reason": "try"})
            assert unknown.status_code == 404 and "parked" in unknown.json()["detail"], (path, unknown.text)
        assert await _where(pool, outbox, requeued) == (True, False)

        audit = (await client.get("/api/v1/audit", params={"limit": 50})).json()
        ours = [(e["operator"], e["action"], e["target"], e["detail"]["reason"], e["outcome"].split(":")[0])
                for e in reversed(audit) if e["target"].endswith(f"of {table}")]
        assert ours == [
            ("petra", "RequeueParked", f"parked row {requeued} of {table}", "topic raised", f"requeued into {outbox}"),
            ("petra", "RequeueParked", f"parked row {requeued} of {table}", None, "refused"),
            ("petra", "DiscardParked", f"parked row {discarded} of {table}", None, "refused"),
            ("petra", "DiscardParked", f"parked row {discarded} of {table}", "payload obsolete",
             "discarded for good"),
            ("petra", "RequeueParked", f"parked row 987654321 of {table}", "try", "refused")]
        unknown_table = [e["outcome"] for e in audit if e["target"] == "parked row 1 of nowhere.outbox_parked"]
        assert unknown_table == ["refused: no row 1 parked in 'nowhere.outbox_parked': GET /api/v1/parked lists the"
                                 " parked rows"]  # audited, nothing done


@pytest.mark.asyncio(loop_scope="module")
async def test_nobody_pulls_a_parked_rows_lever_without_an_operator_or_with_the_levers_off(
        settings: Settings, parked: tuple[asyncpg.Pool, str, list[int]], tmp_path: Path) -> None:
    pool, outbox, (requeued, _) = parked
    path = f"/api/v1/parked/{outbox}_parked/{requeued}/requeue"
    async for anonymous in _client(settings, tmp_path / "users"):
        assert (await anonymous.post(path, json={"reason": "x"})).status_code == 401
    async for read_only in _client(settings, tmp_path / "users", levers=False, headers=SIGNED):
        assert (await read_only.post(path, json={"reason": "x"})).status_code == 403
        assert "read-only" in (await read_only.get("/parked")).text
    assert await _where(pool, outbox, requeued) == (False, True)


@pytest.mark.asyncio(loop_scope="module")
async def test_every_outbox_s_parked_rows_and_every_participant_s_deferred_commands_are_one_read_each(
        settings: Settings) -> None:
    pool = await create_pool(settings.dsn(), 2)
    try:
        await migrate(pool)
        await ensure_participant_schema(pool, DESK)
        in_saga = await _park(pool, "saga.outbox", "both-a", "t.flight.commands", "too large")
        in_desk = await _park(pool, "deferredtest.outbox", "both-b", "t.replies", "topic refused")
        saga_id = new_saga_id()
        assert await handle_command(pool, DESK, TOPICS, delivered(DESK, *command(saga_id, "flight", "book_flight"))
                                    ) == Disposition.AWAITING
        reads = PostgresReads(pool)
        parked = {(row.table, row.row_id) for row in await reads.parked()}
        assert {("saga.outbox_parked", in_saga), ("deferredtest.outbox_parked", in_desk)} <= parked
        nowhere = replace(DESK, name="nowhere", schema="nowhere")  # never started here: no tables
        found = await reads.awaiting_of([DESK, nowhere])
        assert [(c.saga_id, c.step) for c in found["flight"]] == [(saga_id, "flight")] and found["nowhere"] == []
    finally:
        await pool.close()
