"""The throughput benchmark's client side: publish StartSagas, watch saga.events for their ends."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field

from aiokafka import TopicPartition
from rich.progress import Progress

from saga_orchestrator.cli.run_cmd import Services, exited_services
from saga_orchestrator.client.event_feed import assign_from_beginning
from saga_orchestrator.infra.kafka_clients import KafkaClients
from saga_orchestrator.participants.trip.scenarios import SCENARIOS
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.event_types import TERMINAL_EVENTS, SagaStarted
from saga_orchestrator.schemas.registry import default_registry
from saga_orchestrator.schemas.wire import EVENTS_NAMESPACE

# The load generator shares the machine it measures: every request it sends costs the broker and itself a
# loopback round trip, so it publishes in ticks and reads lazily. Latency does not depend on how soon the
# watcher reads: a saga ends at its terminal event's Kafka timestamp (the relay's send time).
PUBLISH_TICK_S = 0.02
POLL_EVERY_S = 0.1
FETCH_WAIT_MS = 100


@dataclass
class Observed:
    """What the events topic said about the sagas; times in wall-clock seconds (``time.time``).

    ``published_at`` is when the bench sent the StartSaga, ``terminal_at`` the Kafka timestamp of the saga's
    terminal event on ``saga.events`` (set by the relay's producer when it sent the record)."""

    published_at: dict[str, float] = field(default_factory=dict)
    started_at_ms: dict[str, int] = field(default_factory=dict)
    terminal_at: dict[str, float] = field(default_factory=dict)
    terminal_ms: dict[str, int] = field(default_factory=dict)
    outcome: dict[str, str] = field(default_factory=dict)


class Watcher:
    """Reads saga.events and decodes only SagaStarted and terminal events (picked by writer fingerprint)."""

    def __init__(self, kafka: KafkaClients, topic: str) -> None:
        # The watcher reads at most every POLL_EVERY_S anyway: a fetch that returned as soon as one event
        # arrived (aiokafka's default) would cost the broker and this process a round trip per relay batch.
        self._consumer = kafka.consumer(enable_auto_commit=False, group_id=None,
                                          fetch_max_wait_ms=FETCH_WAIT_MS, fetch_min_bytes=1 << 20)
        self._topic = topic
        registry = default_registry()
        names = [SagaStarted.__name__, *(cls.__name__ for cls in TERMINAL_EVENTS)]
        self._wanted = {registry.fingerprint(f"{EVENTS_NAMESPACE}.{name}") for name in names}
        self.seen = Observed()
        self.ended: list[str] = []  # saga ids in the order their terminal event was seen

    async def start(self) -> None:
        """Connect and read the topic from its beginning."""
        await self._consumer.start()
        await assign_from_beginning(self._consumer, self._topic)

    async def stop(self) -> None:
        """Disconnect."""
        await self._consumer.stop()

    async def poll(self) -> None:
        """Take in what has arrived (every ``POLL_EVERY_S`` at most: the bench should cost the machine little)."""
        await asyncio.sleep(POLL_EVERY_S)
        batches = await self._consumer.getmany(timeout_ms=50, max_records=10_000)
        for records in batches.values():
            for record in records:
                if record.value is None or record.value[2:10] not in self._wanted:
                    continue
                event = wire.decode_event(record.value)
                if isinstance(event, SagaStarted):
                    self.seen.started_at_ms.setdefault(event.saga_id, event.occurred_at)
                elif event.saga_id not in self.seen.terminal_at:
                    self.seen.terminal_at[event.saga_id] = record.timestamp / 1000
                    self.ended.append(event.saga_id)
                    self.seen.terminal_ms[event.saga_id] = event.occurred_at
                    self.seen.outcome[event.saga_id] = type(event).__name__

    async def end_offsets(self, topics: list[str]) -> dict[str, int]:
        """Messages on each topic so far (sum of partition end offsets; fresh topics start at 0)."""
        # The consumer's own metadata covers only the topic it reads: fetch the whole cluster's.
        cluster = await self._consumer._client.fetch_all_metadata()
        partitions = [TopicPartition(t, p) for t in topics for p in cluster.partitions_for_topic(t) or ()]
        ends = await self._consumer.end_offsets(partitions)
        return {t: sum(offset for tp, offset in ends.items() if tp.topic == t) for t in topics}

    def done(self, saga_ids: list[str]) -> int:
        """How many of ``saga_ids`` have ended."""
        return sum(1 for saga_id in saga_ids if saga_id in self.seen.terminal_at)

    def ended_since(self, cursor: int) -> tuple[list[str], int]:
        """Sagas that ended since ``cursor`` (a previous return value; 0 at first), in the order seen."""
        return self.ended[cursor:], len(self.ended)


async def publish(kafka: KafkaClients, topic: str, saga_ids: list[str], rate: float | None,
                  published_at: dict[str, float]) -> None:
    """One StartSaga per saga id (happy trips), paced at ``rate`` per second when given.

    Paced in ticks of ``PUBLISH_TICK_S``: the StartSagas due by each tick go out together, so the load
    generator costs one wake-up and one produce request per tick rather than per saga: ``send`` queues without
    giving the producer's sender a turn, so a tick's records leave together with no linger (which would add to
    every saga's measured latency what ``SagaClient``, without one, does not)."""
    producer = kafka.producer(acks="all", enable_idempotence=True)
    await producer.start()
    try:
        bodies = [wire.encode_start(SCENARIOS["happy"].start(saga_id)) for saga_id in saga_ids]
        first = time.perf_counter()
        sent = 0
        while sent < len(saga_ids):
            due = len(saga_ids) if not rate else min(len(saga_ids), int((time.perf_counter() - first) * rate) + 1)
            now = time.time()
            for saga_id, body in zip(saga_ids[sent:due], bodies[sent:due], strict=True):
                published_at[saga_id] = now
                await producer.send(topic, value=body, key=saga_id.encode(),
                                    headers=[("message_id", uuid.uuid4().hex.encode())])
            sent = due
            if sent < len(saga_ids):
                await asyncio.sleep(PUBLISH_TICK_S)
        await producer.flush()
    finally:
        await producer.stop()


async def wait_for(watcher: Watcher, saga_ids: list[str], timeout_s: float, services: Services,
                   progress: Progress | None = None) -> bool:
    """Poll the events topic until every saga ended (True) or the time is up (False); raises when a
    service died."""
    task = progress.add_task("", total=len(saga_ids)) if progress else None
    deadline = time.monotonic() + timeout_s
    # Counted incrementally: scanning every saga at every poll would make the bench's own CPU grow with N.
    wanted = set(saga_ids)
    done = watcher.done(saga_ids)
    cursor = len(watcher.ended)
    started = time.perf_counter()
    while time.monotonic() < deadline:
        await watcher.poll()
        ended, cursor = watcher.ended_since(cursor)
        done += sum(1 for saga_id in ended if saga_id in wanted)
        if progress is not None and task is not None:
            elapsed = time.perf_counter() - started
            progress.update(task, completed=done, description=f"{done / max(elapsed, 1e-9):7.1f} sagas/s")
        if done == len(saga_ids):
            return True
        dead = exited_services(services)
        if dead:
            raise RuntimeError(f"service(s) exited during the run: {', '.join(dead)}")
    return False
