"""Least privilege in Postgres: ``saga migrate`` (as the migration role) makes the tables and grants each role
its own schema; a participant's role is refused on the orchestrator's event store and the orchestrator's on a
participant's tables; the console's role reads every schema and writes only what its levers write; every
service runs under its own role, creating nothing, and the sagas end as planned.
"""

from __future__ import annotations

import base64
import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import pytest

from saga_orchestrator.cli.demo_cmd import drive
from saga_orchestrator.console.app import console_app
from saga_orchestrator.console.identity import add_user
from saga_orchestrator.infra.db import MigrationsPending, create_pool
from saga_orchestrator.infra.roles import CONSOLE_ROLE, ORCHESTRATOR_ROLE, participant_role
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.orchestrator.bootstrap import prepare
from saga_orchestrator.orchestrator.outbound import summary_of
from saga_orchestrator.orchestrator.ports import StoredEvent, Writes
from saga_orchestrator.orchestrator.store.postgres import PostgresStore, migrate
from saga_orchestrator.participants.kit.ddl import ensure_participant_schema
from saga_orchestrator.participants.kit.handling import Disposition, handle_command
from saga_orchestrator.participants.registry import get_participant
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.participants.trip.scenarios import SCENARIOS
from saga_orchestrator.schemas import wire
from saga_orchestrator.testing.history import SagaRun
from tests.conftest import run_sync
from tests.e2e.harness import Stack
from tests.integration.test_participant_deferred import DESK
from tests.integration.test_participants import TOPICS, command, delivered

PARTICIPANTS = ("flight", "hotel", "payment", "notification")


