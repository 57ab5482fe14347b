"""A deploy checked against the running sagas (``domain.deploys.stranded`` and the orchestrator's start check):
the rows of the table a deploy can meet, each with its verdict."""

from __future__ import annotations

import dataclasses

import pytest

from saga_orchestrator.infra.misconfigured import Misconfigured
from saga_orchestrator.orchestrator.audit import compare_states
from saga_orchestrator.orchestrator.bootstrap import DeployRefused, check_running_sagas, drained
from saga_orchestrator.orchestrator.domain.definition import DefinitionRegistry, RetryPolicy, SagaDefinition, Step
from saga_orchestrator.orchestrator.domain.deploys import RunningShape, stranded
from saga_orchestrator.orchestrator.domain.messages import RejectedRecord
from saga_orchestrator.orchestrator.inbound import Envelope, RecordParser
from saga_orchestrator.orchestrator.service import Outcome, SagaService
from saga_orchestrator.orchestrator.store.memory import MemoryStore
from saga_orchestrator.participants.trip import PARTICIPANTS
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.participants.trip.scenarios import SCENARIOS
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.message_types import StartSaga
from saga_orchestrator.schemas.records import ConsumedRecord
from saga_orchestrator.schemas.registry import default_registry
from saga_orchestrator.schemas.topics import Topics
from saga_orchestrator.testing.history import SagaRun


def _with_check(definition: SagaDefinition) -> SagaDefinition:
    """The trip with a fraud check before the charge, edited in place (same version)."""
    check = Step(name="fraud_check", participant="payment", command="check", depends_on=("book_flight", "book_hotel"))
    steps = tuple(dataclasses.replace(step, depends_on=("fraud_check",)) if step.name == "charge_card" else step
                  for step in definition.steps)
    return dataclasses.replace(definition, steps=(*steps, check))


def _patient(definition: SagaDefinition) -> SagaDefinition:
    steps = tuple(dataclasses.replace(step, retry=RetryPolicy(max_attempts=9)) if step.name == "book_hotel" else step
                  for step in definition.steps)
    return dataclasses.replace(definition, steps=steps)


RUNNING = [RunningShape("trip", 1, TRIP.fingerprint, 37)]
RECORDED = {TRIP.fingerprint: TRIP.shape()}


def test_the_same_definitions_strand_nothing() -> None:
    assert stranded(DefinitionRegistry([TRIP]), RUNNING, RECORDED) == []


def test_a_change_of_policy_in_place_strands_nothing() -> None:
    assert stranded(DefinitionRegistry([_patient(TRIP)]), RUNNING, RECORDED) == []


def test_an_edit_in_place_names_the_type_version_count_and_step() -> None:
    edited = _with_check(TRIP)
    [line] = stranded(DefinitionRegistry([edited]), RUNNING, RECORDED)
    assert line.startswith(f"trip v1: 37 running sagas started on shape {TRIP.fingerprint} would be quarantined")
    assert edited.fingerprint in line and "fraud_check" in line and "as v2 beside v1" in line
    assert "\n" not in line


def test_a_removed_version_names_what_is_deployed() -> None:
    v2 = dataclasses.replace(_with_check(TRIP), version=2)
    [line] = stranded(DefinitionRegistry([v2]), [RunningShape("trip", 1, TRIP.fingerprint, 1)], RECORDED)
    assert line == ("trip v1: 1 running saga would be quarantined: v1 is not deployed (deployed: v2); keep it beside "
                    "the new version until they end")


def test_a_new_version_beside_the_old_strands_nothing() -> None:
    v2 = dataclasses.replace(_with_check(TRIP), version=2)
    assert stranded(DefinitionRegistry([TRIP, v2]), RUNNING, RECORDED) == []


def test_sagas_of_no_recorded_version_or_shape_are_left_as_they_were() -> None:
    registry = DefinitionRegistry([_with_check(TRIP)])
    assert stranded(registry, [RunningShape("trip", None, None, 5), RunningShape("trip", 1, None, 2)], {}) == []


def test_an_unrecorded_shape_is_still_refused_and_says_so() -> None:
    [line] = stranded(DefinitionRegistry([_with_check(TRIP)]), RUNNING, {})
    assert "was not recorded" in line and "37 running sagas" in line


