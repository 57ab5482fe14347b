"""The dead-letter index: the orchestrator reads saga.dlq and keeps each letter in a ``DeadLetterIndex`` (a
Postgres table), so that the faces list dead letters with one indexed query instead of reading the topic.

``DeadLetterIndexer`` assigns itself every partition of saga.dlq (no consumer group: the position read up to is kept
in the index, written in the transaction of the rows read), reads on from there and writes what each fetch brought
as one batch. A letter is keyed by its position on saga.dlq, so a batch written twice (a crash between the write and
nothing else: the position moves with the rows) or by two orchestrators at once changes nothing. Every orchestrator
of a group indexes the whole topic: saga.dlq is small and quiet, and one of them being down never stops the index.
Kafka or Postgres away is waited out and the reading starts again from the kept position.

A letter replayed before the index existed (a deployment upgraded from 0.2.0 reads saga.dlq from its start) has its
replay recorded only in its saga's history (an OperatorAction ``DlqReplay``, ``orchestrator.recorded_replays``). So a
batch holding letters of sagas that the index does not hold yet reads those sagas' operator actions (one read; a
batch of letters already indexed, unreadable or of no saga reads nothing), and each such letter whose replay is
recorded there is written replayed at its last recorded replay, in the transaction of its row: it never shows in the
inbox as unhandled. A letter already indexed is left as it is.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

from aiokafka import ConsumerRecord, TopicPartition

from ..client.saga_client import topic_partitions
from ..infra.kafka_clients import KafkaClients
from ..infra.startup import sleep_or_stop
from ..schemas import wire
from ..schemas.codec import WireError
from .ports import DeadLetterIndex, EventsOfSagas, IndexedLetter
from .recorded_replays import recorded_replays

log = logging.getLogger("saga.dead_letters")

BATCH = 1000  # the most records one fetch (so one transaction of the index) takes
FETCH_WAIT_MS = 1000  # a quiet saga.dlq costs one long-poll fetch per partition leader this often
RETRY_S = 5.0


def indexed(partition: int, offset: int, written_at_ms: int, value: bytes | None) -> IndexedLetter:
    """The index row of the record at ``partition``:``offset`` on saga.dlq, written there at ``written_at_ms``.
    A record that is no readable letter (anyone may write to saga.dlq) is kept too, failed when written."""
    letter = None
    if value is not None:
        try:
            letter = wire.decode_dead_letter(value)
        except WireError:
            pass  # kept as unreadable: listed, never replayed
    if letter is None:
        return IndexedLetter(partition, offset, written_at_ms, written_at_ms, None, None, None, value)
    return IndexedLetter(partition, offset, written_at_ms, letter.failed_at, letter.saga_id, letter.source_topic,
                         letter.reason, value)


class DeadLetterIndexer:
    """Keeps ``index`` up to date with ``dlq_topic`` until stopped; ``histories`` tells which new letters their
    sagas' histories record as replayed."""

    def __init__(self, index: DeadLetterIndex, histories: EventsOfSagas, kafka: KafkaClients, dlq_topic: str, *,
                 batch: int = BATCH) -> None:
        self._index = index
        self._histories = histories
        self._kafka = kafka
        self._topic = dlq_topic
        self._batch = batch
        self.indexed = 0  # records written since start (a record written twice counts twice)

    async def run(self, stop: asyncio.Event) -> None:
        """Index until ``stop``; an outage is logged and the reading starts again after ``RETRY_S``."""
        while not stop.is_set():
            try:
                await self._follow(stop)
            except Exception as error:  # Kafka or Postgres away: wait, then read on from the kept position
                log.warning("dead-letter index paused", extra={"error": repr(error), "retry_in_s": RETRY_S})
                await sleep_or_stop(stop, RETRY_S)

    async def _follow(self, stop: asyncio.Event) -> None:
        consumer = self._kafka.consumer(enable_auto_commit=False, group_id=None, isolation_level="read_committed")
        await consumer.start()
        try:
            partitions = [TopicPartition(self._topic, p) for p in await topic_partitions(consumer, self._topic)]
            consumer.assign(partitions)
            read_to = await self._index.positions()
            firsts = await consumer.beginning_offsets(partitions)
            for tp in partitions:  # records the topic no longer retains are gone: start at its first one
                consumer.seek(tp, max(read_to.get(tp.partition, 0), firsts[tp]))
            fetching = asyncio.ensure_future(stop.wait())
            try:
                while not stop.is_set():
                    fetched = asyncio.ensure_future(consumer.getmany(timeout_ms=FETCH_WAIT_MS,
                                                                     max_records=self._batch))
                    await asyncio.wait([fetched, fetching], return_when=asyncio.FIRST_COMPLETED)
                    if not fetched.done():
                        fetched.cancel()
                        return
                    await self._write(fetched.result())
            finally:
                fetching.cancel()
        finally:
            await consumer.stop()

    async def _write(self, fetched: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]) -> None:
        letters = [indexed(tp.partition, record.offset, record.timestamp, record.value)
                   for tp, records in fetched.items() for record in records]
        if not letters:
            return
        positions = {tp.partition: records[-1].offset + 1 for tp, records in fetched.items() if records}
        await self.write(letters, positions)

    async def write(self, letters: list[IndexedLetter], positions: dict[int, int]) -> None:
        """Keep ``letters`` read up to ``positions``, each new one whose replay its saga's history records marked
        replayed at the last such replay, in one transaction."""
        await self._index.record(await self._with_recorded_replays(letters), positions)
        self.indexed += len(letters)

    async def _with_recorded_replays(self, letters: list[IndexedLetter]) -> list[IndexedLetter]:
        of_sagas = [(letter.partition, letter.offset) for letter in letters if letter.saga_id is not None]
        if not of_sagas:
            return letters
        # A letter already kept keeps its row as it is (``record``): only the sagas of new ones are worth a read.
        known = {(row.partition, row.offset) for row in await self._index.at(of_sagas)}
        new = [letter for letter in letters
               if letter.saga_id is not None and (letter.partition, letter.offset) not in known]
        replays = await recorded_replays(self._histories, {letter.saga_id for letter in new if letter.saga_id})
        replayed_at: dict[tuple[int, int], int] = {}
        for letter in new:
            if recorded := replays.get(f"{letter.partition}:{letter.offset}"):
                replayed_at[letter.partition, letter.offset] = max(replay.at_ms for replay in recorded)
        return [replace(letter, replayed_at_ms=replayed_at[letter.partition, letter.offset])
                if (letter.partition, letter.offset) in replayed_at else letter for letter in letters]
