"""Composition root of the orchestrator and its relay: ``build`` wires the parts on an open pool (tests call it
with their own settings, pool and clock), ``run_orchestrator`` and ``run_relay`` are the processes' lifecycles,
the one place that opens connections."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import asyncpg

from ..infra import kafka_records
from ..infra.chores import Chore
from ..infra.db import create_pool
from ..infra.deployment import Deployment, load_deployment
from ..infra.health import ServiceHealth
from ..infra.health_server import health_running
from ..infra.inputs import refuse_unknown_records
from ..infra.kafka_admin import check_retention, ensure_topics
from ..infra.misconfigured import Misconfigured
from ..infra.settings import Settings
from ..infra.startup import StartupStopped, retry_startup
from ..operations.bulk_jobs import BulkRunner
from ..outbox.depth import outbox_gauges, quiet_refresh
from ..outbox.relay import MAX_POLL_MS, WOKEN_MAX_POLL_MS, OutboxRelay
from ..schemas.registry import default_registry
from ..schemas.topics import Topics
from .assignment import GroupView, shapes_of
from .consumer import OrchestratorConsumer
from .dead_letter_index import DeadLetterIndexer
from .domain.definition import DefinitionRegistry, SagaDefinition
from .domain.deploys import stranded
from .domain.errors import DomainError
from .inbound import RecordParser
from .observe import SagaMetrics
from .outbound import Settled
from .ports import ShapeStore
from .retention import inbox_pruner, retention_policy
from .service import SagaService
from .signals import TableSignals
from .store.dead_letters import PostgresDeadLetterIndex
from .store.operations.bulk_jobs import PostgresBulkJobs
from .store.operations.reads import PostgresReads
from .store.operations.signals import PostgresSignals
from .store.postgres import PostgresStore, migrate
from .timers import TIMERS_COMPONENT, TimerScheduler

log = logging.getLogger("saga.bootstrap")

OUTBOX_TABLE = "saga.outbox"
# Transactions the orchestrator runs at once (its polls, split into chunks). More overlap Postgres with the
# decisions, but under load every poll was split into as many chunks, each paying a transaction's fixed cost:
# at 200 sagas/s on 2 cores (bench/throughput, 3 runs each), 6 at once ran the stack at 145-175% CPU with p99
# 1.1-1.9 s, 2 at once at 151-158% with p99 1.0-1.3 s.
TRANSACTIONS_AT_ONCE = 2

# Timers stay held while Kafka or Postgres is down and this long after both are back: a step timeout
# measures the participant, not an outage of the platform, and the replies that waited in outboxes need a
# moment to arrive before a timeout may call them missing.
TIMER_HOLD_AFTER_OUTAGE_S = 10.0
# ... and this long after the consumer (re)joined its group: the replies that piled up meanwhile come first.
TIMER_HOLD_AFTER_JOIN_S = 3.0


def timer_hold(consumer: OrchestratorConsumer, health: ServiceHealth,
               clock: Callable[[], float] = time.monotonic) -> Callable[[], bool]:
    """The timer scheduler's ``hold``: True while the consumer is not consuming or only just started to,
    and while Kafka or Postgres is down or only just came back, or the service's messages or relay wait out a
    platform fault (a database that answers probes may still refuse writes: out of disk)."""
    consuming_since: float | None = None

    def hold() -> bool:
        nonlocal consuming_since
        if not consumer.consuming:
            consuming_since = None
            return True
        if consuming_since is None:
            consuming_since = clock()
        joined_recently = clock() - consuming_since < TIMER_HOLD_AFTER_JOIN_S
        return joined_recently or health.outage_within(TIMER_HOLD_AFTER_OUTAGE_S, ignoring=(TIMERS_COMPONENT,))

    return hold


def clock_ms() -> int:
    """Wall-clock time in epoch milliseconds (the only clock the core ever sees)."""
    return time.time_ns() // 1_000_000


def definitions(settings: Settings | None = None) -> DefinitionRegistry:
    """The saga definitions of the deployment (``infra.deployment``); Misconfigured names the setting to fix."""
    current = settings or Settings()
    return drained(registry_of(load_deployment(current)), current.saga_draining)


def registry_of(deployment: Deployment) -> DefinitionRegistry:
    """The definition registry of ``deployment``'s saga types; Misconfigured names the setting that named one
    that is no SagaDefinition or that clashes with another."""
    registry = DefinitionRegistry()
    try:
        for reference, definition in deployment.saga_types.items():
            if not isinstance(definition, SagaDefinition):
                raise ValueError(f"{reference} is not a SagaDefinition")
            registry.register(definition)
    except (ValueError, DomainError) as error:
        raise Misconfigured(f"{deployment.named_by}: {error}") from None
    return registry


def drained(registry: DefinitionRegistry, saga_draining: str) -> DefinitionRegistry:
    """``registry`` with the versions SAGA_DRAINING names (``type:version``, comma-separated) taking no new
    starts; Misconfigured names the setting and the entry that is malformed or not deployed."""
    for entry in (part.strip() for part in saga_draining.split(",")):
        if not entry:
            continue
        saga_type, _, version = entry.rpartition(":")
        if not saga_type or not version.isdigit():
            raise Misconfigured(f"SAGA_DRAINING={saga_draining!r}: {entry!r} is no saga_type:version (e.g. trip:2)")
        try:
            registry.drain(saga_type, int(version))
        except DomainError as error:
            raise Misconfigured(f"SAGA_DRAINING={saga_draining!r}: {error}") from None
    return registry


def checked_definitions(settings: Settings) -> DefinitionRegistry:
    """``definitions``, each of whose input records is in the deployment's schema path (else Misconfigured): the
    orchestrator would refuse every start of a type it cannot read. With an app, also what
    ``infra.app.refuse_problems`` checks: every participant a saga names is served, has the actions it names,
    and every record is written."""
    deployment = load_deployment(settings)
    registry = drained(registry_of(deployment), settings.saga_draining)
    deployment.refuse_problems()
    needs = [(f"saga type {saga_type} (version {version})", registry.get(saga_type, version).input_schema)
             for saga_type in registry.types() for version in registry.versions(saga_type)]
    refuse_unknown_records(needs, deployment.schema_path)
    return registry


class DeployRefused(Misconfigured):
    """The definitions this orchestrator registers would strand running sagas: one line per problem."""


async def check_running_sagas(store: ShapeStore, registry: DefinitionRegistry, allow_stranding: bool) -> None:
    """Refuse (DeployRefused) to run ``registry`` over sagas it would strand, unless ``allow_stranding`` (then each
    problem is logged and those sagas are quarantined at their next message); then keep its shapes, so that a
    later deploy can name what it changes."""
    running = await store.running_shapes()
    recorded = await store.recorded_shapes({group.fingerprint for group in running if group.fingerprint})
    problems = stranded(registry, running, recorded)
    if problems and not allow_stranding:
        raise DeployRefused("\n".join([
            "this deploy would strand running sagas (SAGA_ALLOW_STRANDING=true starts anyway and quarantines them):",
            *problems]))
    for problem in problems:
        log.warning("deploy strands running sagas", extra={"problem": problem})
    await store.record_shapes(registry.definitions())


def participants_of(registry: DefinitionRegistry) -> tuple[str, ...]:
    """Every participant a registered definition sends commands to."""
    names = {
        step.participant
        for saga_type in registry.types()
        for version in registry.versions(saga_type)
        for step in registry.get(saga_type, version).steps
        if not step.waits
    }
    return tuple(sorted(names))


async def prepare(settings: Settings) -> tuple[DefinitionRegistry, Topics, tuple[str, ...]]:
    """Load definitions (checked: ``checked_definitions``) and create the topics they need (idempotent)."""
    registry = checked_definitions(settings)
    topics = Topics(settings.saga_topic_prefix)
    participants = participants_of(registry)
    kafka = settings.kafka()
    await kafka.check()
    await ensure_topics(kafka, topics.all(participants), settings.topic_layout())
    await check_retention(kafka,
                          [topics.start, topics.control, *(topics.results(name) for name in participants)],
                          "saga_inbox_retention_hours", settings.saga_inbox_retention_hours)
    return registry, topics, participants


@dataclass
class Orchestrator:
    """The orchestrator's parts, wired and not yet running: ``run`` them until stopped."""

    service: SagaService
    consumer: OrchestratorConsumer
    timers: TimerScheduler
    relay: OutboxRelay | None
    chores: list[Chore]
    dead_letters: DeadLetterIndexer | None = None

    async def run(self, stop: asyncio.Event) -> None:
        """Consume, fire timers, relay, index saga.dlq and do the chores until ``stop``."""
        tasks = [self.consumer.run(stop), self.timers.run(stop), *(chore.run(stop) for chore in self.chores)]
        if self.dead_letters is not None:
            tasks.append(self.dead_letters.run(stop))
        if self.relay is not None:
            tasks.append(self.relay.run(stop))
        await asyncio.gather(*tasks)


