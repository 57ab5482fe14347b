"""``saga migrate``: the schema of the orchestrator and of participants, made by the migration role, and the
least-privilege roles granted their own schema (``infra.roles``)."""

from __future__ import annotations

from typing import Annotated

import asyncpg
import typer
from rich.table import Table

from ..infra.db import create_pool
from ..infra.roles import (
    CONSOLE_ORCHESTRATOR_WRITES,
    CONSOLE_ROLE,
    ORCHESTRATOR_ROLE,
    ORCHESTRATOR_SCHEMA,
    console_writes,
    ensure_roles,
    grant,
    participant_role,
)
from ..infra.settings import Settings
from ..operations.postgres import migrate as migrate_orchestrator
from ..participants.kit.ddl import ensure_participant_schema
from ..participants.kit.participant import Participant
from ..participants.runner import hosted_participants
from .context import console, deployment, fail, refuse_postgres_failure, run, settings


def migrate_command(
    participants: Annotated[list[str] | None, typer.Argument(
        help="Participants whose tables to make (names or module:attribute; default: SAGA_PARTICIPANTS).")] = None,
    orchestrator: bool = typer.Option(True, "--orchestrator/--no-orchestrator",
                                      help="Make (or bring up to date) the orchestrator's tables too."),
    create_roles: bool = typer.Option(False, "--create-roles",
                                      help="Create the missing roles first (LOGIN, no password: for the local "
                                           "launcher's trusted Postgres; elsewhere create them yourself)."),
) -> None:
    """Create or bring up to date the tables, connected as DATABASE_URL (the migration role: the schemas'
    owner), then grant each least-privilege role that exists its own schema: saga_orchestrator on saga,
    saga_<schema> on each participant's; and saga_console reading all of them, writing only its levers' rows.
    Safe to run again."""
    current = settings()
    loaded = deployment(saga_types=False)
    names = participants or loaded.participant_names()
    try:
        hosted = hosted_participants(names, loaded)
    except (ValueError, ImportError) as error:
        fail(str(error))
    try:
        rows = run(_migrate(current, orchestrator, hosted, create_roles))
    except Exception as error:
        refuse_postgres_failure(error, current.dsn(),
                                "DATABASE_URL must be the migration role (owner of the schemas)")
        raise
    table = Table("schema", "made by", "granted to")
    for row in rows:
        table.add_row(*row)
    console.print(table)


def service_roles(orchestrator: bool, hosted: list[Participant]) -> list[str]:
    """The least-privilege roles of the orchestrator and the console (when ``orchestrator``) and of ``hosted``."""
    return [ORCHESTRATOR_ROLE, CONSOLE_ROLE] * orchestrator + [participant_role(p.schema) for p in hosted]


async def create_missing_roles(dsn: str, roles: list[str]) -> list[str]:
    """Create the missing ``roles`` (LOGIN, no password), connected as ``dsn``; those created now."""
    conn = await asyncpg.connect(dsn)
    try:
        return await ensure_roles(conn, roles)
    finally:
        await conn.close()


async def _migrate(current: Settings, orchestrator: bool, hosted: list[Participant], create_roles: bool
                   ) -> list[tuple[str, str, str]]:
    pool = await create_pool(current.dsn(), 2)
    rows = []
    try:
        async with pool.acquire() as conn:
            if create_roles:
                await ensure_roles(conn, service_roles(orchestrator, hosted))
            if orchestrator:
                applied = await migrate_orchestrator(pool)
                granted = [role for role, writes in ((ORCHESTRATOR_ROLE, None),
                                                     (CONSOLE_ROLE, CONSOLE_ORCHESTRATOR_WRITES))
                           if await grant(conn, ORCHESTRATOR_SCHEMA, role, writes)]
                rows.append((ORCHESTRATOR_SCHEMA, f"{len(applied)} migrations applied now", ", ".join(granted) or "-"))
            for participant in hosted:
                await ensure_participant_schema(pool, participant)
                role = participant_role(participant.schema)
                writes = console_writes(participant.awaiting_table, participant.processed_table,
                                        participant.outbox_table)
                granted = [name for name, reader_writes in ((role, None), (CONSOLE_ROLE, writes))
                           if await grant(conn, participant.schema, name, reader_writes)]
                rows.append((participant.schema, f"participant {participant.name}", ", ".join(granted) or "-"))
    finally:
        await pool.close()
    return rows
