"""A reader of ``saga.events`` from the beginning: what the topic alone says about each saga."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from aiokafka import AIOKafkaConsumer, TopicPartition

from ..infra.kafka_clients import KafkaClients
from ..schemas import wire
from ..schemas.codec import WireError
from ..schemas.event_types import TERMINAL_EVENTS, Event
from .saga_client import topic_partitions


async def assign_from_beginning(consumer: AIOKafkaConsumer, topic: str) -> list[TopicPartition]:
    """Assign every partition of ``topic`` to a started consumer, positioned at the beginning."""
    partitions = await topic_partitions(consumer, topic)
    assigned = [TopicPartition(topic, p) for p in sorted(partitions)]
    consumer.assign(assigned)
    await consumer.seek_to_beginning(*assigned)
    return assigned


class EventFeed:
    """Collects every saga event on the topic, deduplicated by (saga_id, seq)."""

    def __init__(self, kafka: KafkaClients, topic: str) -> None:
        self._consumer = kafka.consumer(enable_auto_commit=False, group_id=None, isolation_level="read_committed")
        self._topic = topic
        self.events: dict[str, dict[int, Event]] = {}
        self.bodies: dict[tuple[str, int], set[bytes]] = {}
        self.terminal: dict[str, Event] = {}
        self.undecodable = 0
        self.duplicates = 0

    async def start(self) -> None:
        """Connect and position every partition at its beginning."""
        await self._consumer.start()
        await assign_from_beginning(self._consumer, self._topic)

    async def stop(self) -> None:
        """Disconnect."""
        await self._consumer.stop()

    async def poll(self, timeout_ms: int = 200) -> list[Event]:
        """Read what has arrived; returns the events new to this feed."""
        batches = await self._consumer.getmany(timeout_ms=timeout_ms, max_records=5000)
        fresh: list[Event] = []
        for records in batches.values():
            for record in records:
                fresh.extend(self._take(record.value))
        return fresh

    async def caught_up(self) -> bool:
        """True when every partition has been read to its current end."""
        partitions = list(self._consumer.assignment())
        ends = await self._consumer.end_offsets(partitions)
        for partition in partitions:
            if await self._consumer.position(partition) < ends[partition]:
                return False
        return True

    async def read_to_end(self) -> None:
        """Read until every partition is at its end offset."""
        while True:
            await self.poll(100)
            if await self.caught_up():
                return

    async def wait_terminal(self, saga_ids: Iterable[str], timeout_s: float,
                            on_progress: Callable[[int], None] | None = None) -> dict[str, Event]:
        """Wait until every saga in ``saga_ids`` has a terminal event on the topic (or the time is up)."""
        wanted = set(saga_ids)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            await self.poll(100)
            done = wanted & self.terminal.keys()
            if on_progress:
                on_progress(len(done))
            if done == wanted:
                break
        return {saga_id: self.terminal[saga_id] for saga_id in wanted if saga_id in self.terminal}

    def history(self, saga_id: str) -> list[Event]:
        """The saga's events in sequence order, as read from the topic."""
        return [self.events.get(saga_id, {})[seq] for seq in sorted(self.events.get(saga_id, {}))]

    def _take(self, value: bytes | None) -> list[Event]:
        if value is None:
            self.undecodable += 1
            return []
        try:
            event = wire.decode_event(value)
        except WireError:
            self.undecodable += 1
            return []
        self.bodies.setdefault((event.saga_id, event.seq), set()).add(value)
        stream = self.events.setdefault(event.saga_id, {})
        if event.seq in stream:
            self.duplicates += 1  # the relay publishes at least once
            return []
        stream[event.seq] = event
        if isinstance(event, TERMINAL_EVENTS):
            self.terminal[event.saga_id] = event
        return [event]
