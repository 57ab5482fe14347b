"""Start, cancel, resume and await sagas from Python, over Kafka alone (the wire contract in ``schemas/``).

    async with SagaClient.from_settings() as client:
        handle = await client.start("trip", "trip-42", {"customer_id": "c-7", ...})
        ended = await handle.result(timeout_s=60)       # SagaCompleted, SagaCompensated, ...

A handle reads the saga's events from ``saga.events``: only the partition its saga id (the Kafka key) maps to,
from where that partition ended just before the start was published, so it misses nothing and reads little.
Events come at least once; a handle yields each seq once, in order.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any, Protocol, cast

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from pydantic import BaseModel

from ..infra.deployment import load_deployment
from ..infra.inputs import refuse_unknown_records
from ..infra.kafka_clients import KafkaClients, KafkaSecurity, KafkaSetupError
from ..infra.misconfigured import Misconfigured
from ..infra.settings import Settings
from ..schemas import wire
from ..schemas.codec import WireError
from ..schemas.event_types import TERMINAL_EVENTS, Event, SagaRejected, SagaStarted, StepSucceeded
from ..schemas.headers import kafka_headers, message_headers, valid_traceparent
from ..schemas.limits import id_problem
from ..schemas.message_types import (
    ControlCommand,
    OperateSaga,
    SignalSaga,
    StartSaga,
)
from ..schemas.partitioning import partition_for
from ..schemas.registry import SchemaRegistry, default_registry
from ..schemas.topics import Topics
from ..schemas.typed import to_avro
from ..schemas.validation import input_problems
from .api import SagaApi, SagaStatus
from .levers import LeverMethods

CONNECT_TIMEOUT_S = 15.0


class SagaInputError(ValueError):
    """A saga start that could not be valid: an unknown saga type, an empty id or an input that does not fit
    the type's input record. Nothing was published. ``field`` names the argument (saga_type, saga_id or
    saga_input), ``problem`` says what is wrong with it."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(problem if field == "saga_type" else f"{field} {problem}")
        self.field = field
        self.problem = problem


class StartRefused(Exception):
    """The orchestrator refused a start this client published (the saga id was already taken): it recorded
    ``event`` (a SagaRejected) in that saga's stream instead of starting anything."""

    def __init__(self, event: SagaRejected) -> None:
        super().__init__(f"saga {event.saga_id}: start refused ({event.reason})")
        self.event = event


class SagaType(Protocol):
    """What the client reads of a saga definition: its type, version and the record its input must be."""

    @property
    def saga_type(self) -> str: ...

    @property
    def version(self) -> int: ...

    @property
    def input_schema(self) -> str: ...


def signal_records(definitions: Iterable[SagaType]) -> dict[str, dict[str, str]]:
    """Saga type → the signals it takes (name → full name of the record), from the latest version of each type."""
    latest: dict[str, SagaType] = {}
    for definition in definitions:
        known = latest.get(definition.saga_type)
        if known is None or known.version < definition.version:
            latest[definition.saga_type] = definition
    return {saga_type: dict(getattr(definition, "signals", ())) for saga_type, definition in latest.items()}


def input_records(definitions: Iterable[SagaType]) -> dict[str, str]:
    """Saga type → full name of its input record, from the latest version of each type's definition."""
    latest: dict[str, SagaType] = {}
    for definition in definitions:
        known = latest.get(definition.saga_type)
        if known is None or known.version < definition.version:
            latest[definition.saga_type] = definition
    return {saga_type: definition.input_schema for saga_type, definition in latest.items()}