def build(settings: Settings, pool: asyncpg.Pool, registry: DefinitionRegistry, health: ServiceHealth, *,
          with_relay: bool = False, clock: Callable[[], int] = clock_ms) -> Orchestrator:
    """Wire the orchestrator on an open pool (pure wiring: nothing connects or starts here).

    ``with_relay`` adds the relay of its outbox, woken by every commit of the service (so it never polls for
    the orchestrator's own rows); ``clock`` is the only clock the core sees.
    """
    kafka_records.install()  # a record batch no consumer could read past becomes a record to dead-letter
    topics = Topics(settings.saga_topic_prefix)
    participants = participants_of(registry)
    store = PostgresStore(pool, topic_partitions=settings.saga_topic_partitions)
    consumers: list[OrchestratorConsumer] = []  # set below: the relay publishes the shards of its partitions
    relay = (OutboxRelay(pool, OUTBOX_TABLE, settings.kafka(), min_poll_ms=25, max_poll_ms=WOKEN_MAX_POLL_MS,
                         shards=lambda: consumers[0].owned_partitions if consumers else None,
                         poison_attempts=settings.saga_poison_attempts)
             if with_relay else None)
    metrics = SagaMetrics(health)
    scheduler: list[TimerScheduler] = []  # set below: the service wakes it when it arms a timer

    def settled(done: Settled) -> None:
        metrics.observe(done)
        for timers_of in scheduler:
            timers_of.armed([timer.due_at for decision in done.decisions for timer in decision.timers])

    group = GroupView()  # what the orchestrators of the group serve, learnt at each assignment
    service = SagaService(store, registry, topics, clock, on_commit=relay.wake if relay is not None else None,
                          on_settled=settled, poison_attempts=settings.saga_poison_attempts,
                          on_conflict=metrics.conflicts.inc, served_elsewhere=group.serves)
    consumer = OrchestratorConsumer(service, RecordParser(topics, registry, default_registry(), participants),
                                    settings.kafka(), group_id=f"{settings.saga_topic_prefix}saga-orchestrator",
                                    concurrency=max(1, min(TRANSACTIONS_AT_ONCE, settings.saga_db_pool_size - 2)),
                                    fetch_wait_ms=settings.saga_fetch_wait_ms,
                                    adaptive_fetch=settings.saga_fetch_pacing == "adaptive",
                                    served=shapes_of(registry.definitions()),
                                    group_view=group)
    consumers.append(consumer)
    # Not consuming yet (a restart waits for the group to drop the old member): replies may be waiting
    # unread, so a step timeout now would blame participants for our own downtime.
    timers = TimerScheduler(service, hold=timer_hold(consumer, health), horizon=lambda: consumer.read_horizon_ms,
                            clock_ms=clock, partitions=lambda: consumer.owned_partitions)
    scheduler.append(timers)
    chores = []
    if settings.saga_inbox_retention_hours:
        chores.append(inbox_pruner(store, settings.saga_inbox_retention_hours * 3600))
    if settings.saga_retention_days:
        chores.append(retention_policy(store, registry, topics, settings.saga_retention_days * 86_400))
    chores.append(BulkRunner(PostgresBulkJobs(pool), registry, topics, settings.saga_topic_partitions,
                             on_queued=relay.wake if relay is not None else None).chore())

    async def count_sagas() -> None:  # the sagas-by-status gauge, from the read model, before each scrape
        counts = await store.count_by_status(timeout_s=2)
        health.sagas.clear()
        for status, sagas in counts.items():
            health.sagas.labels(status=status).set(sagas)

    async def report_lag() -> None:  # the consumer's own state, no request: cheap enough per scrape
        health.consumer_lags(consumer.group_id, await consumer.partition_lags())

    health.before_scrape.extend([count_sagas, report_lag])
    signals = TableSignals(PostgresSignals(pool), health, settings.saga_compensation_alert_minutes * 60)
    chores.append(outbox_gauges(pool, [OUTBOX_TABLE], health))
    chores.append(quiet_refresh("orchestrator gauges", signals.refresh))
    dead_letters = DeadLetterIndexer(PostgresDeadLetterIndex(pool), PostgresReads(pool), settings.kafka(),
                                    topics.dlq)
    return Orchestrator(service, consumer, timers, relay, chores, dead_letters)


