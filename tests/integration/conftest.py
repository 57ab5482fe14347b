"""Fixtures of the integration tests (the session's infrastructure comes from tests/conftest.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from saga_orchestrator.infra.db import create_pool
from saga_orchestrator.orchestrator.store.postgres import PostgresStore, migrate


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[PostgresStore]:
    """A store on the module's database, emptied of sagas."""
    pool = await create_pool(database_url, 4)
    await migrate(pool)
    await pool.execute("TRUNCATE saga.events, saga.saga_summary, saga.outbox, saga.timers, saga.inbox")
    yield PostgresStore(pool)
    await pool.close()