class SagaClient(LeverMethods):
    """A connection to one deployment (bootstrap servers and topic prefix) that starts and follows sagas, and
    pulls the operator's levers (``LeverMethods``: cancel, resume, release, retry_now, skip, ...).

    ``input_records`` maps each saga type the client may start to the full name of its input record (see
    ``input_records``), which ``schemas`` must hold.
    """

    def __init__(self, bootstrap_servers: str, input_records: Mapping[str, str], *, topic_prefix: str = "",
                 schemas: SchemaRegistry | None = None, security: KafkaSecurity | None = None,
                 api: SagaApi | None = None, signals: Mapping[str, Mapping[str, str]] | None = None) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.api = api  # the console's HTTP API, for ``status``
        self.kafka = KafkaClients(bootstrap_servers, security)
        self.topics = Topics(topic_prefix)
        self._input_records = dict(input_records)
        self._signals = {saga_type: dict(declared) for saga_type, declared in (signals or {}).items()}
        self._schemas = schemas or default_registry()
        self._producer: AIOKafkaProducer | None = None
        self._lookup: AIOKafkaConsumer | None = None

    @classmethod
    def from_settings(cls, settings: Settings | None = None, *, schemas: SchemaRegistry | None = None) -> SagaClient:
        """A client for the deployment the environment describes (KAFKA_BOOTSTRAP_SERVERS, the SAGA_KAFKA_*
        security settings, SAGA_TOPIC_PREFIX, and the saga types and their input records of the deployment:
        ``infra.deployment``)."""
        current = settings or Settings()
        deployment = load_deployment(current)
        found = deployment.saga_types
        for reference, definition in found.items():
            if not all(hasattr(definition, name) for name in ("saga_type", "version", "input_schema")):
                raise Misconfigured(f"{deployment.named_by}: {reference} is not a saga definition (it has no "
                                    "saga_type, version and input_schema)")
        if schemas is None:
            refuse_unknown_records(((f"saga type {definition.saga_type}", definition.input_schema)
                                    for definition in cast(list[SagaType], list(found.values()))),
                                   deployment.schema_path)
        definitions = cast(list[SagaType], list(found.values()))
        return cls(current.kafka_servers(), input_records(definitions), topic_prefix=current.saga_topic_prefix,
                   schemas=schemas, security=current.kafka().security, api=api_of(current),
                   signals=signal_records(definitions))

    async def __aenter__(self) -> SagaClient:
        await self.connect()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def connect(self) -> None:
        """Connect to Kafka; ConnectionError says where it could not, KafkaSetupError which setting a broker
        refused (credentials, TLS)."""
        if self._producer is not None:
            return
        try:
            await self.kafka.check(CONNECT_TIMEOUT_S)
        except KafkaSetupError:
            raise
        except Exception as error:  # no bootstrap server answered
            raise ConnectionError(f"cannot reach Kafka at {self.bootstrap_servers} ({error})") from error
        producer = self.kafka.producer(acks="all", enable_idempotence=True)
        lookup = self.kafka.consumer(enable_auto_commit=False)
        try:
            await asyncio.wait_for(producer.start(), CONNECT_TIMEOUT_S)
            await asyncio.wait_for(lookup.start(), CONNECT_TIMEOUT_S)
        except Exception as error:
            await producer.stop()
            await lookup.stop()
            raise ConnectionError(f"cannot reach Kafka at {self.bootstrap_servers} ({error!r})") from error
        self._producer, self._lookup = producer, lookup

    async def close(self) -> None:
        """Disconnect (safe to call twice)."""
        producer, lookup, self._producer, self._lookup = self._producer, self._lookup, None, None
        if producer is not None:
            await producer.stop()
        if lookup is not None:
            await lookup.stop()

    def encode_start(self, saga_type: str, saga_id: str, saga_input: Mapping[str, Any] | BaseModel,
                     tenant_id: str | None = None, version: int | None = None) -> bytes:
        """The StartSaga record for these arguments (the input as its pydantic model or as a plain mapping;
        ``version``: the definition version to start on, None for the latest that takes starts); SagaInputError
        says what to fix."""
        if isinstance(saga_input, BaseModel):
            saga_input = to_avro(saga_input)
        input_record = self._input_records.get(saga_type)
        if input_record is None:
            known = ", ".join(sorted(self._input_records))
            raise SagaInputError("saga_type", f"unknown saga type {saga_type!r}; known types: {known}")
        if not saga_id.strip():
            raise SagaInputError("saga_id", "must not be empty")
        if version is not None and not 1 <= version < 2**31:
            raise SagaInputError("version", f"must be a definition version (>= 1), got {version}")
        if problem := id_problem(saga_id, "the id"):
            raise SagaInputError("saga_id", problem.removeprefix("the id "))
        misfit = f"does not fit {input_record}"
        if problems := input_problems(self._schemas, input_record, saga_input):
            raise SagaInputError("saga_input", f"{misfit}: {'; '.join(problems)}")
        try:
            encoded_input = self._schemas.encode(input_record, dict(saga_input))
        except WireError as error:
            raise SagaInputError("saga_input", f"{misfit}: {error}") from error
        return wire.encode_start(StartSaga(saga_id=saga_id, saga_type=saga_type, tenant_id=tenant_id,
                                           input=encoded_input, definition_version=version))

    async def start(self, saga_type: str, saga_id: str, saga_input: Mapping[str, Any] | BaseModel, *,
                    tenant_id: str | None = None, traceparent: str | None = None,
                    version: int | None = None) -> SagaHandle:
        """Validate, encode and publish a StartSaga; the handle of the saga. ``version``: the definition version to
        start on (None: the latest that takes starts). A saga id already taken, or a version not deployed or
        draining, is refused by the orchestrator: the handle's ``events`` and ``result`` then raise StartRefused."""
        value = self.encode_start(saga_type, saga_id, saga_input, tenant_id, version)
        if traceparent is not None and valid_traceparent(traceparent) is None:
            raise SagaInputError("traceparent", f"is not a W3C trace context: {traceparent!r}")
        handle = SagaHandle(self, saga_id, await self._partition_end(saga_id))
        await self.publish(self.topics.start, saga_id, value, saga_type=saga_type, traceparent=traceparent)
        return handle

    def signal_record(self, signal: str, saga_type: str | None = None) -> str:
        """The record signal ``signal`` carries (of ``saga_type``'s, or of the one saga type that takes it);
        SagaInputError says what to fix."""
        found = {record for declared_type, declared in self._signals.items() for name, record in declared.items()
                 if name == signal and saga_type in (None, declared_type)}
        if len(found) == 1:
            return found.pop()
        if found:
            raise SagaInputError("saga_type", f"signal {signal!r} carries a different record in each of several saga "
                                              "types: name the saga type")
        known = sorted({f"{t}.{name}" for t, declared in self._signals.items() for name in declared
                        if saga_type in (None, t)})
        raise SagaInputError("signal", f"{signal!r} is no signal {'any saga type' if saga_type is None else saga_type}"
                                       f" takes (known: {', '.join(known) or 'none'})")

    def encode_signal(self, saga_id: str, signal: str, payload: Mapping[str, Any] | BaseModel, *,
                      signal_id: str | None = None, sender: str | None = None, saga_type: str | None = None,
                      start_input: Mapping[str, Any] | BaseModel | None = None,
                      tenant_id: str | None = None) -> SignalSaga:
        """The SignalSaga for these arguments, its payload checked against the record the signal carries (and,
        with ``start_input``, a signal-with-start of ``saga_type``); SagaInputError says what to fix."""
        if problem := id_problem(saga_id, "the id"):
            raise SagaInputError("saga_id", problem.removeprefix("the id "))
        signal_id = signal_id or uuid.uuid4().hex
        if problem := id_problem(signal_id, "the id"):
            raise SagaInputError("signal_id", problem.removeprefix("the id "))
        record = self.signal_record(signal, saga_type)
        encoded = self._encoded(record, payload, "payload")
        start = None
        if start_input is not None:
            if saga_type is None:
                raise SagaInputError("saga_type", "a signal that may start its saga names the saga type to start")
            start = wire.decode_start(self.encode_start(saga_type, saga_id, start_input, tenant_id))
        return SignalSaga(saga_id=saga_id, signal_id=signal_id, signal=signal, payload=encoded, sender=sender,
                          start_saga_type=None if start is None else start.saga_type,
                          start_input=None if start is None else start.input, tenant_id=tenant_id)

    async def signal(self, saga_id: str, signal: str, payload: Mapping[str, Any] | BaseModel, *,
                     signal_id: str | None = None, sender: str | None = None, saga_type: str | None = None,
                     start_input: Mapping[str, Any] | BaseModel | None = None, tenant_id: str | None = None) -> str:
        """Publish a SignalSaga: the saga takes it once per ``signal_id`` (default: a fresh one), and a step waiting
        for ``signal`` goes on with ``payload`` as its output; where the saga cannot take it, its history records
        why (SignalRefused). With ``start_input`` (and ``saga_type``) it starts the saga first when there is none.
        The signal's id."""
        message = self.encode_signal(saga_id, signal, payload, signal_id=signal_id, sender=sender, saga_type=saga_type,
                                     start_input=start_input, tenant_id=tenant_id)
        await self.publish(self.topics.control, saga_id, wire.encode_signal(message), saga_type=saga_type)
        return message.signal_id

    def _encoded(self, record: str, value: Mapping[str, Any] | BaseModel, field: str) -> bytes:
        plain = to_avro(value) if isinstance(value, BaseModel) else dict(value)
        misfit = f"does not fit {record}"
        if problems := input_problems(self._schemas, record, plain):
            raise SagaInputError(field, f"{misfit}: {'; '.join(problems)}")
        try:
            return self._schemas.encode(record, plain)
        except WireError as error:
            raise SagaInputError(field, f"{misfit}: {error}") from error

    async def control(self, message: ControlCommand) -> None:
        """Publish any command for topic saga.control (a cancel, resume, release or lever)."""
        await self.publish(self.topics.control, message.saga_id, wire.encode_control(message))

    async def operate(self, message: OperateSaga) -> None:
        """Publish an operator's lever (``message.action``: one of ``schemas.message_types.Lever``) as it is."""
        await self.control(message)

    async def status(self, saga_id: str) -> SagaStatus:
        """The saga's state as the console's HTTP API folds it from its whole history (a saga older than the
        topics' retention too); SagaNotFound for an unknown id, ApiError when the API cannot answer,
        Misconfigured when the client knows no API (SAGA_API_URL)."""
        if self.api is None:
            raise Misconfigured("SagaClient.status reads the console's HTTP API: set SAGA_API_URL (`saga console` "
                                "serves it), or give SagaClient(api=SagaApi(url))")
        return await self.api.status(saga_id)

    def handle(self, saga_id: str, since_ms: int | None = None) -> SagaHandle:
        """The handle of a saga started earlier: its events from ``since_ms`` (epoch ms; default the
        beginning of its partition, which may be long)."""
        return SagaHandle(self, saga_id, None, since_ms)

    async def publish(self, topic: str, saga_id: str, value: bytes, *, saga_type: str | None = None,
                      traceparent: str | None = None) -> None:
        """Publish one encoded record keyed by ``saga_id`` with a fresh ``message_id`` header."""
        await self._connected_producer().send_and_wait(topic, value=value, key=saga_id.encode(),
                                                       headers=client_headers(saga_id, saga_type, traceparent))

    async def events_partition(self, saga_id: str) -> TopicPartition:
        """The partition of ``saga.events`` that holds ``saga_id``'s events."""
        lookup = self._connected_lookup()
        partitions = await topic_partitions(lookup, self.topics.events)
        return TopicPartition(self.topics.events, partition_for(saga_id.encode(), tuple(partitions)))

    async def offset_at(self, partition: TopicPartition, since_ms: int | None) -> int:
        """The first offset of ``partition`` at or after ``since_ms`` (its end when none; its beginning when
        ``since_ms`` is None)."""
        lookup = self._connected_lookup()
        if since_ms is None:
            return int((await lookup.beginning_offsets([partition]))[partition])
        found = (await lookup.offsets_for_times({partition: since_ms}))[partition]
        return int(found.offset) if found is not None else int((await lookup.end_offsets([partition]))[partition])

    async def _partition_end(self, saga_id: str) -> tuple[TopicPartition, int]:
        partition = await self.events_partition(saga_id)
        return partition, int((await self._connected_lookup().end_offsets([partition]))[partition])

    def _connected_producer(self) -> AIOKafkaProducer:
        if self._producer is None:
            raise RuntimeError("the client is not connected: use `async with SagaClient...` or connect()")
        return self._producer

    def _connected_lookup(self) -> AIOKafkaConsumer:
        self._connected_producer()
        assert self._lookup is not None
        return self._lookup


