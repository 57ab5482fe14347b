"""Run participants as a faust-streaming worker: consume ``<name>.commands``, reply via the outbox.

    python -m saga_orchestrator.participants.runner flight        # or hotel / payment / notification
    python -m saga_orchestrator.participants.runner flight hotel  # one worker hosting both

One process holds: a faust app with an agent per hosted participant, which hands the commands that arrived
together to the kit (one Postgres transaction per batch, ``participants.kit.handling``; every command of the
batch is acknowledged only after that commit, and faust commits acknowledged offsets every
``broker_commit_interval``), and each participant's own outbox relay publishing ``<schema>.outbox`` rows
(replies to ``<name>.results``, dead letters to ``saga.dlq``), woken right after each commit.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

import faust
import mode.loop

from ..infra import kafka_records
from ..infra.consumer_lag import partition_lags
from ..infra.db import create_pool
from ..infra.deployment import Deployment, load_deployment
from ..infra.health import configure as configure_health
from ..infra.health_server import run_health
from ..infra.inputs import refuse_unknown_records
from ..infra.kafka_admin import check_retention, ensure_topics
from ..infra.kafka_faust import faust_app
from ..infra.logging import configure_logging
from ..infra.settings import Settings
from ..infra.startup import retry_startup, start_over
from ..infra.tracing import configure_tracing
from ..schemas.headers import header_pairs
from ..schemas.records import ConsumedRecord
from ..schemas.topics import Topics
from .batching import natural_batches
from .host import DeliveryAbandoned, ParticipantHost
from .kit.ddl import ensure_participant_schema
from .kit.participant import Participant
from .registry import get_participant

log = logging.getLogger(__name__)

# Commands handled per transaction, and how long an idle actor waits to fill a batch (added latency).
BATCH_SIZE = 100
BATCH_WITHIN_S = 0.025


def app_id(name: str, settings: Settings) -> str:
    """Consumer-group id of the workers of participant ``name`` (the topic prefix keeps deployments apart)."""
    return f"{settings.saga_topic_prefix}saga-participant-{name}"


def worker_id(names: Sequence[str], settings: Settings) -> str:
    """Consumer-group id of the workers hosting participants ``names``: a lone participant's own
    (``app_id``), else the names joined by ``_`` (faust names a topic after it: no ``+`` there)."""
    return app_id("_".join(names), settings)


def hosted_participants(names: Sequence[str], deployment: Deployment | None = None) -> list[Participant]:
    """The participants one worker hosts, by the name ``deployment``'s app gives them, reference name or
    ``module:attribute``; ValueError says what is wrong (an unknown one, or one named twice)."""
    participants = [get_participant(name, deployment) for name in names]
    if len({participant.name for participant in participants}) != len(participants):
        raise ValueError(f"name each participant once: {' '.join(names)}")
    return participants


def check_inputs(participants: Sequence[Participant], deployment: Deployment) -> None:
    """Misconfigured when an input record a participant reads (``Participant.input_types``) is in no schema
    folder of the deployment's schema path: the worker would have to answer every such command
    ``Unprocessable``."""
    deployment.refuse_problems()
    needs = [(f"participant {participant.name}", record)
             for participant in participants for record in sorted(participant.input_types)]
    refuse_unknown_records(needs, deployment.schema_path)


def participant_topics(name: str, settings: Settings) -> list[str]:
    """Topics a participant worker reads or writes."""
    topics = Topics(settings.saga_topic_prefix)
    return [topics.commands(name), topics.results(name), topics.dlq]


def consumed(message: Any, value: bytes | None) -> ConsumedRecord:
    """A faust message as the kit takes it. ``message.headers``, not the event's: faust folds those into a
    dict, losing a repeated header."""
    return ConsumedRecord(topic=message.topic, partition=message.partition, offset=message.offset,
                          key=message.key, value=value, headers=header_pairs(message.headers))


def build_app(names: Sequence[str], settings: Settings, *, per_partition: bool = False,
              batch_size: int = BATCH_SIZE, batch_within_s: float = BATCH_WITHIN_S) -> faust.App:
    """The faust app of a worker hosting participants ``names`` (not started).

    Each participant gets its own agent on its ``<name>.commands`` topic, its own pool and its own outbox
    relay (``ParticipantHost``); the participants of one worker share its Kafka consumer, event loop and
    health endpoint, which costs less CPU than a process each (``saga run all`` and SAGA_PARTICIPANTS).

    An actor takes up to ``batch_size`` commands, those that arrived while it handled the previous batch
    (``participants.batching``: after a large batch it lets the next one fill for up to ``batch_within_s``),
    and handles them in one transaction (``participants.kit.handling``), in their order; 1 handles each on
    its own.

    ``per_partition`` runs one agent actor per assigned partition (faust's isolated partitions): commands
    of one saga (one key, one partition) stay in order while partitions proceed in parallel. Without it
    (the default) one actor handles every assigned partition in turn, in batches that take the commands of
    all partitions: that costs less CPU per command than many small per-partition batches.
    """
    kafka_records.install()  # a record batch no consumer could read past becomes a record to dead-letter
    participants = hosted_participants(names, load_deployment(settings, saga_types=False))
    hosted = [participant.name for participant in participants]
    ident = worker_id(hosted, settings)
    datadir = settings.saga_home / "faust" / ident
    datadir.mkdir(parents=True, exist_ok=True)  # faust creates only the last level itself
    app = faust_app(
        ident,
        settings.kafka(),
        settings.topic_layout(),
        value_serializer="raw",
        key_serializer="raw",
        web_enabled=False,
        datadir=str(datadir),
        topic_partitions=settings.saga_topic_partitions,
        consumer_auto_offset_reset="earliest",
        broker_commit_interval=1.0,
        consumer_max_fetch_size=kafka_records.PARTITION_FETCH_BYTES,
        # A killed worker's partitions move to the others after this (faust's default is 60 s).
        broker_session_timeout=10.0,
    )
    hosts = [ParticipantHost(participant, settings, should_stop=lambda: bool(app.should_stop))
                for participant in participants]
    for host in hosts:
        # A lone participant's agent keeps its name (faust names the agent's internal state after it).
        agent_name = f"{ident}-commands" if len(hosts) == 1 else f"{ident}-{host.participant.name}-commands"
        _add_agent(app, host, agent_name, per_partition=per_partition, batch_size=batch_size,
                   batch_within_s=batch_within_s)
    label = "+".join(hosted)
    health = configure_health(label)
    health_stop = asyncio.Event()

    async def start_hosts() -> None:
        # The relays run even when no command arrives (they flush replies left behind); Postgres being away
        # at start is waited out, never a crash of the worker.
        for host in hosts:
            await retry_startup(host.start, f"start participant {host.participant.name}")

    async def watch_health() -> None:
        await run_health(health, settings.kafka(), settings.dsn(), settings.saga_health_host,
                         settings.saga_health_port, health_stop)

    async def report_lag() -> None:  # what faust's consumer already knows, no request: cheap enough per scrape
        consumer = app.consumer if health.consuming else None
        lags = {} if consumer is None else await partition_lags(consumer.assignment(), consumer.highwater,
                                                                  consumer.position)
        health.consumer_lags(ident, lags)

    health.before_scrape.append(report_lag)
    app.task(start_hosts)
    app.task(watch_health)

    commands_of = [(host, host.topics.commands(host.participant.name)) for host in hosts]

    async def on_partitions_assigned(sender: Any, assigned: Any, **kwargs: Any) -> None:
        health.consuming = True  # the worker's consumer is in its group: GET /ready may say so
        for host, commands in commands_of:
            host.owned_partitions = frozenset(tp.partition for tp in assigned if tp.topic == commands)

    async def on_partitions_revoked(sender: Any, revoked: Any, **kwargs: Any) -> None:
        for host, commands in commands_of:  # their replies are the next owner's to relay
            gone = {tp.partition for tp in revoked if tp.topic == commands}
            host.owned_partitions = frozenset(host.owned_partitions or ()) - gone

    app.on_partitions_assigned.connect(on_partitions_assigned, weak=False)  # type: ignore[arg-type]
    app.on_partitions_revoked.connect(on_partitions_revoked, weak=False)  # type: ignore[arg-type]

    async def on_before_shutdown(sender: Any, *args: Any, signal: Any, **kwargs: Any) -> None:
        health_stop.set()
        await asyncio.gather(*(host.stop() for host in hosts))

    # weak=False: the signal holds receivers weakly by default and this closure has no other owner.
    # mode's NamedArg("BaseSignalT") alias does not resolve for mypy, hence the ignore.
    app.on_before_shutdown.connect(on_before_shutdown, weak=False)  # type: ignore[arg-type]
    # handy for in-process tests
    app.participant_hosts = {r.participant.name: r for r in hosts}  # type: ignore[attr-defined]
    return app


def _add_agent(app: faust.App, host: ParticipantHost, agent_name: str, *, per_partition: bool,
               batch_size: int, batch_within_s: float) -> None:
    """The agent that hands ``host``'s participant the batches of commands from its topic."""
    name = host.participant.name
    commands = app.topic(
        host.topics.commands(name),
        key_type=bytes,
        value_type=bytes,
        partitions=host.settings.saga_topic_partitions,
    )

    def abandoned(message: Any, record: ConsumedRecord, error: DeliveryAbandoned) -> None:
        # Its offset stays uncommitted (faust commits only up to the first unacked offset), so it is
        # redelivered after the restart. Faust's shutdown waits until every tracked message is acked, which
        # this one never will be: stop tracking it (private attribute, pinned faust).
        app.consumer._unacked_messages.discard(message)  # type: ignore[attr-defined]
        log.warning("delivery left for redelivery", extra={
            "participant": name, "topic": record.topic, "partition": record.partition,
            "offset": record.offset, "error": str(error)})

    async def consume_batches(stream: Any) -> None:
        # Manual acks: faust's own iterators ack an event in a ``finally`` around their ``yield``, so an event
        # whose processing raised (e.g. Postgres down while the worker stops) would be acked and its offset
        # committed unprocessed. natural_batches yields events unacknowledged: each is acked after its batch
        # committed. message.headers, not event.headers: faust folds those into a dict, losing a repeat.
        async for events in natural_batches(stream, batch_size, batch_within_s):
            batch = [consumed(event.message, event.value) for event in events]
            try:
                await host.process_batch(batch)
            except DeliveryAbandoned as error:
                for event, item in zip(events, batch, strict=True):
                    abandoned(event.message, item, error)
                continue
            for event in events:
                event.ack()

    app.agent(commands, name=agent_name, isolated_partitions=per_partition)(consume_batches)


async def prepare(name: str, settings: Settings) -> None:
    """Create the participant's topics (before faust subscribes) and its tables; idempotent."""
    participant = get_participant(name, load_deployment(settings, saga_types=False))
    kafka = settings.kafka()
    await kafka.check()
    await ensure_topics(kafka, participant_topics(participant.name, settings), settings.topic_layout())
    await check_retention(kafka, [Topics(settings.saga_topic_prefix).commands(participant.name)],
                          "saga_participant_retention_hours", settings.saga_participant_retention_hours)
    pool = await create_pool(settings.dsn(), 1)
    try:
        await ensure_participant_schema(pool, participant)
    finally:
        await pool.close()


def run_participant(names: Sequence[str], settings: Settings | None = None) -> None:
    """Run one worker hosting participants ``names`` (reference names or ``module:attribute`` paths) until
    SIGINT/SIGTERM (blocking)."""
    settings = settings or Settings()
    configure_logging(settings.saga_log_level)
    deployment = load_deployment(settings, saga_types=False)
    hosted = hosted_participants(names, deployment)
    check_inputs(hosted, deployment)
    configure_tracing("saga-" + "+".join(participant.name for participant in hosted))
    # uvloop for the worker (and faust's consumer thread): asyncio's own bookkeeping is otherwise the
    # largest single cost of a participant.
    mode.loop.use("uvloop")
    label = "+".join(names)
    # Kafka or Postgres restarting while this worker starts is waited out (SIGTERM still ends the wait).
    asyncio.run(retry_startup(lambda: _prepare_all(names, settings), f"prepare participant {label}"))
    app = build_app(names, settings, batch_within_s=settings.saga_participant_batch_ms / 1000)
    worker = faust.Worker(
        app,
        loglevel=settings.saga_log_level,
        quiet=True,
        override_logging=False,  # keep the structured (JSON) logging configured above
        redirect_stdouts=False,
    )
    worker.spinner = None  # it writes terminal escape codes to stdout even when quiet
    started_up = _watch_startup(app)
    try:
        worker.execute_from_commandline()
    except SystemExit as exit_:
        # Faust's own start (producer and consumer bootstrap) has no retry: Kafka going away between
        # prepare() and that start makes the worker exit. Start over instead (a few times).
        if exit_.code and not started_up():
            start_over(f"participant {label}")
        raise


async def _prepare_all(names: Sequence[str], settings: Settings) -> None:
    for name in names:
        await prepare(name, settings)


def _watch_startup(app: faust.App) -> Callable[[], bool]:
    """A flag that turns true once the worker finished starting (faust's on_startup_finished)."""
    finished = False
    worker_hook = app.on_startup_finished  # set by faust.Worker

    async def on_startup_finished() -> None:
        nonlocal finished
        finished = True
        if worker_hook is not None:
            await worker_hook()

    app.on_startup_finished = on_startup_finished
    return lambda: finished


def main(argv: list[str] | None = None) -> None:
    """Command-line entry: ``python -m saga_orchestrator.participants.runner NAME [NAME ...]`` (several: one worker)."""
    args = sys.argv[1:] if argv is None else argv
    if not args:
        raise SystemExit("usage: python -m saga_orchestrator.participants.runner "
                         "{flight|hotel|payment|notification} [...]")
    run_participant(args)


if __name__ == "__main__":
    main()
