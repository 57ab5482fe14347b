"""The operations wing over Postgres: its store adapters built from a pool and the orchestrator's schema, for the
faces (console, command line) that must not reach into the store themselves."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from ..orchestrator.domain.definition import DefinitionRegistry
from ..orchestrator.ports import DeadLetterIndex
from ..orchestrator.store.dead_letters import PostgresDeadLetterIndex
from ..orchestrator.store.operations.audit import PostgresLevers
from ..orchestrator.store.operations.bulk_jobs import PostgresBulkJobs
from ..orchestrator.store.operations.reads import PostgresReads
from ..orchestrator.store.operations.sessions import PostgresSessionStore
from ..orchestrator.store.operations.verify import PostgresVerify
from ..orchestrator.store.postgres import PostgresStore, migrate
from ..participants.kit.participant import Participant
from ..schemas.registry import SchemaRegistry
from .ports import BulkJobStore, LeverStore, ReadsStore, VerifyStore
from .reads import Reads
from .sessions import StoredSessions

__all__ = ["bulk_job_store", "dead_letter_index", "event_store", "lever_store", "migrate", "postgres_reads",
           "postgres_sessions", "reads_store", "verify_store"]


def reads_store(pool: asyncpg.Pool, schema: str = "saga") -> ReadsStore:
    """The ``ReadsStore`` over the orchestrator's tables in ``schema``."""
    return PostgresReads(pool, schema)


def postgres_reads(pool: asyncpg.Pool, definitions: DefinitionRegistry, schemas: SchemaRegistry,
                   participants: Sequence[Participant] = (), schema: str = "saga") -> Reads:
    """The operator's reads over the orchestrator's tables in ``schema``."""
    return Reads(reads_store(pool, schema), definitions, schemas, participants)


def postgres_sessions(pool: asyncpg.Pool, schema: str = "saga") -> StoredSessions:
    """The console's sign-ins in ``<schema>.console_sessions`` (every console replica sees every sign-in)."""
    return StoredSessions(PostgresSessionStore(pool, schema))


def verify_store(pool: asyncpg.Pool, schema: str = "saga") -> VerifyStore:
    """What ``saga verify`` reads: the orchestrator's tables in ``schema``, every outbox, the declared effects."""
    return PostgresVerify(pool, schema)


def lever_store(pool: asyncpg.Pool, schema: str = "saga") -> LeverStore:
    """The operator audit and the levers' outbox rows in ``schema``, written together."""
    return PostgresLevers(pool, schema)


def bulk_job_store(pool: asyncpg.Pool, schema: str = "saga") -> BulkJobStore:
    """Bulk jobs and the sagas they select, in ``schema``."""
    return PostgresBulkJobs(pool, schema)


def event_store(pool: asyncpg.Pool, schema: str = "saga") -> PostgresStore:
    """The orchestrator's event store in ``schema``: what ``saga purge`` (its retention) and ``saga reproject``
    (the read model rebuilt from the events) work on."""
    return PostgresStore(pool, schema)


def dead_letter_index(pool: asyncpg.Pool, schema: str = "saga") -> DeadLetterIndex:
    """The dead letters the orchestrator indexes from saga.dlq, in ``schema``."""
    return PostgresDeadLetterIndex(pool, schema)
