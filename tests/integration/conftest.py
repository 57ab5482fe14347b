"""Fixtures of the integration tests (the session's infrastructure comes from tests/conftest.py)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from saga_orchestrator.infra.db import create_pool
from saga_orchestrator.orchestrator.store.postgres import PostgresStore, migrate
from saga_orchestrator.outbox.table import outbox_table_sql


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[PostgresStore]:
    """A store on the module's database, emptied of sagas."""
    pool = await create_pool(database_url, 4)
    await migrate(pool)
    await pool.execute("TRUNCATE saga.events, saga.saga_summary, saga.outbox, saga.timers, saga.inbox")
    yield PostgresStore(pool)
    await pool.close()


async def fresh_outbox(pool: asyncpg.Pool, name: str) -> str:
    """A new outbox table (its own schema ``<name>_<hex>``, so relays of different tests share no lease or row)."""
    schema = f"{name}_{uuid.uuid4().hex[:8]}"
    await pool.execute(outbox_table_sql(schema))
    return f"{schema}.outbox"


async def fresh_topic(bootstrap: str, prefix: str, partitions: int) -> str:
    """A new topic ``<prefix>-<hex>`` with ``partitions`` partitions."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
    finally:
        await admin.close()
    return name