class SagaHandle:
    """One saga's events as ``saga.events`` carries them. ``outputs`` collects, as the events are read, what
    each step that succeeded answered (``StepSucceeded.output``, by step name): the saga's results."""

    def __init__(self, client: SagaClient, saga_id: str, position: tuple[TopicPartition, int] | None,
                 since_ms: int | None = None) -> None:
        self.saga_id = saga_id
        self._client = client
        self._position = position
        self._since_ms = since_ms
        self.outputs: dict[str, bytes] = {}

    async def events(self, timeout_s: float | None = None) -> AsyncIterator[Event]:
        """Each event of the saga once, in seq order, as it is published, until its terminal event (included);
        TimeoutError when ``timeout_s`` passes first; StartRefused when the start this handle published was
        refused."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        partition, offset = self._position or await self._first_position()
        key = self.saga_id.encode()
        consumer = self._client.kafka.consumer(enable_auto_commit=False, isolation_level="read_committed")
        await consumer.start()
        try:
            consumer.assign([partition])
            consumer.seek(partition, offset)
            last_seq = 0
            started = self._position is None  # a handle of our own start waits to see its SagaStarted
            while True:
                left_ms = 500 if deadline is None else int((deadline - time.monotonic()) * 1000)
                if left_ms <= 0:
                    raise TimeoutError(f"saga {self.saga_id} did not end within {timeout_s} s")
                records = (await consumer.getmany(partition, timeout_ms=min(left_ms, 500))).get(partition, [])
                for record in records:
                    event = _event_of(record.key, record.value, key, self.saga_id)
                    if event is None or event.seq <= last_seq:
                        continue  # another saga's, or a copy of one already seen (at-least-once)
                    last_seq = event.seq
                    if isinstance(event, SagaRejected) and not started:
                        raise StartRefused(event)
                    started = started or isinstance(event, SagaStarted)
                    if isinstance(event, StepSucceeded) and event.output is not None:
                        self.outputs[event.step] = event.output
                    yield event
                    if isinstance(event, TERMINAL_EVENTS):
                        return
        finally:
            await consumer.stop()

    async def result(self, timeout_s: float | None = None) -> Event:
        """The saga's terminal event (SagaCompleted, SagaCompensated, ...); TimeoutError when ``timeout_s``
        passes first."""
        async for event in self.events(timeout_s):
            if isinstance(event, TERMINAL_EVENTS):
                return event
        raise AssertionError("unreachable: events() ends only at a terminal event")

    async def _first_position(self) -> tuple[TopicPartition, int]:
        partition = await self._client.events_partition(self.saga_id)
        return partition, await self._client.offset_at(partition, self._since_ms)


def api_of(settings: Settings) -> SagaApi | None:
    """The console's API that SAGA_API_URL names (with SAGA_API_USER and SAGA_API_PASSWORD), or None."""
    if not settings.saga_api_url:
        return None
    password = settings.saga_api_password.get_secret_value() if settings.saga_api_password else ""
    return SagaApi(settings.saga_api_url, (settings.saga_api_user, password) if settings.saga_api_user else None)


