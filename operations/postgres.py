"""The operations wing over Postgres: its store adapters built from a pool and the orchestrator's schema, for the
faces (console, command line) that must not reach into the store themselves."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from ..orchestrator.domain.definition import DefinitionRegistry
from ..orchestrator.store.operations.reads import PostgresReads
from ..participants.kit.participant import Participant
from ..schemas.registry import SchemaRegistry
from .ports import ReadsStore
from .reads import Reads


def reads_store(pool: asyncpg.Pool, schema: str = "saga") -> ReadsStore:
    """The ``ReadsStore`` over the orchestrator's tables in ``schema``."""
    return PostgresReads(pool, schema)


def postgres_reads(pool: asyncpg.Pool, definitions: DefinitionRegistry, schemas: SchemaRegistry,
                   participants: Sequence[Participant] = (), schema: str = "saga") -> Reads:
    """The operator's reads over the orchestrator's tables in ``schema``."""
    return Reads(reads_store(pool, schema), definitions, schemas, participants)
