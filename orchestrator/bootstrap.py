"""Composition root of the orchestrator and its relay: the one place that opens connections."""

from __future__ import annotations

import asyncio
import importlib
import logging
import time

import asyncpg

from infra.db import create_pool, migrate
from infra.kafka_admin import ensure_topics
from infra.settings import Settings
from orchestrator.consumer import OrchestratorConsumer
from orchestrator.domain.definition import DefinitionRegistry, SagaDefinition
from orchestrator.parsing import RecordParser
from orchestrator.service import SagaService
from orchestrator.store.postgres import PostgresStore
from orchestrator.timers import TimerScheduler
from outbox.relay import OutboxRelay
from schemas.registry import default_registry
from schemas.topics import Topics

log = logging.getLogger("saga.bootstrap")

OUTBOX_TABLE = "saga.outbox"


def clock_ms() -> int:
    """Wall-clock time in epoch milliseconds (the only clock the core ever sees)."""
    return time.time_ns() // 1_000_000


def import_object(path: str) -> object:
    """Import ``module:attribute``, with an error that names what is missing."""
    module_name, _, attribute = path.strip().partition(":")
    if not module_name or not attribute:
        raise ValueError(f"{path!r} is not of the form module:attribute")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ValueError(f"module {module_name} has no attribute {attribute}") from None


def definitions(settings: Settings | None = None) -> DefinitionRegistry:
    """The saga definitions named by SAGA_DEFINITIONS."""
    current = settings or Settings()
    registry = DefinitionRegistry()
    for path in current.saga_definitions.split(","):
        if not path.strip():
            continue
        definition = import_object(path)
        if not isinstance(definition, SagaDefinition):
            raise ValueError(f"{path} is not a SagaDefinition")
        registry.register(definition)
    return registry


def participants_of(registry: DefinitionRegistry) -> tuple[str, ...]:
    """Every participant a registered definition sends commands to."""
    names = {
        step.participant
        for saga_type in registry.types()
        for version in registry.versions(saga_type)
        for step in registry.get(saga_type, version).steps
    }
    return tuple(sorted(names))


async def prepare(settings: Settings) -> tuple[DefinitionRegistry, Topics, tuple[str, ...]]:
    """Load definitions and create the topics they need (idempotent)."""
    registry = definitions(settings)
    topics = Topics(settings.saga_topic_prefix)
    participants = participants_of(registry)
    await ensure_topics(settings.kafka_servers(), topics.all(participants), settings.saga_topic_partitions)
    return registry, topics, participants


class DeploymentMismatch(RuntimeError):
    """The database belongs to a deployment with another topic prefix."""


async def claim_deployment(pool: asyncpg.Pool, topic_prefix: str) -> None:
    """Record this deployment's topic prefix in the database, or refuse one claimed by another prefix."""
    await pool.execute("INSERT INTO saga.deployment (topic_prefix) VALUES ($1) ON CONFLICT DO NOTHING",
                       topic_prefix)
    owner = await pool.fetchval("SELECT topic_prefix FROM saga.deployment")
    if owner != topic_prefix:
        raise DeploymentMismatch(
            f"this database belongs to the deployment with SAGA_TOPIC_PREFIX={owner!r}, not {topic_prefix!r}; "
            "use that prefix or another DATABASE_URL"
        )


async def run_orchestrator(settings: Settings, stop: asyncio.Event, with_relay: bool = False) -> None:
    """Consume saga topics and fire timers until ``stop``; optionally relay the outbox in-process."""
    registry, topics, participants = await prepare(settings)
    pool = await create_pool(settings.dsn(), settings.saga_db_pool_size)
    try:
        await migrate(pool)
        await claim_deployment(pool, settings.saga_topic_prefix)
        service = SagaService(PostgresStore(pool), registry, topics, clock_ms)
        parser = RecordParser(topics, registry, default_registry(), participants)
        consumer = OrchestratorConsumer(service, parser, settings.kafka_servers(),
                                        group_id=f"{settings.saga_topic_prefix}saga-orchestrator",
                                        concurrency=max(1, settings.saga_db_pool_size - 2))
        tasks = [consumer.run(stop), TimerScheduler(service).run(stop)]
        if with_relay:
            tasks.append(OutboxRelay(pool, OUTBOX_TABLE, settings.kafka_servers()).run(stop))
        log.info("orchestrator running", extra={"definitions": list(registry.types()),
                                                "participants": list(participants)})
        await asyncio.gather(*tasks)
    finally:
        await pool.close()


async def run_relay(settings: Settings, stop: asyncio.Event) -> None:
    """Publish the orchestrator's outbox until ``stop``."""
    await prepare(settings)
    pool = await create_pool(settings.dsn(), 2)
    try:
        await migrate(pool)
        await OutboxRelay(pool, OUTBOX_TABLE, settings.kafka_servers()).run(stop)
    finally:
        await pool.close()
