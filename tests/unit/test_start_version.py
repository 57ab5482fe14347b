"""A StartSaga that names its definition version: started on it, or refused when it is not deployed or drains; one
naming none starts on the latest version that takes starts."""

from __future__ import annotations

import dataclasses

import pytest

from saga_orchestrator.orchestrator.domain.decide import decide
from saga_orchestrator.orchestrator.domain.definition import DefinitionRegistry
from saga_orchestrator.orchestrator.domain.errors import InvalidMessage, StartRefused
from saga_orchestrator.orchestrator.domain.messages import RejectedRecord
from saga_orchestrator.orchestrator.domain.starting import start_definition
from saga_orchestrator.orchestrator.inbound import RecordParser
from saga_orchestrator.participants.trip import PARTICIPANTS
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.participants.trip.scenarios import SCENARIOS
from saga_orchestrator.schemas import event_types as ev
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.codec import UnknownFingerprint
from saga_orchestrator.schemas.message_types import StartSaga
from saga_orchestrator.schemas.records import ConsumedRecord
from saga_orchestrator.schemas.registry import SCHEMAS_DIR, SchemaRegistry, default_registry
from saga_orchestrator.schemas.topics import Topics
from saga_orchestrator.testing.environment import SagaEnvironment

V2 = dataclasses.replace(TRIP, version=2)
V3 = dataclasses.replace(TRIP, version=3)


def _registry(*draining: int) -> DefinitionRegistry:
    registry = DefinitionRegistry([TRIP, V2, V3])
    for version in draining:
        registry.drain("trip", version)
    return registry


def _start(version: int | None) -> StartSaga:
    return dataclasses.replace(SCENARIOS["happy"].start("s-1"), definition_version=version)


def _started_on(registry: DefinitionRegistry, version: int | None) -> ev.Event:
    return decide(start_definition(registry, _start(version)), None, _start(version), 1_000).events[0]


def test_a_start_naming_a_version_starts_on_it() -> None:
    started = _started_on(_registry(), 2)
    assert isinstance(started, ev.SagaStarted) and started.definition_version == 2
    assert started.definition_fingerprint == V2.fingerprint


def test_a_start_naming_no_version_starts_on_the_latest_not_draining() -> None:
    started = _started_on(_registry(3), None)
    assert isinstance(started, ev.SagaStarted) and started.definition_version == 2
    assert start_definition(_registry(), _start(None)) is V3


@pytest.mark.parametrize(("draining", "version", "said"), [
    ((), 7, "saga_type 'trip' has no version 7 (registered: v1, v2, v3)"),
    ((2,), 2, "saga_type 'trip' v2 is draining: it takes no new starts (versions taking starts: v1, v3)"),
    ((1, 2, 3), 1, "saga_type 'trip' v1 is draining: it takes no new starts (versions taking starts: none)"),
    ((1, 2, 3), None, "every deployed version of saga_type 'trip' is draining (v1, v2, v3): it takes no new starts"),
])
def test_a_start_on_a_version_not_deployed_or_draining_is_refused_saying_why(
        draining: tuple[int, ...], version: int | None, said: str) -> None:
    with pytest.raises(StartRefused) as refused:
        start_definition(_registry(*draining), _start(version))
    assert str(refused.value) == said
    parser = RecordParser(Topics(), _registry(*draining), default_registry(), PARTICIPANTS)
    record = ConsumedRecord(topic=Topics().start, partition=0, offset=0, key=b"s-1",
                            value=wire.encode_start(_start(version)))
    rejected = parser.parse(record).message  # refused at the door, as a start of an unknown type is
    assert isinstance(rejected, RejectedRecord) and rejected.reason == said


def test_the_decision_records_a_refused_start_naming_its_version() -> None:
    [rejected] = decide(None, None, _start(7), 1_000).events
    assert isinstance(rejected, ev.SagaRejected)
    assert rejected.reason == "saga type 'trip' takes no starts on v7"


def test_a_start_given_another_version_than_it_names_is_invalid() -> None:
    with pytest.raises(InvalidMessage, match="naming v2 of 'trip' given the definition of v1"):
        decide(TRIP, None, _start(2), 1_000)


async def test_the_test_kit_starts_on_the_version_asked_and_the_orchestrator_refuses_a_draining_one() -> None:
    env = SagaEnvironment(TRIP, V2)
    trip = SCENARIOS["happy"].trip("x")
    on_v1 = await env.start("trip", trip, saga_id="on-v1", version=1)
    assert env.history(on_v1)[0].definition_version == 1
    assert env.history(await env.start("trip", trip, saga_id="on-v2"))[0].definition_version == 2
    env.definitions.drain("trip", 1)
    refused = await env.start("trip", trip, saga_id="refused", version=1)
    assert [type(event) for event in env.history(refused)] == [ev.SagaRejected]


def test_a_start_naming_no_version_is_written_so_that_an_orchestrator_of_0_2_reads_it() -> None:
    released = SchemaRegistry.from_directory(SCHEMAS_DIR / "released" / "0.2.0")  # what a 0.2.0 orchestrator reads
    plain = wire.encode_start(_start(None))
    assert wire.decode_start(plain, released) == _start(None)
    assert wire.decode_start(plain) == _start(None)
    pinned = wire.encode_start(_start(2))
    assert wire.decode_start(pinned).definition_version == 2
    with pytest.raises(UnknownFingerprint):  # it uses a field added since: only this release reads it
        wire.decode_start(pinned, released)
