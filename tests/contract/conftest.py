"""Fixtures the contract suites share: a migrated orchestrator schema on the module's own database."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from saga_orchestrator.infra.db import create_pool
from saga_orchestrator.orchestrator.store.postgres import migrate


@pytest.fixture(scope="module")
async def pg_pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    """A pool on the module's database with the orchestrator's schema migrated."""
    pool = await create_pool(database_url, 4)
    await migrate(pool)
    yield pool
    await pool.close()
