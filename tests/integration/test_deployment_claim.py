"""One database serves one deployment: a second topic prefix is refused with a message that says why."""

from __future__ import annotations

import re

import asyncpg
import pytest

from saga_orchestrator.orchestrator.store.postgres import DeploymentMismatch, PostgresStore, migrate


async def test_the_first_prefix_claims_the_database_and_another_is_refused(database_url: str) -> None:
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        await migrate(pool)
        await PostgresStore(pool).claim_deployment("blue.")
        await PostgresStore(pool).claim_deployment("blue.")  # a restart of the same deployment
        with pytest.raises(DeploymentMismatch, match=re.escape("SAGA_TOPIC_PREFIX='blue.', not 'green.'")):
            await PostgresStore(pool).claim_deployment("green.")
    finally:
        await pool.close()
