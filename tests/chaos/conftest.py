"""A private Kafka + Postgres for the chaos tests that restart them (never the session's shared servers).

``private_servers`` (session): launcher settings of a private pair in a temporary folder, started once.
``private_stack_settings(servers, module)``: service settings on that pair with a fresh database and topic
prefix, so each test module starts from nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from rich.console import Console

from saga_orchestrator.cli.run_cmd import service_commands
from saga_orchestrator.infra import launcher
from saga_orchestrator.infra.launcher.private import free_port_block, private_settings
from saga_orchestrator.infra.settings import Settings
from tests.conftest import run_sync


@pytest.fixture(scope="session")
def private_servers(launcher_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """A private Kafka and Postgres (own folder, free ports) for this session's chaos tests."""
    servers = private_settings(launcher_settings, tmp_path_factory.mktemp("chaos-home"))
    try:
        run_sync(launcher.up(servers, Console(quiet=True)))
        yield servers
    finally:
        run_sync(launcher.down(servers, Console(quiet=True)))


async def _create_database(servers: Settings, name: str) -> str:
    conn = await asyncpg.connect(servers.dsn())
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return urlunsplit(urlsplit(servers.dsn())._replace(path=f"/{name}"))


def private_stack_settings(servers: Settings, module: str, **changes: object) -> Settings:
    """Service settings on the private servers: a fresh database and topic prefix, health ports on."""
    tag = uuid.uuid4().hex[:8]
    database = run_sync(_create_database(servers, f"chaos_{module}_{tag}"))
    settings = servers.model_copy(update={
        "database_url": database, "saga_topic_prefix": f"c{tag}.", "saga_topic_partitions": 4, **changes,
    })
    return settings.model_copy(update={"saga_health_port": free_port_block(len(service_commands(settings)))})
