"""``saga demo`` whose orchestrator cannot run: it stops waiting at once and prints the service's own reason,
instead of waiting out its timeout and reporting every saga as not terminal."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import asyncpg
import pytest

from saga_orchestrator.orchestrator.store.postgres import PostgresStore, migrate
from tests.conftest import run_sync

pytestmark = pytest.mark.integration


async def claim_for_another_deployment(database_url: str) -> None:
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    try:
        await migrate(pool)
        await PostgresStore(pool).claim_deployment("another-deployment.")
    finally:
        await pool.close()


def test_a_service_that_exits_ends_the_demo_with_its_reason(kafka_bootstrap: str, database_url: str,
                                                             topic_prefix: str, tmp_path: Path) -> None:
    run_sync(claim_for_another_deployment(database_url))
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "DATABASE_URL": database_url,
           "SAGA_TOPIC_PREFIX": topic_prefix, "SAGA_HOME": str(tmp_path), "SAGA_HEALTH_PORT": "0",
           "COLUMNS": "400"}
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "saga_orchestrator.cli", "demo"], env=env, capture_output=True,
                            text=True, timeout=110)
    elapsed = time.monotonic() - started
    assert result.returncode == 1, result.stdout + result.stderr
    assert "orchestrator exited with code" in result.stdout, result.stdout
    assert "SAGA_TOPIC_PREFIX='another-deployment.'" in result.stdout, result.stdout
    assert elapsed < 60, f"took {elapsed:.0f} s: the demo waited instead of noticing the exit"
