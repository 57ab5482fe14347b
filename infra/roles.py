"""Least privilege in Postgres: who may touch which schema.

A migration role (the owner of the schemas, the one ``saga migrate`` connects as) runs every DDL statement.
The orchestrator's role may read and write the tables of schema ``saga`` only; each participant's role the
tables of its own schema only (its ledger, its outbox, its business tables). A participant's role is refused on
``saga.events``, and the orchestrator's on a participant's schema. The services run DDL at start only where
their role may (a single superuser DSN keeps working as before); with these roles they find their tables
made and create nothing.

The console's role (``CONSOLE_ROLE``) reads every schema of the deployment and writes only what its levers
write: in ``saga`` its audit, its sign-ins, the bulk jobs and a lever's control command (queued in the
orchestrator's outbox in the transaction of its audit row), and in a participant's schema the three rows an
answer to a deferred command takes (the awaiting row deleted, the ledger row updated, the reply queued in the
outbox); in both, a parked outbox row it requeues (moved back into the outbox) or discards. It never writes an
event.

``saga migrate --create-roles`` creates the roles (``ORCHESTRATOR_ROLE``, ``CONSOLE_ROLE`` and
``participant_role(schema)``,
LOGIN without a password: the local launcher's Postgres trusts 127.0.0.1); on a managed Postgres, create them
yourself, with passwords, and let ``saga migrate`` grant (README, "Production", gives the statements).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import asyncpg

from .db import check_identifier

ORCHESTRATOR_ROLE = "saga_orchestrator"
ORCHESTRATOR_SCHEMA = "saga"
CONSOLE_ROLE = "saga_console"
# what the console writes in the orchestrator's schema: table -> privileges
CONSOLE_ORCHESTRATOR_WRITES = {"saga.operator_audit": "INSERT", "saga.bulk_jobs": "INSERT, UPDATE",
                               "saga.outbox": "INSERT", "saga.outbox_parked": "DELETE",
                               "saga.console_sessions": "INSERT, DELETE"}


def participant_role(schema: str) -> str:
    """The role of the participant whose tables live in ``schema``."""
    return f"saga_{check_identifier(schema)}"


def grant_statements(schema: str, role: str) -> list[str]:
    """What ``role`` needs to use the tables of ``schema`` (and nothing else): usage of the schema, reading and
    writing its tables and sequences, the same on tables the migration role makes there later."""
    schema, role = check_identifier(schema), check_identifier(role)
    return [
        f"GRANT USAGE ON SCHEMA {schema} TO {role}",
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}",
        f"GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA {schema} TO {role}",
        f"ALTER DEFAULT PRIVILEGES IN SCHEMA {schema} GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {role}",
        f"ALTER DEFAULT PRIVILEGES IN SCHEMA {schema} GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO {role}",
    ]


def console_writes(awaiting_table: str, processed_table: str, outbox_table: str) -> dict[str, str]:
    """What the console writes in a participant's schema, answering a deferred command or requeueing or
    discarding a parked outbox row: table -> privileges."""
    return {awaiting_table: "DELETE", processed_table: "UPDATE", outbox_table: "INSERT",
            f"{outbox_table}_parked": "DELETE"}


def reader_grant_statements(schema: str, role: str, writes: Mapping[str, str]) -> list[str]:
    """What ``role`` needs to read every table of ``schema`` (those made later too) and to write only ``writes``
    (a qualified table -> its privileges), with the sequences those inserts draw from."""
    schema, role = check_identifier(schema), check_identifier(role)
    statements = [
        f"GRANT USAGE ON SCHEMA {schema} TO {role}",
        f"GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {role}",
        f"ALTER DEFAULT PRIVILEGES IN SCHEMA {schema} GRANT SELECT ON TABLES TO {role}",
    ]
    if writes:
        statements.append(f"GRANT USAGE ON ALL SEQUENCES IN SCHEMA {schema} TO {role}")
    for table, privileges in writes.items():
        table_schema, _, name = table.partition(".")
        if table_schema != schema or not name:
            raise ValueError(f"{table!r} is not a table of schema {schema!r}")
        statements.append(f"GRANT {privileges} ON {schema}.{check_identifier(name)} TO {role}")
    return statements


async def ensure_role(conn: asyncpg.Connection, role: str) -> bool:
    """Create the LOGIN role ``role`` unless it exists; True when it was created now."""
    role = check_identifier(role)
    if await conn.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", role):
        return False
    try:
        await conn.execute(f"CREATE ROLE {role} LOGIN")
    except asyncpg.DuplicateObjectError:  # created meanwhile by a concurrent start
        return False
    return True


async def ensure_roles(conn: asyncpg.Connection, roles: Iterable[str]) -> list[str]:
    """``ensure_role`` for each of ``roles``; those created now."""
    return [role for role in roles if await ensure_role(conn, role)]


async def grant(conn: asyncpg.Connection, schema: str, role: str,
                reader_writes: Mapping[str, str] | None = None) -> bool:
    """Grant ``role`` the use of ``schema``'s tables when the role exists; whether it did. With
    ``reader_writes``, as a reader of the schema that writes only those (``reader_grant_statements``)."""
    if not await conn.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", check_identifier(role)):
        return False
    statements = (grant_statements(schema, role) if reader_writes is None
                  else reader_grant_statements(schema, role, reader_writes))
    async with conn.transaction():
        for statement in statements:
            await conn.execute(statement)
    return True


async def may_create_in(conn: asyncpg.Connection, schema: str) -> bool:
    """Whether the connected role may run this schema's DDL: create in it, or create it when it is missing."""
    exists = await conn.fetchval("SELECT 1 FROM pg_namespace WHERE nspname = $1", check_identifier(schema))
    if exists:
        return bool(await conn.fetchval("SELECT has_schema_privilege($1, 'CREATE')", schema))
    return bool(await conn.fetchval("SELECT has_database_privilege(current_database(), 'CREATE')"))