async def _started(store: MemoryStore, saga_id: str) -> None:
    service = SagaService(store, DefinitionRegistry([TRIP]), Topics(), lambda: 1_700_000_000_000)
    start = StartSaga(saga_id=saga_id, saga_type="trip", tenant_id=None, input=b"")
    assert await service.handle(Envelope(message=start, message_id=f"start-{saga_id}", start_input={})) \
        is Outcome.APPLIED


async def test_the_start_check_refuses_then_allows_when_told_and_keeps_the_shapes() -> None:
    store = MemoryStore()
    await check_running_sagas(store, DefinitionRegistry([TRIP]), allow_stranding=False)
    assert set(store.shapes) == {TRIP.fingerprint}
    for n in range(3):
        await _started(store, f"s-{n}")
    edited = DefinitionRegistry([_with_check(TRIP)])
    with pytest.raises(DeployRefused) as refused:
        await check_running_sagas(store, edited, allow_stranding=False)
    lines = str(refused.value).splitlines()
    assert "SAGA_ALLOW_STRANDING" in lines[0] and len(lines) == 2 and "3 running sagas" in lines[1]
    assert set(store.shapes) == {TRIP.fingerprint}  # a refused deploy records nothing
    await check_running_sagas(store, edited, allow_stranding=True)
    assert set(store.shapes) == {TRIP.fingerprint, _with_check(TRIP).fingerprint}


def test_the_audit_names_a_saga_no_registered_definition_runs() -> None:
    run = SagaRun(TRIP, saga_id="s-audit")
    run.start()
    run.ok("book_flight")
    histories = {"s-audit": run.events}
    assert compare_states(DefinitionRegistry([TRIP]), histories, histories)[0] == []
    [edited] = compare_states(DefinitionRegistry([_with_check(TRIP)]), histories, histories)[0]
    assert edited.saga_id == "s-audit"
    assert edited.problem.startswith("no registered definition runs it: saga 's-audit' started on 'trip' v1")
    assert f"shape {TRIP.fingerprint}" in edited.problem and _with_check(TRIP).fingerprint in edited.problem
    v2 = dataclasses.replace(TRIP, version=2)
    [gone] = compare_states(DefinitionRegistry([v2]), histories, histories)[0]
    assert gone.problem.startswith("no registered definition runs it: no definition for saga type 'trip' version 1")


def test_a_draining_version_takes_no_new_starts_while_its_sagas_go_on() -> None:
    v2 = dataclasses.replace(_with_check(TRIP), version=2)
    registry = drained(DefinitionRegistry([TRIP, v2]), "trip:2")
    assert registry.latest("trip") is TRIP and registry.draining("trip") == (2,)
    assert registry.get("trip", 2) is v2  # the sagas on v2 are still decided by it
    assert drained(DefinitionRegistry([TRIP, v2]), " trip:1 , ").latest("trip") is v2


def test_a_start_of_a_type_whose_every_version_drains_is_refused_saying_so() -> None:
    parser = RecordParser(Topics(), drained(DefinitionRegistry([TRIP]), "trip:1"), default_registry(), PARTICIPANTS)
    record = ConsumedRecord(topic=Topics().start, partition=0, offset=0, key=b"s-1",
                            value=wire.encode_start(SCENARIOS["happy"].start("s-1")))
    refused = parser.parse(record).message
    assert isinstance(refused, RejectedRecord)
    assert refused.reason == "every deployed version of saga_type 'trip' is draining (v1): it takes no new starts"


@pytest.mark.parametrize(("value", "said"), [
    ("trip", "SAGA_DRAINING='trip': 'trip' is no saga_type:version (e.g. trip:2)"),
    ("trip:x", "SAGA_DRAINING='trip:x': 'trip:x' is no saga_type:version (e.g. trip:2)"),
    ("trip:7", "SAGA_DRAINING='trip:7': no definition for saga type 'trip' version 7"),
])
def test_a_wrong_draining_setting_is_refused_naming_it(value: str, said: str) -> None:
    with pytest.raises(Misconfigured) as refused:
        drained(DefinitionRegistry([TRIP]), value)
    assert str(refused.value).startswith(said)