async def run_orchestrator(settings: Settings, stop: asyncio.Event, with_relay: bool = False) -> None:
    """Consume saga topics and fire timers until ``stop``; optionally relay the outbox in-process.

    Kafka or Postgres being away at start or later is waited out, never a reason to exit.
    """
    async with health_running("orchestrator", settings) as health:
        try:
            registry, _, participants = await retry_startup(lambda: prepare(settings), "create topics", stop)
            pool = await retry_startup(lambda: create_pool(settings.dsn(), settings.saga_db_pool_size,
                                                               application_name="saga-orchestrator"),
                                       "open the database pool", stop)
        except StartupStopped:
            return
        try:
            await retry_startup(lambda: migrate(pool), "migrate", stop)
            await retry_startup(lambda: PostgresStore(pool).claim_deployment(settings.saga_topic_prefix),
                                "claim deployment", stop)
            await retry_startup(lambda: check_running_sagas(PostgresStore(pool), registry,
                                                            settings.saga_allow_stranding),
                                "check the running sagas against the definitions", stop)
            orchestrator = build(settings, pool, registry, health, with_relay=with_relay)
            log.info("orchestrator running", extra={"definitions": list(registry.types()),
                                                    "participants": list(participants)})
            await orchestrator.run(stop)
        except StartupStopped:
            return
        finally:
            await pool.close()


async def run_relay(settings: Settings, stop: asyncio.Event) -> None:
    """Publish the orchestrator's outbox until ``stop``; outages are waited out."""
    async with health_running("relay", settings) as health:
        try:
            await retry_startup(lambda: prepare(settings), "create topics", stop)
            pool = await retry_startup(lambda: create_pool(settings.dsn(), 2, application_name="saga-relay"),
                                       "open the database pool", stop)
        except StartupStopped:
            return
        try:
            await retry_startup(lambda: migrate(pool), "migrate", stop)
            health.consuming = True  # no consumer to wait for: ready once Kafka and Postgres answer
            poll_ms = settings.saga_relay_poll_ms
            every_shard = range(settings.saga_topic_partitions)  # a relay of its own: every shard it can take
            await OutboxRelay(pool, OUTBOX_TABLE, settings.kafka(), min_poll_ms=poll_ms,
                              max_poll_ms=max(poll_ms, MAX_POLL_MS), shards=lambda: every_shard,
                              poison_attempts=settings.saga_poison_attempts).run(stop)
        except StartupStopped:
            return
        finally:
            await pool.close()
