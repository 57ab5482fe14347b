"""The orchestrator consumer's overlapping polls: a later poll's sagas start while an earlier poll is still
in Postgres, a saga in both waits for the earlier one, and records in flight hold the read horizon.

No Kafka or Postgres: the service and parser are recording stand-ins, the records are built by hand.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from aiokafka import ConsumerRecord, TopicPartition

from saga_orchestrator.infra.kafka_clients import KafkaClients
from saga_orchestrator.orchestrator.consumer import OrchestratorConsumer, _Poll, _Round
from saga_orchestrator.orchestrator.inbound import Envelope
from saga_orchestrator.orchestrator.service import ServedElsewhere
from saga_orchestrator.schemas.records import ConsumedRecord

RESULTS = "flight.results"
RESULTS_0 = TopicPartition(RESULTS, 0)


class SlowService:
    """Handles a batch after ``delay_s[saga]`` and records when each batch started and ended."""

    def __init__(self, delay_s: dict[str, float]) -> None:
        self.delay_s = delay_s
        self.timeline: list[tuple[str, frozenset[str]]] = []

    async def handle_many(self, envelopes: list[Envelope]) -> None:
        sagas = frozenset(envelope.message_id.split("/")[0] for envelope in envelopes)
        self.timeline.append(("start", sagas))
        await asyncio.sleep(max(self.delay_s.get(saga, 0.0) for saga in sagas))
        self.timeline.append(("end", sagas))


class EchoParser:
    """Every record parses; the envelope's id is ``<saga>/<offset>``."""

    def parse(self, raw: ConsumedRecord) -> Envelope:
        key = (raw.key or b"").decode()
        message: Any = None  # the stand-in service never looks at it
        return Envelope(message=message, message_id=f"{key}/{raw.offset}", raw=raw)

    def topic_names(self) -> list[str]:
        return [RESULTS]

    def result_topic_names(self) -> frozenset[str]:
        return frozenset({RESULTS})


def record(saga: str, offset: int, timestamp: int = 0, partition: int = 0) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord(topic=RESULTS, partition=partition, offset=offset, timestamp=timestamp,
                          timestamp_type=0, key=saga.encode(), value=b"", checksum=None,
                          serialized_key_size=len(saga), serialized_value_size=0, headers=[])


def consumer_of(service: SlowService) -> OrchestratorConsumer:
    parser: Any = EchoParser()
    handler: Any = service
    return OrchestratorConsumer(handler, parser, KafkaClients("unused:9092"), "group")


def poll_of(*records: ConsumerRecord[bytes, bytes]) -> dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]:
    batches: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]] = {}
    for item in records:
        batches.setdefault(TopicPartition(item.topic, item.partition), []).append(item)
    return batches


async def two_polls(*second: ConsumerRecord[bytes, bytes]) -> list[tuple[str, frozenset[str]]]:
    """Dispatch a poll of saga s1 (handled in 0.3 s), then, while it runs, a poll of ``second``; return
    the service's timeline once both are done."""
    service = SlowService({"s1": 0.3})
    target = consumer_of(service)
    stop = asyncio.Event()
    first = target._dispatch(poll_of(record("s1", 0)), [], stop, target._round)
    await asyncio.sleep(0.05)
    later = target._dispatch(poll_of(*second), [first], stop, target._round)
    await asyncio.gather(first.task, later.task)
    return service.timeline


async def test_a_later_poll_of_other_sagas_overlaps_the_earlier_one() -> None:
    assert await two_polls(record("s2", 1)) == [("start", frozenset({"s1"})), ("start", frozenset({"s2"})),
                                                ("end", frozenset({"s2"})), ("end", frozenset({"s1"}))]


async def test_a_saga_in_two_polls_is_handled_in_poll_order() -> None:
    assert await two_polls(record("s1", 1), record("s2", 2)) == [
        ("start", frozenset({"s1"})), ("end", frozenset({"s1"})),
        ("start", frozenset({"s1", "s2"})), ("end", frozenset({"s1", "s2"}))]


class CaughtUpConsumer:
    """One results partition whose fetch position is at its high watermark (10), checked at 5000 ms."""

    tp = TopicPartition(RESULTS, 0)

    def assignment(self) -> set[TopicPartition]:
        return {self.tp}

    async def position(self, tp: TopicPartition) -> int:
        return 10

    def last_stable_offset(self, tp: TopicPartition) -> int | None:
        return None

    def highwater(self, tp: TopicPartition) -> int:
        return 10

    def last_poll_timestamp(self, tp: TopicPartition) -> int:
        return 5000


async def test_records_in_flight_hold_the_read_horizon_at_the_last_record_handled() -> None:
    target = consumer_of(SlowService({}))
    kafka: Any = CaughtUpConsumer()
    await target._advance_horizon(kafka, poll_of(record("s1", 7, timestamp=3000)), [])
    assert target.read_horizon_ms == 5000  # everything fetched is handled: caught up as of the last check

    target._horizon_at = 0.0  # no rate limit between the two looks
    done: asyncio.Task[bool] = asyncio.create_task(asyncio.sleep(0, True))
    fetched = _Poll(poll_of(record("s2", 8, timestamp=4000), record("s3", 9, timestamp=4500)), {b"s2", b"s3"}, done,
                    _Round(asyncio.Event()))
    await target._advance_horizon(kafka, {}, deque([fetched]))
    assert target.read_horizon_ms == 3000  # offsets 8 and 9 are read from Kafka but not handled yet
    await done


class WaitsForAnotherMember:
    """Saga v2-saga runs on a definition version another member of the group serves: each try of it is "not
    now"; other sagas go through."""

    def __init__(self) -> None:
        self.tries = 0

    async def handle_many(self, envelopes: list[Envelope]) -> None:
        if any(envelope.message_id.startswith("v2-saga/") for envelope in envelopes):
            self.tries += 1
            raise ServedElsewhere("trip v2 is served by another member")


class Assigned(CaughtUpConsumer):
    def __init__(self) -> None:
        self.committed: list[dict[TopicPartition, int]] = []

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        self.committed.append(offsets)


async def test_a_poll_waiting_for_another_member_is_given_up_when_its_partitions_are_revoked() -> None:
    service = WaitsForAnotherMember()
    handler: Any = service
    target = consumer_of(handler)
    waiting = target._dispatch(poll_of(record("v2-saga", 3)), [], asyncio.Event(), target._round)
    later = target._dispatch(poll_of(record("v1-saga", 4)), [], asyncio.Event(), target._round)
    target._in_flight.extend([waiting, later])
    await asyncio.sleep(0.35)
    assert not waiting.task.done() and service.tries >= 2  # not now: tried again, never quarantined
    kafka: Any = Assigned()
    target.revoked()  # the rebalance that moves the partition to the member serving v2
    await target.hand_over(kafka)  # wakes the wait at once rather than after its backoff
    assert waiting.task.result() is False and later.task.result() is True
    # Neither poll's offsets (the later one of the same partition would skip the records given up): the next
    # owner reads both again, and the inbox skips what went through.
    assert not target._in_flight and kafka.committed == []
    # Re-read from the committed offset, the records given up go through again: commits resume.
    assert target._committable(poll_of(record("v1-saga", 4))) == {}
    assert target._committable(poll_of(record("v2-saga", 3), record("v1-saga", 4))) == {RESULTS_0: 5}
    assert target._committable(poll_of(record("v1-saga", 5))) == {RESULTS_0: 6}
