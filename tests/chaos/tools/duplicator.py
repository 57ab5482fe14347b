"""Duplicate delivery, as Kafka is allowed to do it: every record again, later, out of order.

``Duplicator`` consumes the given topics from their current end (its own consumer, positions taken when it
starts) and re-publishes every record ``copies`` more times to the same topic and partition with the same
key, value and headers — so the same ``message_id`` — as a relay re-publishing after a crash would. The
copies are held in a window of ``shuffle_window`` and sent in random order, so a copy can arrive after
later messages of its own key and interleaved with other keys' messages.

    duplicator = Duplicator(settings, [topics.commands("flight"), topics.results("flight")])
    task = asyncio.create_task(duplicator.run(stop))
    await duplicator.ready.wait()        # positions taken: every record from now on is duplicated
    ...
    stop.set(); await task               # sends every copy still held, then stops
    assert duplicator.injected == 2 * duplicator.seen
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections import Counter
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError

from saga_orchestrator.infra.settings import Settings

log = logging.getLogger(__name__)

POLL_MS = 20
LARGE_REQUEST = 4 * 1024 * 1024


@dataclass(frozen=True)
class _Copy:
    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


class Duplicator:
    """Re-publishes every record of ``topics`` ``copies`` more times, shuffled within a window.

    Counters: ``seen`` (original records consumed), ``injected`` (copies Kafka acknowledged), and both
    per topic (``seen_by_topic``, ``injected_by_topic``). Its own copies are recognised by the offsets
    Kafka gave them and never duplicated again.
    """

    def __init__(self, settings: Settings, topics: list[str], copies: int = 2, shuffle_window: int = 50,
                 seed: int | None = None) -> None:
        if copies < 1 or shuffle_window < 1:
            raise ValueError("copies and shuffle_window must be at least 1")
        self.settings = settings
        self.topics = list(dict.fromkeys(topics))
        self.copies = copies
        self.shuffle_window = shuffle_window
        self.group_id = f"{settings.saga_topic_prefix}chaos-duplicator-{uuid.uuid4().hex[:8]}"
        self.ready = asyncio.Event()
        self.seen = 0
        self.injected = 0
        self.seen_by_topic: Counter[str] = Counter()
        self.injected_by_topic: Counter[str] = Counter()
        self._rng = random.Random(seed)
        self._held: list[_Copy] = []
        self._own: dict[TopicPartition, set[int]] = {}

    async def run(self, stop: asyncio.Event) -> None:
        """Duplicate until ``stop`` is set; then send every copy still held and return."""
        consumer = AIOKafkaConsumer(bootstrap_servers=self.settings.kafka_servers(), group_id=self.group_id,
                                    enable_auto_commit=False, isolation_level="read_committed",
                                    max_partition_fetch_bytes=LARGE_REQUEST)
        producer = AIOKafkaProducer(bootstrap_servers=self.settings.kafka_servers(), acks="all", linger_ms=2,
                                    max_request_size=LARGE_REQUEST)
        try:
            # Inside the try: a broker restarting under the start must not leave the other client open.
            await consumer.start()
            await producer.start()
            partitions = await self._assign_at_end(consumer)
            self.ready.set()
            while not stop.is_set():
                try:
                    fresh = await self._poll(consumer, partitions)
                    # Hold copies back while the window fills; when traffic pauses, let the rest go (shuffled)
                    # so no copy waits for traffic that may never come.
                    await self._send(producer, len(self._held) - self.shuffle_window if fresh else len(self._held))
                except KafkaError as error:  # a broker restart in a chaos run: the clients reconnect
                    log.warning("duplicator: kafka error, retrying: %r", error)
                    await asyncio.sleep(0.5)
            for _ in range(20):  # what is still held goes out before returning (a few tries across a restart)
                try:
                    await self._send(producer, len(self._held))
                    break
                except KafkaError as error:
                    log.warning("duplicator: kafka error while flushing, retrying: %r", error)
                    await asyncio.sleep(0.5)
        finally:
            self.ready.set()  # never leave a waiter hanging on a duplicator that failed to start
            await producer.stop()
            await consumer.stop()

    async def _assign_at_end(self, consumer: AIOKafkaConsumer) -> list[TopicPartition]:
        partitions = []
        for topic in self.topics:
            for _ in range(50):
                found = consumer.partitions_for_topic(topic)
                if found:
                    break
                await consumer._client.force_metadata_update()  # a topic new to this client
                await asyncio.sleep(0.1)
            else:
                raise LookupError(f"topic {topic} does not exist")
            partitions += [TopicPartition(topic, p) for p in sorted(found)]
        consumer.assign(partitions)
        await consumer.seek_to_end(*partitions)
        for partition in partitions:
            await consumer.position(partition)  # resolve "end" now, not at the first fetch
        return partitions

    async def _poll(self, consumer: AIOKafkaConsumer, partitions: list[TopicPartition]) -> int:
        fresh = 0
        batches = await consumer.getmany(*partitions, timeout_ms=POLL_MS, max_records=2000)
        for tp, records in batches.items():
            own = self._own.get(tp, set())
            for record in records:
                if record.offset in own:
                    own.discard(record.offset)  # a copy of ours coming back: not an original
                    continue
                fresh += 1
                self.seen += 1
                self.seen_by_topic[tp.topic] += 1
                headers = tuple((k, v) for k, v in (record.headers or ()))
                copy = _Copy(tp.topic, tp.partition, record.key, record.value, headers)
                self._held += [copy] * self.copies
        return fresh

    async def _send(self, producer: AIOKafkaProducer, count: int) -> None:
        """Send ``count`` held copies chosen at random, and wait for Kafka's acknowledgements, so the
        offsets of our own copies are known before the next poll can return them."""
        if count <= 0:
            return
        chosen = []
        for _ in range(min(count, len(self._held))):
            index = self._rng.randrange(len(self._held))
            self._held[index], self._held[-1] = self._held[-1], self._held[index]
            chosen.append(self._held.pop())
        futures = []
        try:
            for copy in chosen:
                futures.append(await producer.send(copy.topic, key=copy.key, value=copy.value,
                                                   headers=list(copy.headers), partition=copy.partition))
        finally:
            self._held += chosen[len(futures):]  # not handed to the producer: keep them for the next try
            results = await asyncio.gather(*futures, return_exceptions=True)
            for copy, result in zip(chosen, results, strict=False):
                if isinstance(result, BaseException):
                    # Not acknowledged: held again. Had Kafka written it anyway, that copy comes back as an
                    # unknown record and is duplicated in turn: more duplicates, which is still the point.
                    self._held.append(copy)
                    continue
                self._own.setdefault(TopicPartition(copy.topic, copy.partition), set()).add(result.offset)
                self.injected += 1
                self.injected_by_topic[copy.topic] += 1
        failures = [r for r in results if isinstance(r, KafkaError)]
        if failures:
            raise failures[0]
