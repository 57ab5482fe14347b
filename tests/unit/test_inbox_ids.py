"""Inbox ids no client can forge: the ids the system derives (a reply's, a timer's) live in namespaces apart from
the ``message_id`` headers clients give, and a record without a header is deduplicated by its content."""

from __future__ import annotations

from saga_orchestrator.orchestrator.domain.definition import DefinitionRegistry
from saga_orchestrator.orchestrator.inbound import (
    CLIENT_IDS,
    CONTENT_IDS,
    REJECTED_IDS,
    REPLY_IDS,
    Envelope,
    RecordParser,
    content_digest,
)
from saga_orchestrator.orchestrator.service import Outcome, SagaService
from saga_orchestrator.orchestrator.store.memory import MemoryStore
from saga_orchestrator.participants.trip import PARTICIPANTS, TRIP
from saga_orchestrator.participants.trip.scenarios import SCENARIOS
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.message_types import CancelSaga, CommandKind, ResultStatus, StepResult
from saga_orchestrator.schemas.records import ConsumedRecord
from saga_orchestrator.schemas.registry import default_registry
from saga_orchestrator.schemas.topics import Topics

TOPICS = Topics()
PARSER = RecordParser(TOPICS, DefinitionRegistry([TRIP]), default_registry(), PARTICIPANTS)


class Log:
    """Records as a topic would hold them: each at the next offset of its partition."""

    def __init__(self) -> None:
        self.offsets: dict[str, int] = {}

    def record(self, topic: str, key: str, value: bytes, message_id: str | None = None) -> ConsumedRecord:
        offset = self.offsets[topic] = self.offsets.get(topic, -1) + 1
        headers = () if message_id is None else (("message_id", message_id.encode()),)
        return ConsumedRecord(topic=topic, partition=0, offset=offset, key=key.encode(), value=value, headers=headers)


def _service(store: MemoryStore, now: list[int]) -> SagaService:
    return SagaService(store, DefinitionRegistry([TRIP]), TOPICS, lambda: now[0])


def _reply(saga_id: str, step: str, attempt: int = 1) -> bytes:
    return wire.encode_result(StepResult(saga_id=saga_id, step=step, kind=CommandKind.FORWARD,
                                         idempotency_key=f"{saga_id}:{step}", attempt=attempt,
                                         status=ResultStatus.SUCCEEDED))


def test_each_kind_of_message_is_keyed_in_its_own_namespace() -> None:
    log = Log()
    start = log.record(TOPICS.start, "s-1", wire.encode_start(SCENARIOS["happy"].start("s-1")), "client-id-1")
    assert PARSER.parse(start).inbox_key == (CLIENT_IDS, "client-id-1")
    headerless = log.record(TOPICS.start, "s-2", wire.encode_start(SCENARIOS["happy"].start("s-2")))
    assert PARSER.parse(headerless).inbox_key == (CONTENT_IDS, content_digest(headerless))
    # A reply is keyed by what it answers, whatever its header says.
    reply = log.record(TOPICS.results("flight"), "s-1", _reply("s-1", "book_flight", 2), "forged")
    assert PARSER.parse(reply).inbox_key == (REPLY_IDS, "s-1:book_flight:reply:2")
    junk = log.record(TOPICS.control, "s-1", b"junk", "client-id-2")
    assert PARSER.parse(junk).inbox_key == (REJECTED_IDS, f"{junk.position_id}:{content_digest(junk)}")


async def test_a_client_message_carrying_a_replys_or_a_timers_id_swallows_neither() -> None:
    store, now, log = MemoryStore(), [1_000], Log()
    service = _service(store, now)
    start = wire.encode_start(SCENARIOS["happy"].start("s-1"))
    assert await service.handle(PARSER.parse(log.record(TOPICS.start, "s-1", start, "m-start"))) is Outcome.APPLIED
    for forged in ("s-1:book_flight:reply:1", "timer:s-1:STEP_TIMEOUT:book_hotel:1"):
        cancel = wire.encode_cancel(CancelSaga(saga_id="nobody", reason="forged id"))
        attack = PARSER.parse(log.record(TOPICS.control, "nobody", cancel, forged))
        assert await service.handle(attack) is Outcome.DEAD_LETTERED  # no saga "nobody": parked

    reply = PARSER.parse(log.record(TOPICS.results("flight"), "s-1", _reply("s-1", "book_flight"),
                                    "s-1:book_flight:reply:1"))
    assert await service.handle(reply) is Outcome.APPLIED  # not taken for a duplicate of the forged id
    now[0] += 60_000  # past the hotel step's timeout
    assert await service.fire_due_timers(100) >= 1
    names = [event.event_type for event in store.events["s-1"]]
    assert "StepSucceeded" in names and "StepTimedOut" in names  # the timer fired


async def test_a_record_without_a_header_is_deduplicated_by_its_content_not_its_offset() -> None:
    store, now = MemoryStore(), [1_000]
    service = _service(store, now)
    start = wire.encode_start(SCENARIOS["happy"].start("s-1"))
    first = ConsumedRecord(topic=TOPICS.start, partition=0, offset=0, key=b"s-1", value=start)
    assert await service.handle(PARSER.parse(first)) is Outcome.APPLIED
    copy_elsewhere = ConsumedRecord(topic=TOPICS.start, partition=3, offset=9, key=b"s-1", value=start)
    assert await service.handle(PARSER.parse(copy_elsewhere)) is Outcome.DUPLICATE
    # The topic was recreated: another start lands at the offset the first one had.
    other = wire.encode_start(SCENARIOS["happy"].start("s-2"))
    same_place = ConsumedRecord(topic=TOPICS.start, partition=0, offset=0, key=b"s-2", value=other)
    assert await service.handle(PARSER.parse(same_place)) is Outcome.APPLIED
    assert store.events["s-2"][0].event_type == "SagaStarted"


async def test_a_timer_is_claimed_by_its_row_and_fires_once() -> None:
    store, now = MemoryStore(), [1_000]
    service = _service(store, now)
    assert await service.handle(Envelope(SCENARIOS["happy"].start("s-1"), "m-1", inbox_key=(CLIENT_IDS, "m-1")))
    now[0] += 60_000
    fired = await service.fire_due_timers(100)
    assert fired == 2  # the two booking steps' timeouts
    assert await service.fire_due_timers(100) == 0
    timed_out = [e for e in store.events["s-1"] if e.event_type == "StepTimedOut"]
    assert len(timed_out) == 2
