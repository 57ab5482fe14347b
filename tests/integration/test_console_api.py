"""The console's HTTP API on a real Postgres and Kafka: reads of recorded sagas (list, search by a business key,
one saga, its history, the fleet, the definition versions with their sagas, wedged sagas), the identity modes,
and a lever published on saga.control and audited; a signal checked against its record, published and audited,
and what a step waits for."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import pytest_asyncio
import uvicorn

from examples.loans.loan import app as loans
from examples.loans.loan import loan
from saga_orchestrator.client import SagaApi, SagaClient, SagaNotFound
from saga_orchestrator.console.app import console_app
from saga_orchestrator.console.identity import add_user
from saga_orchestrator.infra.db import create_pool
from saga_orchestrator.infra.misconfigured import Misconfigured
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.operations import reads
from saga_orchestrator.orchestrator.bootstrap import prepare
from saga_orchestrator.orchestrator.domain.builder import TimerKind
from saga_orchestrator.orchestrator.domain.state import SagaStatus
from saga_orchestrator.orchestrator.outbound import summary_of
from saga_orchestrator.orchestrator.ports import SagaSummaryRow, SearchKey, StoredEvent, Writes
from saga_orchestrator.orchestrator.store.postgres import PostgresStore, migrate
from saga_orchestrator.participants.kit.ddl import ensure_participant_schema
from saga_orchestrator.participants.kit.handling import Disposition, handle_command
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.registry import SchemaRegistry, load_tree
from saga_orchestrator.schemas.topics import Topics
from saga_orchestrator.testing.history import SagaRun
from tests.e2e.harness import read_topic
from tests.integration.test_participant_deferred import DESK
from tests.integration.test_participants import TOPICS, command, delivered, new_saga_id, replies

pytestmark = pytest.mark.integration


def _runs() -> dict[str, SagaRun]:
    now = time.time_ns() // 1_000_000  # the fleet counts what ended in the last hour and day
    waiting = SagaRun(TRIP, saga_id="api-waiting", now=now - 60_000)
    waiting.start()
    waiting.ok("book_flight")
    waiting.fail("book_hotel", "HotelBusy", retryable=True)  # the hotel is busy: twice, its third attempt waits
    waiting.fire(TimerKind.STEP_RETRY, "book_hotel")
    waiting.fail("book_hotel", "HotelBusy", retryable=True)
    done = SagaRun(TRIP, saga_id="api-done", now=now)
    done.start()
    for step in ("book_flight", "book_hotel", "charge_card", "send_itinerary"):
        done.ok(step)
    return {"api-waiting": waiting, "api-done": done}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def recorded(settings: Settings) -> AsyncIterator[dict[str, SagaRun]]:
    await prepare(settings)  # the topics the console publishes on
    pool = await create_pool(settings.dsn(), 2)
    await migrate(pool)
    runs = _runs()
    await _record(pool, runs)
    yield runs
    await pool.close()


async def _record(pool: asyncpg.Pool, runs: dict[str, SagaRun]) -> None:
    async with PostgresStore(pool).begin() as uow:
        await uow.write(Writes(
            events=[StoredEvent(saga_id=e.saga_id, seq=e.seq, event_type=type(e).__name__, body=wire.encode_event(e),
                                recorded_at_ms=e.occurred_at) for run in runs.values() for e in run.events],
            summaries=[summary_of(run.saga) for run in runs.values()],
            search_keys=[SearchKey(saga_id, "customer_id", f"cust-{saga_id}") for saga_id in runs]))


@contextlib.asynccontextmanager
async def _pool(settings: Settings) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(settings.dsn(), 2)
    try:
        yield pool
    finally:
        await pool.close()


async def _client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = console_app(settings)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://console") as client:
        yield client


@pytest_asyncio.fixture(loop_scope="module")
async def reader(settings: Settings, recorded: dict[str, SagaRun]) -> AsyncIterator[httpx.AsyncClient]:
    async for client in _client(settings):  # anonymous, read-only
        yield client


async def _json(client: httpx.AsyncClient, path: str, status: int = 200) -> Any:
    answer = await client.get(path)
    assert answer.status_code == status, answer.text
    return answer.json()


@pytest.mark.asyncio(loop_scope="module")
async def test_sagas_are_listed_by_state_and_found_by_a_business_key(reader: httpx.AsyncClient) -> None:
    running = await _json(reader, "/api/v1/sagas?status=RUNNING")
    assert [row["saga_id"] for row in running] == ["api-waiting"]
    assert running[0]["current_step"] == "book_hotel" and running[0]["last_error"] == "HotelBusy"
    assert [row["saga_id"] for row in await _json(reader, "/api/v1/sagas")] == ["api-waiting", "api-done"]
    # the criteria of a bulk job's selection: the list shows what a job would take
    for criterion in ("error=HotelBusy", "participant=hotel", "saga_type=trip&status=running"):
        assert [row["saga_id"] for row in await _json(reader, f"/api/v1/sagas?{criterion}")] == ["api-waiting"]
    assert await _json(reader, "/api/v1/sagas?participant=flight") == []
    refused = await _json(reader, "/api/v1/sagas?saga_type=trp", 400)
    assert refused == {"detail": "unknown saga type 'trp'; known types: trip"}
    assert "is not a saga state" in (await _json(reader, "/api/v1/sagas?status=DONE", 400))["detail"]
    found = await _json(reader, "/api/v1/search?q=cust-api-done")
    assert [row["saga_id"] for row in found] == ["api-done"]
    assert [row["saga_id"] for row in await _json(reader, "/api/v1/search?q=customer_id=cust-api-done")] == ["api-done"]
    assert await _json(reader, "/api/v1/search?q=email=cust-api-done") == []
    assert [row["saga_id"] for row in await _json(reader, "/api/v1/search?q=api-waiting")] == ["api-waiting"]


@pytest.mark.asyncio(loop_scope="module")
async def test_a_search_finds_a_keys_start_whatever_the_case_within_filters(reader: httpx.AsyncClient) -> None:
    async def found(query: str) -> list[str]:
        return [row["saga_id"] for row in await _json(reader, f"/api/v1/search?{query}")]

    assert sorted(await found("q=CUST-API")) == ["api-done", "api-waiting"]
    assert await found("q=customer_id=CUST-API-D") == ["api-done"]
    assert await found("q=customer_id%3Dcust-api-done") == ["api-done"]
    assert await found("q=nofield%3Dcust-api-done") == []  # not a field: the whole text is a value
    assert await found("q=cust-api&tenant=nobody") == []
    assert sorted(await found("q=cust-api&started_after=2000-01-01T00:00:00Z")) == ["api-done", "api-waiting"]
    assert await found("q=cust-api&started_before=2000-01-01T00:00:00") == []
    assert await found("q=api-done&started_after=2999-01-01T00:00:00%2B02:00") == []
    fields = await _json(reader, "/api/v1/search/fields")
    assert fields["trip"] == list(TRIP.searchable) and TRIP.searchable
    page = await reader.get("/search?q=CUST-API-D&tenant=&started_after=&started_before=")
    assert page.status_code == 200 and 'data-saga="api-done"' in page.text
    assert 'data-saga="api-waiting"' not in page.text
    assert 'data-saga-type="trip"' in page.text and "<code>customer_id</code>" in page.text
    assert (await reader.get("/search?q=cust&started_after=yesterday")).status_code == 400


@pytest.mark.asyncio(loop_scope="module")
async def test_one_saga_its_history_and_the_levers_that_apply(reader: httpx.AsyncClient,
                                                              recorded: dict[str, SagaRun]) -> None:
    saga = await _json(reader, "/api/v1/sagas/api-waiting")
    assert saga["status"] == "RUNNING" and saga["search_keys"] == {"customer_id": "cust-api-waiting"}
    steps = {step["name"]: step for step in saga["steps"]}
    assert steps["book_flight"]["status"] == "SUCCEEDED" and steps["book_hotel"]["status"] == "RETRY_SCHEDULED"
    assert steps["charge_card"]["pivot"] and steps["charge_card"]["depends_on"] == ["book_flight", "book_hotel"]
    assert {"action": "Cancel", "step": None} in saga["actions"]
    history = await _json(reader, "/api/v1/sagas/api-waiting/history")
    assert [event["type"] for event in history] == [type(e).__name__ for e in recorded["api-waiting"].events]
    assert await _json(reader, "/api/v1/sagas/nobody", 404) == {"detail": "no saga 'nobody'"}
    done = await _json(reader, "/api/v1/sagas/api-done")
    assert done["status"] == "COMPLETED" and done["actions"] == []


@pytest.mark.asyncio(loop_scope="module")
async def test_a_step_in_flight_says_when_no_worker_consumes_its_participant(
        settings: Settings, recorded: dict[str, SagaRun]) -> None:
    app = console_app(settings)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://console") as client:
        await app.state.console.attendance.refresh()  # the background refresh may not have answered yet
        page = (await client.get("/sagas/api-waiting")).text  # book_hotel waits for its retry; no hotel worker runs
        assert f'data-unconsumed="hotel">no worker consumes {settings.saga_topic_prefix}hotel.commands' in page
        assert "data-unconsumed" not in (await client.get("/sagas/api-done")).text


@pytest.mark.asyncio(loop_scope="module")
async def test_the_fleet_and_the_wedged(reader: httpx.AsyncClient) -> None:
    fleet = await _json(reader, "/api/v1/fleet")
    assert fleet["by_status"] == {"COMPLETED": 1, "RUNNING": 1}
    assert [row["saga_id"] for row in fleet["oldest"]] == ["api-waiting"]
    assert fleet["ended_day"] == 1 and fleet["compensation_rate_day"] == 0.0
    wedged = await _json(reader, "/api/v1/wedged?min_failures=1")
    assert [(g["saga_type"], g["step"], g["error"], g["saga_ids"]) for g in wedged] == [
        ("trip", "book_hotel", "HotelBusy", ["api-waiting"])]
    assert await _json(reader, "/api/v1/wedged?min_failures=9") == []
    document = await _json(reader, "/api/openapi.json")
    assert {"/api/v1/sagas", "/api/v1/search", "/api/v1/sagas/{saga_id}", "/api/v1/sagas/{saga_id}/actions",
            "/api/v1/fleet", "/api/v1/wedged"} <= set(document["paths"])


@pytest.mark.asyncio(loop_scope="module")
async def test_the_definitions_show_the_sagas_running_and_ended_on_each_version(
        reader: httpx.AsyncClient, settings: Settings, tmp_path: Path) -> None:
    now = time.time_ns() // 1_000_000
    older = [SagaSummaryRow("api-v0", "trip", None, "RUNNING", now, now, 3, definition_version=0,
                            definition_fingerprint="0ld"),
             SagaSummaryRow("api-unrecorded", "trip", None, "COMPENSATED", now, now, 9)]  # written before 0.3
    async with _pool(settings) as pool:
        async with PostgresStore(pool).begin() as uow:
            await uow.write(Writes(summaries=older))
        try:
            shown = await _json(reader, "/api/v1/definitions")
            assert [(d["saga_type"], d["version"], d["deployed"], d["running"], d["ended"]) for d in shown] == [
                ("trip", None, False, 0, 1), ("trip", 0, False, 1, 0), ("trip", 1, True, 1, 1)]
            assert shown[2]["fingerprint"] == TRIP.fingerprint and shown[2]["shapes"] == [
                {"fingerprint": TRIP.fingerprint, "running": 1, "ended": 1}]
            page = await reader.get("/definitions")
            assert page.status_code == 200 and "not deployed" in page.text and "unrecorded" in page.text
            # The command line, from the database.
            env = {**os.environ, "DATABASE_URL": settings.dsn()}
            cli = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "saga_orchestrator.cli",
                                                           "definitions", "--json"],
                                          env=env, capture_output=True, text=True, timeout=60)
            assert cli.returncode == 0 and cli.stderr == "", cli.stderr
            assert [(d["version"], d["deployed"], d["sagas"]["running"], d["sagas"]["ended"])
                    for d in map(json.loads, cli.stdout.splitlines())] == [(None, False, 0, 1), (0, False, 1, 0),
                                                                           (1, True, 1, 1)]
        finally:
            await pool.execute("DELETE FROM saga.saga_summary WHERE saga_id = ANY($1::text[])",
                               [row.saga_id for row in older])
    assert [d["draining"] for d in shown] == [False, False, False]
    async for drained in _client(settings.model_copy(update={"saga_draining": "trip:1"})):  # as the orchestrator's
        assert [(d["version"], d["draining"]) for d in await _json(drained, "/api/v1/definitions")] == [(1, True)]
        assert "draining</strong>: no new starts" in (await drained.get("/definitions")).text
    users = tmp_path / "users"
    add_user(users, "anna", "a long password")
    async for guarded in _client(settings.model_copy(update={"saga_console_users": str(users)})):
        assert (await guarded.get("/api/v1/definitions")).status_code == 401  # nobody signed in
        assert (await guarded.get("/definitions")).status_code in (303, 307)  # to the sign-in


@pytest.mark.asyncio(loop_scope="module")
async def test_a_read_only_console_refuses_every_action(reader: httpx.AsyncClient) -> None:
    answer = await reader.post("/api/v1/sagas/api-waiting/actions", json={"action": "Pause"})
    assert answer.status_code == 403 and "read-only" in answer.text


@pytest.mark.asyncio(loop_scope="module")
async def test_a_lever_from_a_signed_in_operator_is_published_and_audited(
        settings: Settings, recorded: dict[str, SagaRun], tmp_path: Path) -> None:
    users = tmp_path / "users"
    add_user(users, "anna", "a long password")
    levers = settings.model_copy(update={"saga_console_levers": True, "saga_console_users": str(users)})
    async for client in _client(levers):
        assert (await client.get("/api/v1/sagas")).status_code == 401  # nobody signed in
        signed = {"Authorization": "Basic " + base64.b64encode(b"anna:a long password").decode()}
        refused = await client.post("/api/v1/sagas/api-waiting/actions", json={"action": "Terminate"},
                                    headers=signed)
        assert refused.status_code == 400 and "Terminate needs a reason" in refused.text
        sent = await client.post("/api/v1/sagas/api-waiting/actions", headers=signed,
                                 json={"action": "RetryNow", "step": "book_hotel", "reason": "hotel is back"})
        assert sent.status_code == 202 and sent.json()["operator"] == "anna"
        client.headers.update(signed)
        audit = await _json(client, "/api/v1/audit")
        assert [(e["operator"], e["action"], e["outcome"]) for e in audit[:2]] == [
            ("anna", "RetryNow", "queued on saga.control"),
            ("anna", "Terminate", "refused: Terminate needs a reason (what settled the saga by hand): it is recorded "
                                  "in the saga's history")]
    # Queued in the orchestrator's outbox with its audit row: the orchestrator's relay publishes it.
    async with _pool(settings) as pool:
        rows = await pool.fetch("SELECT topic, value FROM saga.outbox WHERE message_key = 'api-waiting'")
    operated = [wire.decode_operate(row["value"]) for row in rows]
    assert [row["topic"] for row in rows] == [Topics(settings.saga_topic_prefix).control]
    assert [(m.action, m.step, m.operator, m.reason) for m in operated] == [
        ("RetryNow", "book_hotel", "anna", "hotel is back")]


@pytest.mark.asyncio(loop_scope="module")
async def test_a_lever_whose_audit_cannot_be_written_is_not_queued(
        settings: Settings, recorded: dict[str, SagaRun], tmp_path: Path) -> None:
    users = tmp_path / "users"
    add_user(users, "anna", "a long password")
    levers = settings.model_copy(update={"saga_console_levers": True, "saga_console_users": str(users)})
    async with _pool(settings) as pool:
        await pool.execute("""CREATE FUNCTION refuse_audit() RETURNS trigger LANGUAGE plpgsql AS
                              $$ BEGIN RAISE EXCEPTION 'the audit is read-only today'; END $$;
                              CREATE TRIGGER refuse_audit BEFORE INSERT ON saga.operator_audit
                              FOR EACH ROW EXECUTE FUNCTION refuse_audit()""")
        try:
            async for client in _client(levers):
                signed = {"Authorization": "Basic " + base64.b64encode(b"anna:a long password").decode()}
                with pytest.raises(asyncpg.RaiseError, match="the audit is read-only today"):
                    await client.post("/api/v1/sagas/api-done/actions", headers=signed,
                                      json={"action": "Pause", "reason": "no audit, no lever"})
        finally:
            await pool.execute("DROP TRIGGER refuse_audit ON saga.operator_audit; DROP FUNCTION refuse_audit()")
        queued = await pool.fetchval("SELECT count(*) FROM saga.outbox WHERE message_key = 'api-done'")
    assert queued == 0
    control = await read_topic(settings, Topics(settings.saga_topic_prefix).control)
    assert not [record for record in control if record.key == b"api-done"]



@pytest.mark.asyncio(loop_scope="module")
async def test_a_deferred_command_is_listed_and_answered_once_by_the_operator(
        settings: Settings, recorded: dict[str, SagaRun], tmp_path: Path) -> None:
    pool = await create_pool(settings.dsn(), 2)
    try:
        await ensure_participant_schema(pool, DESK)
        saga_id = new_saga_id()
        assert await handle_command(pool, DESK, TOPICS, delivered(DESK, *command(saga_id, "flight", "book_flight"))
                                    ) == Disposition.AWAITING
        users = tmp_path / "users"
        add_user(users, "pat", "a long password")
        desk = settings.model_copy(update={"saga_console_levers": True, "saga_console_users": str(users),
                                           "saga_participants": "tests.integration.test_participant_deferred:DESK"})
        async for client in _client(desk):
            client.headers["Authorization"] = "Basic " + base64.b64encode(b"pat:a long password").decode()
            listed = await _json(client, "/api/v1/deferred")
            assert [(d["participant"], d["saga_id"], d["step"]) for d in listed] == [("flight", saga_id, "flight")]
            key = listed[0]["idempotency_key"]
            path = f"/api/v1/deferred/flight/{key}/answer"
            both = await client.post(path, json={"output": "x", "error_type": "Rejected"})
            assert both.status_code == 400 and "exactly one of output" in both.text
            answered = await client.post(path, json={"output": '{"seat": "2C"}', "detail": "by phone"})
            assert answered.status_code == 202, answered.text
            again = await client.post(path, json={"error_type": "Late"})
            assert again.status_code == 404 and "was answered already (SUCCEEDED at" in again.text
            assert await _json(client, "/api/v1/deferred") == []
            audit = await _json(client, "/api/v1/audit")
            assert [(e["operator"], e["action"], e["outcome"].split(" (")[0]) for e in audit[:2]] == [
                ("pat", "Answer", f"refused: {key} was answered already"),
                ("pat", "Answer", "answered; the participant's relay replies")]
        [reply] = await replies(pool, DESK.schema, saga_id)
        assert (reply["result"]["output"], reply["result"]["operator"], reply["result"]["detail"]) == (
            b'{"seat": "2C"}', "pat", "by phone")
    finally:
        await pool.close()


@pytest.mark.asyncio(loop_scope="module")
async def test_the_client_and_the_command_line_read_a_saga_through_the_api(
        settings: Settings, recorded: dict[str, SagaRun]) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(console_app(settings), host="127.0.0.1", port=port, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    try:
        for _ in range(200):  # up to 10 s
            if server.started:
                break
            await asyncio.sleep(0.05)
        url = f"http://127.0.0.1:{port}"
        client = SagaClient(settings.kafka_servers(), {}, api=SagaApi(url))
        status = await client.status("api-waiting")
        assert (status.status, status.saga_type) == ("RUNNING", "trip")
        assert [(s.name, s.status) for s in status.steps][:2] == [("book_flight", "SUCCEEDED"),
                                                                  ("book_hotel", "RETRY_SCHEDULED")]
        with pytest.raises(SagaNotFound):
            await client.status("nobody")
        with pytest.raises(Misconfigured, match="SAGA_API_URL"):
            await SagaClient(settings.kafka_servers(), {}).status("api-waiting")
        # The command line, with no DATABASE_URL: through the API.
        env = {name: value for name, value in os.environ.items() if name != "DATABASE_URL"}
        env.update({"SAGA_API_URL": url, "SAGA_TOPIC_PREFIX": settings.saga_topic_prefix})
        for args, expected in ((["status", "api-done"], "COMPLETED"), (["history", "api-done"], "SagaCompleted"),
                               (["list", "--state", "RUNNING"], "api-waiting")):
            shown = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "saga_orchestrator.cli", *args],
                                            env=env, capture_output=True, text=True, timeout=60)
            assert shown.returncode == 0 and expected in shown.stdout, (args, shown.stdout, shown.stderr)
        missing = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "saga_orchestrator.cli", "status",
                                                           "nobody"], env=env, capture_output=True, text=True)
        assert missing.returncode != 0 and "no saga 'nobody'" in missing.stdout + missing.stderr
    finally:
        server.should_exit = True
        await serving


@pytest.mark.asyncio(loop_scope="module")
async def test_the_fleet_reads_the_ended_sagas_less_often_than_the_unfinished(
        settings: Settings, recorded: dict[str, SagaRun], monkeypatch: pytest.MonkeyPatch) -> None:
    """The last test of the module: it records two more sagas."""
    monkeypatch.setattr(reads, "FLEET_FRESH_S", 0.0)
    monkeypatch.setattr(reads, "ENDED_FRESH_S", 3600.0)
    async for client in _client(settings):
        assert (await _json(client, "/api/v1/fleet"))["by_status"] == {"COMPLETED": 1, "RUNNING": 1}
        now = time.time_ns() // 1_000_000
        running = SagaRun(TRIP, saga_id="api-later-running", now=now)
        undone = SagaRun(TRIP, saga_id="api-later-undone", now=now)
        running.start()
        undone.start()
        undone.ok("book_flight")
        undone.fail("book_hotel", "NoRooms")
        undone.comp_ok("book_flight")
        assert undone.status() == SagaStatus.COMPENSATED
        pool = await create_pool(settings.dsn(), 1)
        try:
            await _record(pool, {run.saga.saga_id: run for run in (running, undone)})
        finally:
            await pool.close()
        fleet = await _json(client, "/api/v1/fleet")  # the unfinished read again, the ended not yet
        assert fleet["by_status"] == {"COMPLETED": 1, "RUNNING": 2} and fleet["ended_day"] == 1
        monkeypatch.setattr(reads, "ENDED_FRESH_S", 0.0)
        fleet = await _json(client, "/api/v1/fleet")
        assert fleet["by_status"] == {"COMPENSATED": 1, "COMPLETED": 1, "RUNNING": 2}
        assert (fleet["ended_hour"], fleet["compensation_rate_hour"], fleet["compensation_rate_day"]) == (2, 0.5, 0.5)


@pytest.mark.asyncio(loop_scope="module")
async def test_a_signal_from_a_signed_in_operator_is_checked_published_and_audited_and_the_wait_shown(
        settings: Settings, recorded: dict[str, SagaRun], tmp_path: Path) -> None:
    users = tmp_path / "users"
    add_user(users, "ivo", "a long password")
    lending = settings.model_copy(update={"saga_console_levers": True, "saga_console_users": str(users),
                                          "saga_app": "examples.loans.loan:app", "saga_participants": ""})
    waiting = SagaRun(loan.definition, saga_id=f"api-loan-{new_saga_id()}", now=time.time_ns() // 1_000_000)
    waiting.start()
    waiting.ok("hold_funds")
    pool = await create_pool(settings.dsn(), 2)
    try:
        await _record(pool, {waiting.saga_id: waiting})
    finally:
        await pool.close()
    assert loans.schema_folder is not None
    async for client in _client(lending):
        client.headers["Authorization"] = "Basic " + base64.b64encode(b"ivo:a long password").decode()
        shown = await _json(client, f"/api/v1/sagas/{waiting.saga_id}")
        step = next(s for s in shown["steps"] if s["name"] == "await_approval")
        assert step["status"] == "AWAITING_SIGNAL" and step["waiting"].startswith("waiting for signal Approval since ")
        path = f"/api/v1/sagas/{waiting.saga_id}/signals"
        misfit = await client.post(path, json={"signal": "Approval", "payload": {"approver": "ada"}})
        assert misfit.status_code == 400 and "payload does not fit saga.v1.loan.Approval" in misfit.text, misfit.text
        unknown = await client.post(path, json={"signal": "Veto", "payload": {}})
        assert unknown.status_code == 400 and "'Veto' is no signal" in unknown.text, unknown.text
        sent = await client.post(path, json={"signal": "Approval", "signal_id": "ap-1",
                                             "payload": {"approver": "ada", "limit_cents": 900_000}})
        assert sent.status_code == 202 and sent.json()["signal_id"] == "ap-1" and sent.json()["sender"] == "ivo"
        audit = await _json(client, "/api/v1/audit")
        assert [(e["operator"], e["action"], e["outcome"].split(":")[0]) for e in audit[:3]] == [
            ("ivo", "Signal", "published on saga.control"), ("ivo", "Signal", "refused"),
            ("ivo", "Signal", "refused")]
    records = await read_topic(settings, Topics(settings.saga_topic_prefix).control)
    [signal] = [wire.decode_signal(r.value) for r in records if r.key == waiting.saga_id.encode()]
    assert (signal.signal_id, signal.signal, signal.sender) == ("ap-1", "Approval", "ivo")
    schemas = SchemaRegistry(list(load_tree(loans.schema_folder).values()))
    assert schemas.decode(signal.payload) == ("saga.v1.loan.Approval", {"approver": "ada", "limit_cents": 900_000})