def client_headers(saga_id: str, saga_type: str | None = None,
                   traceparent: str | None = None) -> list[tuple[str, bytes]]:
    """The headers of a record a client publishes: a fresh ``message_id`` (the orchestrator dedupes on it),
    the saga id and type, and the trace context when there is one."""
    return kafka_headers(message_headers(str(uuid.uuid4()), saga_id=saga_id, saga_type=saga_type,
                                         traceparent=traceparent))


def _event_of(key: bytes | None, value: bytes | None, wanted_key: bytes, saga_id: str) -> Event | None:
    if key != wanted_key or value is None:
        return None
    try:
        event = wire.decode_event(value)
    except WireError:
        return None  # not ours to judge: audit and the consumers report undecodable records
    return event if event.saga_id == saga_id else None


async def topic_partitions(consumer: AIOKafkaConsumer, topic: str) -> list[int]:
    """The partitions of ``topic`` (sorted), waiting a little for the metadata of a topic just created;
    RuntimeError when it does not exist."""
    for _ in range(50):
        partitions = consumer.partitions_for_topic(topic)
        if partitions:
            return sorted(partitions)
        await consumer._client.force_metadata_update()  # a new topic is not in the cached metadata yet
        await asyncio.sleep(0.1)
    raise RuntimeError(f"topic {topic} does not exist")
