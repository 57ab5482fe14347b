"""One trip is one trace: the orchestrator (relaying its own outbox), the four trip participants and their relays
run in this process on real Kafka and Postgres, their spans go to an in-memory exporter, and every span of the
trip (the orchestrator's decisions, each relay's publishes, each participant's handler) carries the trip's one
trace id: the client's when it gave a ``traceparent``, else the one its first decision began. Its log lines
name that trace id too."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.orchestrator.bootstrap import prepare as prepare_orchestrator
from saga_orchestrator.orchestrator.bootstrap import run_orchestrator
from saga_orchestrator.participants.host import ParticipantHost
from saga_orchestrator.participants.registry import REFERENCE_PARTICIPANTS, get_participant
from saga_orchestrator.participants.runner import prepare as prepare_participant
from saga_orchestrator.participants.trip.scenarios import SCENARIOS
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.event_types import SagaCompleted
from saga_orchestrator.schemas.headers import header_pairs
from saga_orchestrator.schemas.records import ConsumedRecord
from saga_orchestrator.schemas.topics import Topics
from tests.e2e.harness import terminal_events, wait_for
from tests.spans import spans_in_memory

pytestmark = pytest.mark.integration

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
STEPS = {"flight": "book_flight", "hotel": "book_hotel", "payment": "charge_card", "notification": "send_itinerary"}


async def serve_participants(settings: Settings, stop: asyncio.Event) -> None:
    """The four trip participants, each on its ``ParticipantHost`` (its pool, handling and outbox relay), fed
    their commands by one consumer until ``stop``: the host a faust worker drives, without faust."""
    topics = Topics(settings.saga_topic_prefix)
    hosts = {topics.commands(name): ParticipantHost(get_participant(name), settings)
                for name in REFERENCE_PARTICIPANTS}
    for name in REFERENCE_PARTICIPANTS:
        await prepare_participant(name, settings)
    for host in hosts.values():
        host.owned_partitions = frozenset(range(settings.saga_topic_partitions))
        await host.start()
    consumer = AIOKafkaConsumer(*hosts, bootstrap_servers=settings.kafka_servers(), enable_auto_commit=False,
                                group_id=f"{settings.saga_topic_prefix}traced-participants",
                                auto_offset_reset="earliest")
    await consumer.start()
    try:
        while not stop.is_set():
            for partition, records in (await consumer.getmany(timeout_ms=100)).items():
                await hosts[partition.topic].process_batch([
                    ConsumedRecord(topic=r.topic, partition=r.partition, offset=r.offset, key=r.key, value=r.value,
                                   headers=header_pairs(r.headers)) for r in records])
    finally:
        await consumer.stop()
        for host in hosts.values():
            await host.stop()


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    with spans_in_memory() as exporter:
        yield exporter


@pytest.fixture
async def trip_stack(settings: Settings) -> AsyncIterator[Settings]:
    """The orchestrator (with its relay) and the participants running in this process until the test ends."""
    small = settings.model_copy(update={"saga_db_pool_size": 3, "saga_health_port": 0})
    await prepare_orchestrator(small)
    stop = asyncio.Event()
    running = asyncio.ensure_future(asyncio.gather(run_orchestrator(small, stop, with_relay=True),
                                                   serve_participants(small, stop)))
    try:
        yield small
    finally:
        stop.set()
        await asyncio.wait_for(running, 60)


async def start_trip(settings: Settings, saga_id: str, traceparent: str | None) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_servers(), acks="all")
    await producer.start()
    try:
        headers = [("message_id", saga_id.encode())]
        if traceparent is not None:
            headers.append(("traceparent", traceparent.encode()))
        await producer.send_and_wait(Topics(settings.saga_topic_prefix).start,
                                     wire.encode_start(SCENARIOS["happy"].start(saga_id)), key=saga_id.encode(),
                                     headers=headers)
    finally:
        await producer.stop()


def spans_of(exporter: InMemorySpanExporter, saga_id: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if (span.attributes or {}).get("saga.id") == saga_id]


def whats(spans: list[ReadableSpan]) -> set[tuple[str, str]]:
    """Each span as (name, who made it): the outbox table it relayed, the participant, or the orchestrator."""
    return {(span.name, str((span.attributes or {}).get("outbox.table") or (span.attributes or {}).get("participant")
                            or "orchestrator")) for span in spans}


EXPECTED = ({("saga.decide", "orchestrator"), ("outbox.publish", "saga.outbox")}
            | {("participant.handle", name) for name in STEPS}
            | {("outbox.publish", f"{get_participant(name).schema}.outbox") for name in STEPS})


async def traced_trip(settings: Settings, exporter: InMemorySpanExporter, traceparent: str | None) -> str:
    saga_id = f"traced-{uuid.uuid4().hex[:8]}"
    await start_trip(settings, saga_id, traceparent)
    ended = await terminal_events(settings, [saga_id], 90)
    assert isinstance(ended.get(saga_id), SagaCompleted)

    async def all_made() -> bool:  # the terminal event's publish span ends once Kafka acknowledged it
        return whats(spans_of(exporter, saga_id)) == EXPECTED

    await wait_for(all_made, 10, 0.1)
    return saga_id


async def test_one_trip_is_one_trace_of_every_service(trip_stack: Settings, exported: InMemorySpanExporter,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="saga.orchestrator")
    untraced = await traced_trip(trip_stack, exported, None)
    traced = await traced_trip(trip_stack, exported, f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01")

    for saga_id in (untraced, traced):
        spans = spans_of(exported, saga_id)
        assert whats(spans) == EXPECTED
        assert len({span.context.trace_id for span in spans if span.context is not None}) == 1
        handled = {(span.attributes or {}).get("participant"): (span.attributes or {}).get("saga.step")
                   for span in spans if span.name == "participant.handle"}
        assert handled == STEPS
        decided = [(span.attributes or {}).get("saga.message") for span in spans if span.name == "saga.decide"]
        assert decided.count("StartSaga") == 1 and decided.count("StepResult") == 4
        # each handler's span is a child of the decision that sent its command
        decisions = {span.context.span_id: span for span in spans if span.name == "saga.decide" and span.context}
        senders = {(span.attributes or {}).get("saga.step"): decisions[span.parent.span_id]
                   for span in spans if span.name == "participant.handle" and span.parent is not None
                   and span.parent.span_id in decisions}
        assert {step: (sender.attributes or {}).get("saga.message") for step, sender in senders.items()} == {
            "book_flight": "StartSaga", "book_hotel": "StartSaga", "charge_card": "StepResult",
            "send_itinerary": "StepResult"}

    untraced_spans, traced_spans = spans_of(exported, untraced), spans_of(exported, traced)
    # Without a client trace, the trip's trace begins at its first decision: the one root of its spans.
    [root] = [span for span in untraced_spans if span.parent is None]
    assert root.name == "saga.decide" and (root.attributes or {}).get("saga.message") == "StartSaga"
    # With one, every span of the trip is in the client's trace, the decisions children of the client's span.
    assert {f"{span.context.trace_id:032x}" for span in traced_spans if span.context is not None} == {CLIENT_TRACE}
    assert {f"{span.parent.span_id:016x}" for span in traced_spans
            if span.name == "saga.decide" and span.parent is not None} == {CLIENT_SPAN}

    # The orchestrator's log lines of each trip name its trace id.
    assert root.context is not None
    for saga_id, trace_id in ((untraced, f"{root.context.trace_id:032x}"), (traced, CLIENT_TRACE)):
        lines = [record for record in caplog.records if getattr(record, "saga_id", None) == saga_id]
        assert lines and {getattr(record, "trace_id", None) for record in lines} == {trace_id}
