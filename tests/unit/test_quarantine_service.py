"""Quarantine through the orchestrator's pipeline (in-memory store): a wrong reply for a live saga is dead-lettered
and the saga goes on; a saga that cannot go on (its definition version is not deployed, a message fails every
time) is quarantined with an event, its timers stop, the rest of the batch goes on, and a release once the
cause is fixed finishes it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace

import asyncpg
import pytest

from bench.trip_changes import FRAUD_CHECKED
from saga_orchestrator.infra.failures import Fault, classify
from saga_orchestrator.orchestrator.assignment import GroupView, shapes_of
from saga_orchestrator.orchestrator.domain.definition import DefinitionRegistry
from saga_orchestrator.orchestrator.domain.messages import RejectedRecord
from saga_orchestrator.orchestrator.inbound import CLIENT_IDS, Envelope, RecordParser
from saga_orchestrator.orchestrator.ports import Writes
from saga_orchestrator.orchestrator.service import Outcome, SagaService, ServedElsewhere
from saga_orchestrator.orchestrator.store.memory import MemoryStore, MemoryUnitOfWork
from saga_orchestrator.participants.trip import PARTICIPANTS, TRIP
from saga_orchestrator.participants.trip.scenarios import SCENARIOS
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.limits import MAX_TEXT_CHARS
from saga_orchestrator.schemas.message_types import (
    CancelSaga,
    CommandKind,
    DeadLetter,
    ReleaseSaga,
    ResultStatus,
    StepResult,
)
from saga_orchestrator.schemas.records import ConsumedRecord
from saga_orchestrator.schemas.registry import default_registry
from saga_orchestrator.schemas.topics import Topics

TOPICS = Topics()
TRIP_V2 = replace(TRIP, version=2)


class World:
    """A service over a memory store, fed records as topics would hold them, answering its commands."""

    def __init__(self, store: MemoryStore | None = None, definitions: tuple[object, ...] = (TRIP,)) -> None:
        self.now = [1_000]
        self.store = store or MemoryStore(clock_ms=lambda: self.now[0])
        self.offsets: dict[str, int] = {}
        self.letters: list[DeadLetter] = []
        self.deploy(*definitions)

    def deploy(self, *definitions: object,
               served_elsewhere: Callable[[str, int, str | None], bool] | None = None) -> None:
        """A new orchestrator process with these definitions (the store stays); ``served_elsewhere``: what the
        rest of its group serves."""
        registry = DefinitionRegistry(definitions)  # type: ignore[arg-type]
        self.parser = RecordParser(TOPICS, registry, default_registry(), PARTICIPANTS)
        self.service = SagaService(self.store, registry, TOPICS, lambda: self.now[0],
                                   served_elsewhere=served_elsewhere)

    def record(self, topic: str, key: str, value: bytes) -> Envelope:
        offset = self.offsets[topic] = self.offsets.get(topic, -1) + 1
        return self.parser.parse(ConsumedRecord(topic=topic, partition=0, offset=offset, key=key.encode(),
                                                value=value, headers=()))

    def start(self, saga_id: str) -> Envelope:
        return self.record(TOPICS.start, saga_id, wire.encode_start(SCENARIOS["happy"].start(saga_id)))

    def reply(self, saga_id: str, step: str, key: str | None = None, attempt: int = 1,
              participant: str = "flight") -> Envelope:
        result = StepResult(saga_id=saga_id, step=step, kind=CommandKind.FORWARD,
                            idempotency_key=key or f"{saga_id}:{step}", attempt=attempt,
                            status=ResultStatus.SUCCEEDED)
        return self.record(TOPICS.results(participant), saga_id, wire.encode_result(result))

    def release(self, saga_id: str, detail: str) -> Envelope:
        release = ReleaseSaga(saga_id=saga_id, operator="ops", detail=detail)
        return self.record(TOPICS.control, saga_id, wire.encode_release(release))

    def answers(self) -> list[Envelope]:
        """A success for every command in the outbox (drained); dead letters are kept in ``letters``."""
        envelopes = []
        for message in self.store.drain_outbox():
            if message.topic == TOPICS.dlq:
                self.letters.append(wire.decode_dead_letter(message.value))
                continue
            participant = next((p for p in PARTICIPANTS if message.topic == TOPICS.commands(p)), None)
            if participant is None:
                continue  # an event for saga.events
            command = wire.decode_command(message.value, participant=participant, message_id=message.message_id)
            result = StepResult(saga_id=command.saga_id, step=command.step, kind=command.kind,
                                idempotency_key=command.idempotency_key, attempt=command.attempt,
                                status=ResultStatus.SUCCEEDED)
            envelopes.append(self.record(TOPICS.results(participant), command.saga_id, wire.encode_result(result)))
        return envelopes

    async def run_to_rest(self, envelopes: list[Envelope]) -> None:
        while envelopes:
            await self.service.handle_many(envelopes)
            envelopes = self.answers()

    def status(self, saga_id: str) -> str:
        return self.store.summaries[saga_id].status

    def event_types(self, saga_id: str) -> list[str]:
        return [event.event_type for event in self.store.events[saga_id]]


async def test_a_reply_that_contradicts_its_live_saga_is_dead_lettered_and_the_saga_goes_on() -> None:
    world = World()
    await world.service.handle_many([world.start("s-1"), world.start("s-2")])
    commands = world.answers()
    unknown_step = world.reply("s-1", "book_spaceship")
    foreign_key = world.reply("s-1", "book_flight", key="s-2:book_flight")
    outcomes = await world.service.handle_many([unknown_step, foreign_key, *commands])
    assert outcomes[:2] == [Outcome.DEAD_LETTERED, Outcome.DEAD_LETTERED]
    await world.run_to_rest(world.answers())
    assert world.status("s-1") == world.status("s-2") == "COMPLETED"
    reasons = [letter.reason for letter in world.letters]
    assert any("book_spaceship" in reason for reason in reasons)
    assert any("s-2:book_flight" in reason for reason in reasons)
    letter = next(letter for letter in world.letters if "book_spaceship" in letter.reason)
    assert unknown_step.raw is not None and letter.original_value == unknown_step.raw.value  # its bytes kept
    assert letter.saga_id == "s-1"


async def test_a_saga_whose_version_is_not_deployed_is_quarantined_and_released_once_it_is() -> None:
    world = World()
    await world.service.handle_many([world.start("old"), world.start("other")])
    pending = world.answers()
    world.deploy(TRIP_V2)  # version 1 is gone: "old" and "other" cannot be folded any more
    outcomes = await world.service.handle_many(pending)
    assert set(outcomes) == {Outcome.DEAD_LETTERED}
    for saga_id in ("old", "other"):
        assert world.event_types(saga_id)[-1] == "SagaQuarantined"
        assert world.event_types(saga_id).count("SagaQuarantined") == 1  # once, however many messages met it
        assert world.status(saga_id) == "QUARANTINED"
        assert "UnknownDefinition" in (world.store.summaries[saga_id].reason or "")
    world.answers()
    assert len(world.letters) == len(pending)  # every reply parked with its bytes
    world.now[0] += 600_000
    assert await world.service.fire_due_timers(100) >= 1  # timers of a quarantined saga do nothing ...
    assert world.event_types("old")[-1] == "SagaQuarantined"
    assert not world.store.timers  # ... and are gone

    # A release before the fix is refused with the reason; after the fix it finishes the saga.
    before = world.event_types("old")
    assert await world.service.handle(world.release("old", "before the fix")) is Outcome.DEAD_LETTERED
    assert world.event_types("old") == before
    world.answers()
    assert "cannot be released: UnknownDefinition" in world.letters[-1].reason
    world.deploy(TRIP, TRIP_V2)
    await world.run_to_rest([world.release("old", "deployed version 1 again")])
    assert world.status("old") == "COMPLETED" and world.status("other") == "QUARANTINED"
    # The release re-sent the open bookings (attempt 2) and their answers finished the saga.
    assert world.event_types("old").count("StepCommandSent") == 2 + 2 + 2  # then the charge and the itinerary


async def test_a_saga_whose_version_another_member_serves_waits_for_it_instead_of_quarantine() -> None:
    world = World(definitions=(TRIP, TRIP_V2))  # the new instance starts sagas on version 2
    await world.service.handle_many([world.start("new")])
    pending = world.answers()
    group = GroupView(grace_s=0)
    group.assigned(shapes_of([TRIP, TRIP_V2]))  # the group's last assignment: a member serves v2
    world.deploy(TRIP, served_elsewhere=group.serves)  # the old instance received the saga's replies
    before = world.event_types("new")
    with pytest.raises(ServedElsewhere) as waited:
        await world.service.handle_many(pending)
    assert classify(waited.value) is Fault.PLATFORM  # not now: unacknowledged, waited out, no poison attempt
    assert world.event_types("new") == before and world.status("new") != "QUARANTINED"
    assert not world.answers() and not world.letters

    world.deploy(TRIP, TRIP_V2, served_elsewhere=group.serves)  # the partitions moved to the member serving v2
    await world.run_to_rest(pending)
    assert world.status("new") == "COMPLETED"

    await world.service.handle_many([world.start("stranded")])
    pending = world.answers()
    group.assigned(shapes_of([TRIP]))  # no member serves v2 any more (past the grace): as before
    world.deploy(TRIP, served_elsewhere=group.serves)
    assert set(await world.service.handle_many(pending)) == {Outcome.DEAD_LETTERED}
    assert world.status("stranded") == "QUARANTINED"


async def test_a_saga_on_a_shape_another_member_serves_waits_for_it_instead_of_quarantine() -> None:
    # A patch marker deploying: this instance runs TRIP, another the same version with the marker.
    world = World()
    await world.service.handle_many([world.start("taken")])
    replies = world.answers()
    flight = [e for e in replies if e.raw is not None and e.raw.topic == TOPICS.results("flight")]
    await world.service.handle_many(flight)
    world.deploy(FRAUD_CHECKED)  # the other instance owns the partition a while: one trip takes the patch there
    await world.service.handle_many([*(e for e in replies if e not in flight), world.start("patched")])
    assert "PatchTaken" in world.event_types("taken")  # the other started on the patched shape
    pending = world.answers()
    group = GroupView(grace_s=0)
    group.assigned(shapes_of([TRIP, FRAUD_CHECKED]))
    world.deploy(TRIP, served_elsewhere=group.serves)  # back to this instance, which lacks the patched shape
    before = {saga_id: world.event_types(saga_id) for saga_id in ("taken", "patched")}
    for envelope in pending:
        with pytest.raises(ServedElsewhere, match="of shape"):
            await world.service.handle_many([envelope])
    assert {saga_id: world.event_types(saga_id) for saga_id in before} == before
    assert not world.answers() and not world.letters

    world.deploy(FRAUD_CHECKED, served_elsewhere=group.serves)  # the partitions moved to the member with the patch
    await world.run_to_rest(pending)
    assert world.status("taken") == world.status("patched") == "COMPLETED"

    await world.service.handle_many([world.start("stranded")])
    pending = world.answers()
    group.assigned(shapes_of([TRIP]))  # no member serves the patched shape any more (past the grace): as before
    world.deploy(TRIP, served_elsewhere=group.serves)
    assert set(await world.service.handle_many(pending)) == {Outcome.DEAD_LETTERED}
    assert world.status("stranded") == "QUARANTINED"
    assert "ShapeChanged" in (world.store.summaries["stranded"].reason or "")


class FailsForOneSaga(MemoryStore):
    """A store whose writes of one saga's decisions fail for a reason that is not an outage (a constraint, a
    bug): every time, until the saga is quarantined."""

    def __init__(self, saga_id: str) -> None:
        super().__init__(clock_ms=lambda: 1_000)
        self.saga_id = saga_id
        self.failures = 0
        self.armed = False

    @asynccontextmanager
    async def begin(self) -> AsyncIterator[MemoryUnitOfWork]:
        async with super().begin() as uow:
            original = uow.write

            async def write(writes: Writes) -> None:
                poisoned = [e for e in writes.events if e.saga_id == self.saga_id and e.event_type != "SagaQuarantined"]
                if poisoned and self.armed:
                    self.failures += 1
                    raise RuntimeError(f"check constraint violated by {self.saga_id}")
                await original(writes)

            uow.write = write  # type: ignore[method-assign]
            yield uow


async def test_a_message_that_fails_every_time_quarantines_its_saga_alone() -> None:
    store = FailsForOneSaga("bad")
    world = World(store)
    await world.service.handle_many([world.start("good"), world.start("bad"), world.start("fine")])
    store.armed = True
    pending = world.answers()
    outcomes = await world.service.handle_many(pending)
    bad = [outcome for envelope, outcome in zip(pending, outcomes, strict=True) if envelope.message.saga_id == "bad"]
    assert bad == [Outcome.DEAD_LETTERED, Outcome.DEAD_LETTERED]  # the flight's reply, then the hotel's
    # The batch once, the saga alone once, the flight's reply alone POISON_ATTEMPTS (3) times; the hotel's
    # reply then meets a quarantined saga and is parked without a try.
    assert store.failures == 1 + 1 + 3
    assert world.event_types("bad")[-1] == "SagaQuarantined" and world.status("bad") == "QUARANTINED"
    await world.run_to_rest(world.answers())
    assert world.status("good") == world.status("fine") == "COMPLETED"
    first, second = world.letters
    assert first.saga_id == "bad" and "RuntimeError: check constraint violated by bad" in first.reason
    assert first.original_value and "is quarantined" in second.reason


async def test_a_decision_that_cannot_be_recorded_quarantines_its_saga() -> None:
    world = World()
    await world.run_to_rest([world.start("s-1")])
    assert world.status("s-1") == "COMPLETED"
    await world.service.handle_many([world.start("s-2")])
    # A cancel whose reason would make an event over the codec's limit (the door refuses such a record; this one
    # is handed over as a message, as a bug in the door would): the decision cannot be written.
    huge = Envelope(CancelSaga(saga_id="s-2", reason="r" * 1_100_000), "m-huge", inbox_key=(CLIENT_IDS, "m-huge"))
    assert await world.service.handle(huge) is Outcome.APPLIED  # the quarantine (no record handed over to park)
    events = world.store.events["s-2"]
    assert events[-1].event_type == "SagaQuarantined" and world.status("s-2") == "QUARANTINED"
    assert "decision not recorded" in (world.store.summaries["s-2"].reason or "")


def test_the_door_refuses_texts_over_their_limit() -> None:
    world = World()
    cancel = wire.encode_cancel(CancelSaga(saga_id="s-1", reason="r" * (MAX_TEXT_CHARS + 1)))
    parsed = world.record(TOPICS.control, "s-1", cancel)
    assert isinstance(parsed.message, RejectedRecord)
    assert parsed.message.reason == (f"reason of {MAX_TEXT_CHARS + 1} characters is longer than the "
                                     f"{MAX_TEXT_CHARS} allowed")


async def test_a_timer_that_fails_every_time_quarantines_its_saga_and_the_other_timers_fire() -> None:
    store = FailsForOneSaga("bad")
    world = World(store)
    store.clock_ms = lambda: world.now[0]
    await world.service.handle_many([world.start("good"), world.start("bad"), world.start("fine")])
    world.store.drain_outbox()  # the commands are never answered: their timeouts come due
    store.armed = True
    world.now[0] += 60_000
    fired = await world.service.fire_due_timers(100)
    assert fired == 6  # the flight's and the hotel's timeout of each saga
    # The batch once, the saga alone once, the first of its timers alone POISON_ATTEMPTS (3) times; its second
    # timer then meets a quarantined saga and changes nothing.
    assert store.failures == 1 + 1 + 3
    assert world.status("bad") == "QUARANTINED" and "check constraint violated by bad" in (
        world.store.summaries["bad"].reason or "")
    for saga in ("good", "fine"):
        assert world.event_types(saga).count("StepTimedOut") == 2 and world.status(saga) == "RUNNING"


class AwayForAWhile(MemoryStore):
    """A store whose commits fail as Postgres's do while its disk is full, ``outage`` times."""

    def __init__(self, outage: int) -> None:
        super().__init__(clock_ms=lambda: 1_000)
        self.outage = outage
        self.tries = 0

    @asynccontextmanager
    async def begin(self) -> AsyncIterator[MemoryUnitOfWork]:
        async with super().begin() as uow:
            yield uow
            self.tries += 1
            if self.outage:
                self.outage -= 1
                raise asyncpg.DiskFullError("could not extend file \"base/16384/16500\": No space left on device")


async def test_a_platform_fault_reaches_the_caller_and_spends_no_poison_attempt() -> None:
    store = AwayForAWhile(outage=0)
    world = World(store)
    await world.service.handle_many([world.start("s-1"), world.start("s-2")])
    store.outage, store.tries = 5, 0
    answers = world.answers()
    for _ in range(5):  # what the consumer does: wait, then hand the same messages over again
        with pytest.raises(asyncpg.DiskFullError):
            await world.service.handle_many(answers)
    assert store.tries == 5  # one unit each time: the batch, never a rung below it
    await world.run_to_rest(answers)
    assert world.status("s-1") == world.status("s-2") == "COMPLETED"
    assert world.letters == []