def as_role(dsn: str, role: str) -> str:
    """``dsn`` with ``role`` as its user (the local launcher's Postgres trusts 127.0.0.1, so no password)."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port}"))


def _saga_migrate(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": settings.dsn(), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "saga_orchestrator.cli", "migrate", *args], env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def migrated(settings: Settings, launcher_settings: Settings) -> Settings:
    result = _saga_migrate(settings, "--create-roles")
    assert result.returncode == 0, result.stdout + result.stderr
    for role in (ORCHESTRATOR_ROLE, CONSOLE_ROLE, *(participant_role(name) for name in PARTICIPANTS)):
        assert role in result.stdout, result.stdout
    return settings


async def test_a_participant_role_is_refused_on_the_event_store(migrated: Settings) -> None:
    conn = await asyncpg.connect(as_role(migrated.dsn(), participant_role("flight")))
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.fetchval("SELECT count(*) FROM saga.events")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("DELETE FROM saga.outbox")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.fetchval("SELECT count(*) FROM hotel.processed_commands")  # nor another participant's
        assert await conn.fetchval("SELECT count(*) FROM flight.processed_commands") == 0  # its own: yes
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("CREATE TABLE flight.mine (id int)")  # and no DDL
    finally:
        await conn.close()


async def test_the_orchestrator_role_has_its_schema_only(migrated: Settings) -> None:
    conn = await asyncpg.connect(as_role(migrated.dsn(), ORCHESTRATOR_ROLE))
    try:
        assert await conn.fetchval("SELECT count(*) FROM saga.events") >= 0
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.fetchval("SELECT count(*) FROM payment.outbox")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("DROP TABLE saga.events")
    finally:
        await conn.close()
    # what the services run at start finds everything made and creates nothing
    pool = await create_pool(as_role(migrated.dsn(), ORCHESTRATOR_ROLE), 1)
    try:
        assert await migrate(pool) == []
    finally:
        await pool.close()
    pool = await create_pool(as_role(migrated.dsn(), participant_role("hotel")), 1)
    try:
        await ensure_participant_schema(pool, get_participant("hotel"))
    finally:
        await pool.close()


async def test_the_console_role_reads_everything_and_writes_only_what_its_levers_write(
        migrated: Settings, tmp_path: Path) -> None:
    desk = "tests.integration.test_participant_deferred:DESK"  # a participant whose step waits for a person
    made = _saga_migrate(migrated, "--no-orchestrator", desk)
    assert made.returncode == 0 and CONSOLE_ROLE in made.stdout, made.stdout + made.stderr
    await prepare(migrated)
    admin = await create_pool(migrated.dsn(), 1)
    try:
        running = SagaRun(TRIP, saga_id=f"roles-console-{uuid.uuid4().hex[:6]}")
        running.start()
        async with PostgresStore(admin).begin() as uow:
            await uow.write(Writes(summaries=[summary_of(running.saga)], events=[
                StoredEvent(saga_id=e.saga_id, seq=e.seq, event_type=type(e).__name__, body=wire.encode_event(e),
                            recorded_at_ms=e.occurred_at) for e in running.events]))
        saga_id = running.saga.saga_id
        assert await handle_command(admin, DESK, TOPICS, delivered(DESK, *command(saga_id, "flight", "book_flight"))
                                    ) == Disposition.AWAITING
    finally:
        await admin.close()
    users = tmp_path / "users"
    add_user(users, "ola", "a long password")
    console = migrated.model_copy(update={
        "database_url": as_role(migrated.dsn(), CONSOLE_ROLE), "saga_console_levers": True,
        "saga_console_users": str(users), "saga_participants": desk})
    app = console_app(console)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://console") as client:
        client.headers["Authorization"] = "Basic " + base64.b64encode(b"ola:a long password").decode()
        for path in ("/api/v1/fleet", "/api/v1/sagas", f"/api/v1/sagas/{saga_id}", "/api/v1/parked",
                     "/api/v1/quarantined", "/api/v1/audit"):
            assert (await client.get(path)).status_code == 200, (path, (await client.get(path)).text)
        [waiting] = (await client.get("/api/v1/deferred")).json()
        answered = await client.post(f"/api/v1/deferred/flight/{waiting['idempotency_key']}/answer",
                                     json={"output": "{}", "detail": "booked by phone"})
        assert answered.status_code == 202, answered.text
        selection = {"saga_type": "trip", "statuses": ["RUNNING"]}
        counted = (await client.post("/api/v1/bulk/count", json=selection)).json()["total"]
        job = await client.post("/api/v1/bulk/jobs", json={**selection, "action": "Pause", "reason": "maintenance",
                                                           "expected": counted})
        assert job.status_code == 201, job.text
        cancelled = await client.post(f"/api/v1/bulk/jobs/{job.json()['id']}/cancel")
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "CANCELLED", cancelled.text
        audit = [(e["action"], e["outcome"]) for e in (await client.get("/api/v1/audit")).json()]
        assert ("Answer", "answered; the participant's relay replies") in audit, audit
    conn = await asyncpg.connect(as_role(migrated.dsn(), CONSOLE_ROLE))
    try:
        for statement in ("INSERT INTO saga.events (saga_id, seq, event_type, body) VALUES ('x', 1, 'x', '')",
                          "UPDATE saga.saga_summary SET status = 'COMPLETED'", "DELETE FROM saga.outbox",
                          "DELETE FROM saga.operator_audit", "DELETE FROM flight.outbox",
                          "INSERT INTO flight.processed_commands (idempotency_key) VALUES ('x')",
                          "CREATE TABLE saga.mine (id int)"):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute(statement)
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def _scratch_database(admin_dsn: str, stem: str, role: str) -> AsyncIterator[str]:
    """A database of its own (dropped after), with ``role`` existing; its DSN as the admin."""
    name = f"{stem}_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(admin_dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        await admin.execute(f"DO $$ BEGIN CREATE ROLE {role} LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$")
        yield urlunsplit(urlsplit(admin_dsn)._replace(path=f"/{name}"))
    finally:
        await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        await admin.close()


async def test_a_role_that_may_not_create_says_to_run_saga_migrate(postgres_admin_dsn: str) -> None:
    async with _scratch_database(postgres_admin_dsn, "test_roles_empty", ORCHESTRATOR_ROLE) as empty:
        pool = await create_pool(as_role(empty, ORCHESTRATOR_ROLE), 1)
        try:
            with pytest.raises(MigrationsPending, match="run `saga migrate`"):
                await migrate(pool)
        finally:
            await pool.close()


async def test_a_participant_role_says_which_added_column_saga_migrate_must_make(postgres_admin_dsn: str) -> None:
    """A kit table made by an earlier release lacks a column added since; a role that may not add it is told
    which, not failed at its first insert."""
    role = participant_role("flight")
    async with _scratch_database(postgres_admin_dsn, "test_roles_old", role) as old:
        made = await create_pool(old, 1)
        try:
            await ensure_participant_schema(made, get_participant("flight"))
            await made.execute("ALTER TABLE flight.awaiting_commands DROP COLUMN shard")
            await made.execute(f"GRANT USAGE ON SCHEMA flight TO {role}")
        finally:
            await made.close()
        pool = await create_pool(as_role(old, role), 1)
        try:
            with pytest.raises(MigrationsPending,
                               match=r"^columns flight\.awaiting_commands\.shard missing.*saga migrate"):
                await ensure_participant_schema(pool, get_participant("flight"))
        finally:
            await pool.close()


@pytest.fixture(scope="module")
def least_privilege_stack(migrated: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    log_dir: Path = tmp_path_factory.mktemp("roles-logs")
    run_sync(prepare(migrated))  # the topics
    stack = Stack(migrated, log_dir)
    for label in stack.labels:
        role = ORCHESTRATOR_ROLE if label == "orchestrator" else participant_role(label)
        stack.start(label, extra_env={"DATABASE_URL": as_role(migrated.dsn(), role)})
    try:
        yield stack
    finally:
        stack.stop()


async def test_every_service_runs_under_its_own_role(least_privilege_stack: Stack) -> None:
    run_id = uuid.uuid4().hex[:6]
    planned = {f"roles-{run_id}-{name}": name for name in ("happy", "card_declined", "invalid_route", "cancelled")}
    ended = await drive(least_privilege_stack.settings, planned, 120)
    assert ended == {saga_id: SCENARIOS[name].terminal for saga_id, name in planned.items()}
    conn = await asyncpg.connect(least_privilege_stack.settings.dsn())
    try:
        users = {row["usename"] for row in await conn.fetch(
            "SELECT DISTINCT usename FROM pg_stat_activity WHERE datname = current_database()")}
    finally:
        await conn.close()
    assert {ORCHESTRATOR_ROLE, *(participant_role(name) for name in PARTICIPANTS)} <= users, users
    assert least_privilege_stack.exited() == {}
    for label in least_privilege_stack.labels:
        log = least_privilege_stack.log(label)
        assert "permission denied" not in log and "InsufficientPrivilege" not in log, (label, log[-2000:])
