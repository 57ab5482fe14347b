"""Where a saga's time goes: the latency of every hop a step takes, from timestamps the run left behind.

A step is decided by the orchestrator (``StepCommandSent`` in the event store), published by the relay (the
command's Kafka timestamp), handled by the participant (``processed_at`` of its idempotency key), answered
through the participant's outbox (the reply's Kafka timestamp) and recorded by the orchestrator
(``StepSucceeded``); a saga starts with the StartSaga record and its ``SagaStarted`` event. Kafka timestamps
are the producer's send time; Postgres times are transaction start times (``now()``), so a transaction's
own duration counts in the hop after it. Every clock is this machine's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypeVar

import asyncpg
from aiokafka import TopicPartition
from rich.table import Table

from bench.probes import percentile
from saga_orchestrator.infra.kafka_clients import KafkaClients
from saga_orchestrator.participants.registry import get_participant
from saga_orchestrator.participants.trip import PARTICIPANTS
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.event_types import SagaStarted, StepCommandSent, StepSucceeded
from saga_orchestrator.schemas.message_types import CommandKind
from saga_orchestrator.schemas.registry import default_registry
from saga_orchestrator.schemas.topics import Topics

STEP_MESSAGES = wire.STEP_COMMAND, wire.STEP_RESULT
HOPS = (
    "orchestrator: StartSaga on Kafka → SagaStarted",
    "relay: StepCommandSent → command on Kafka",
    "participant: command on Kafka → handled",
    "participant's relay: handled → reply on Kafka",
    "orchestrator: reply on Kafka → StepSucceeded",
)

Key = tuple[str, str]  # (saga_id, step)
K = TypeVar("K")


async def first_timestamps(kafka: KafkaClients, topics: Iterable[str], saga_ids: set[str]) -> dict[str, dict[Key, int]]:
    """For each topic, the Kafka timestamp (ms) of the first record per (saga id, step) of ``saga_ids``
    (step "" for a StartSaga)."""
    consumer = kafka.consumer(enable_auto_commit=False, group_id=None)
    await consumer.start()
    try:
        cluster = await consumer._client.fetch_all_metadata()
        names = list(topics)
        partitions = [TopicPartition(t, p) for t in names for p in cluster.partitions_for_topic(t) or ()]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        found: dict[str, dict[Key, int]] = {name: {} for name in names}
        registry = default_registry()
        while [tp for tp, end in ends.items() if await consumer.position(tp) < end]:
            for tp, records in (await consumer.getmany(timeout_ms=500, max_records=10_000)).items():
                for record in records:
                    saga_id = record.key.decode() if record.key else ""
                    if saga_id not in saga_ids or record.value is None:
                        continue
                    step = ""
                    if not tp.topic.endswith(".start"):
                        step = registry.decode_as(record.value, STEP_MESSAGES)[1]["step"]
                    found[tp.topic].setdefault((saga_id, step), record.timestamp)
        return found
    finally:
        await consumer.stop()


async def store_timestamps(dsn: str, saga_ids: set[str]) -> tuple[dict[str, int], dict[Key, int], dict[Key, int],
                                                                  dict[Key, int]]:
    """From the bench database: SagaStarted per saga, and per (saga, step) StepCommandSent, the
    participant's processed_at and StepSucceeded (ms, first of each)."""
    started: dict[str, int] = {}
    decided: dict[Key, int] = {}
    recorded: dict[Key, int] = {}
    handled: dict[Key, int] = {}
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT body, (extract(epoch FROM recorded_at) * 1000)::bigint AS at FROM saga.events"
            " WHERE event_type = ANY($1::text[]) ORDER BY saga_id, seq",
            [SagaStarted.__name__, StepCommandSent.__name__, StepSucceeded.__name__])
        for row in rows:
            event = wire.decode_event(row["body"])
            if event.saga_id not in saga_ids:
                continue
            if isinstance(event, SagaStarted):
                started.setdefault(event.saga_id, row["at"])
            elif isinstance(event, StepCommandSent):
                decided.setdefault((event.saga_id, event.step), row["at"])
            elif isinstance(event, StepSucceeded):
                recorded.setdefault((event.saga_id, event.step), row["at"])
        for name in PARTICIPANTS:
            table = get_participant(name).processed_table
            for row in await conn.fetch(
                    f"SELECT saga_id, step, (extract(epoch FROM processed_at) * 1000)::bigint AS at FROM {table}"
                    " WHERE kind = $1", CommandKind.FORWARD.value):
                if row["saga_id"] in saga_ids:
                    handled.setdefault((row["saga_id"], row["step"]), row["at"])
    finally:
        await conn.close()
    return started, decided, handled, recorded


async def hop_latencies(kafka_clients: KafkaClients, dsn: str, topics: Topics,
                        saga_ids: Iterable[str]) -> dict[str, list[int]]:
    """Milliseconds of every hop of ``HOPS`` taken by ``saga_ids``, keyed by hop."""
    wanted = set(saga_ids)
    kafka = await first_timestamps(kafka_clients, [topics.start, *(topics.commands(p) for p in PARTICIPANTS),
                                               *(topics.results(p) for p in PARTICIPANTS)], wanted)
    started, decided, handled, recorded = await store_timestamps(dsn, wanted)
    commands = merged(kafka[topics.commands(p)] for p in PARTICIPANTS)
    replies = merged(kafka[topics.results(p)] for p in PARTICIPANTS)
    starts = {saga_id: at for (saga_id, _), at in kafka[topics.start].items()}
    return {
        HOPS[0]: gaps(starts, started),
        HOPS[1]: gaps(decided, commands),
        HOPS[2]: gaps(commands, handled),
        HOPS[3]: gaps(handled, replies),
        HOPS[4]: gaps(replies, recorded),
    }


def merged(parts: Iterable[Mapping[Key, int]]) -> dict[Key, int]:
    """One mapping of several."""
    whole: dict[Key, int] = {}
    for part in parts:
        whole.update(part)
    return whole


def gaps(since: Mapping[K, int], until: Mapping[K, int]) -> list[int]:
    """``until - since`` for every key in both, sorted."""
    return sorted(until[key] - at for key, at in since.items() if key in until)


def hop_table(hops: Mapping[str, list[int]]) -> Table:
    """The hops as a table of percentiles."""
    table = Table("hop", "count", "p50 ms", "p95 ms", "p99 ms", title="where the time goes, hop by hop",
                  caption="a trip's critical path: the start hop, then the 4 step hops for each of its 3 step"
                          " levels (flight ∥ hotel, payment, notification), then the relay of its terminal event")
    for hop, values in hops.items():
        if values:
            table.add_row(hop, f"{len(values):,}", *(f"{percentile(values, q):,.0f}" for q in (0.50, 0.95, 0.99)))
    return table
