"""The orchestrator's Kafka loop: consume a batch, handle it in Postgres, then commit the offsets."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Iterable

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import CommitFailedError, KafkaError

from infra.faults import crash_point
from orchestrator.envelope import Envelope, RawRecord
from orchestrator.parsing import RecordParser
from orchestrator.service import SagaService

log = logging.getLogger("saga.orchestrator.consumer")

MAX_BACKOFF_S = 5.0


def to_raw(record: ConsumerRecord) -> RawRecord:
    """Keep a consumed record's original bytes and headers."""
    return RawRecord(topic=record.topic, partition=record.partition, offset=record.offset, key=record.key,
                     value=record.value, headers=tuple((k, v) for k, v in (record.headers or ())))


class OrchestratorConsumer:
    """Consumes start, control and result topics; offsets are committed only after Postgres commits."""

    def __init__(self, service: SagaService, parser: RecordParser, bootstrap_servers: str, group_id: str,
                 concurrency: int = 8, max_records: int = 500) -> None:
        self._service = service
        self._parser = parser
        self._bootstrap = bootstrap_servers
        self._group_id = group_id
        self._slots = asyncio.Semaphore(concurrency)
        self._max_records = max_records
        self.handled = 0

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until ``stop`` is set, reconnecting with backoff when Kafka is away."""
        backoff = 0.2
        while not stop.is_set():
            consumer = AIOKafkaConsumer(
                *self._parser.topic_names(), bootstrap_servers=self._bootstrap, group_id=self._group_id,
                enable_auto_commit=False, auto_offset_reset="earliest", max_poll_records=self._max_records,
                isolation_level="read_committed",
            )
            try:
                await consumer.start()
                backoff = 0.2
                log.info("orchestrator consumer started", extra={"group": self._group_id})
                await self._poll(consumer, stop)
            except KafkaError as error:
                log.warning("kafka unavailable, retrying", extra={"error": repr(error), "backoff_s": backoff})
                await _sleep_or_stop(stop, backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
            finally:
                await consumer.stop()

    async def _poll(self, consumer: AIOKafkaConsumer, stop: asyncio.Event) -> None:
        while not stop.is_set():
            batches: dict[TopicPartition, list[ConsumerRecord]] = await consumer.getmany(
                timeout_ms=100, max_records=self._max_records)
            if not batches:
                continue
            await self._process_until_done(batches.values(), stop)
            offsets = {tp: records[-1].offset + 1 for tp, records in batches.items()}
            crash_point("orchestrator.after_commit")  # Postgres committed, the offsets not: redelivery
            try:
                await consumer.commit(offsets)
            except CommitFailedError as error:
                # A rebalance took the partitions away; the new owner re-reads, the inbox dedupes.
                log.warning("offset commit failed after rebalance", extra={"error": repr(error)})

    async def _process_until_done(self, batches: Iterable[list[ConsumerRecord]],
                                  stop: asyncio.Event) -> None:
        by_saga: dict[bytes | None, list[RawRecord]] = defaultdict(list)
        for records in batches:
            for record in records:
                by_saga[record.key].append(to_raw(record))
        backoff = 0.1
        while True:
            try:
                await asyncio.gather(*(self._process_saga(raws) for raws in by_saga.values()))
                return
            except Exception as error:  # a failed transaction is retried, never skipped
                if stop.is_set():
                    raise
                log.error("batch failed, retrying", extra={"error": repr(error), "backoff_s": backoff})
                await _sleep_or_stop(stop, backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)

    async def _process_saga(self, raws: list[RawRecord]) -> None:
        async with self._slots:
            for raw in raws:
                parsed = self._parser.parse(raw)
                if isinstance(parsed, Envelope):
                    await self._service.handle(parsed)
                else:
                    await self._service.reject(parsed)
                self.handled += 1


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), timeout=seconds)
    except TimeoutError:
        pass
