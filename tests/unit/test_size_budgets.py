"""Size budgets where the data enters: a step output the orchestrator cannot carry on is a definitive failure
(undone when unwinding, as it took effect), no command over its budget is ever decided, error messages are cut,
and the participant kit turns an oversize output into OutputTooLarge before anything commits."""

from __future__ import annotations

import asyncio

import pytest

from saga_orchestrator.orchestrator.domain.builder import output_problem
from saga_orchestrator.orchestrator.domain.definition import DefinitionRegistry
from saga_orchestrator.orchestrator.domain.model import state_bytes
from saga_orchestrator.orchestrator.domain.state import SagaStatus, StepStatus
from saga_orchestrator.orchestrator.inbound import Envelope, RecordParser
from saga_orchestrator.orchestrator.service import Outcome, SagaService
from saga_orchestrator.orchestrator.store.memory import MemoryStore
from saga_orchestrator.participants.kit.handler_calls import within_limits
from saga_orchestrator.participants.kit.outcome import Failed, Succeeded
from saga_orchestrator.participants.trip import PARTICIPANTS
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.schemas import event_types as ev
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.limits import (
    MAX_COMMAND_PAYLOAD_BYTES,
    MAX_ERROR_MESSAGE_CHARS,
    MAX_STEP_OUTPUT_BYTES,
    MAX_STEP_OUTPUTS_BYTES,
    MAX_VALUE_BYTES,
    OUTPUT_REFUSED,
    OUTPUT_TOO_LARGE,
)
from saga_orchestrator.schemas.message_types import CommandKind, ResultStatus, StartSaga, StepResult
from saga_orchestrator.schemas.records import ConsumedRecord
from saga_orchestrator.schemas.registry import default_registry
from saga_orchestrator.schemas.topics import Topics
from saga_orchestrator.testing.history import SagaRun, describe_command, event_names


def _succeed(run: SagaRun, step: str, output: bytes) -> list[str]:
    return event_names(run.reply(step, CommandKind.FORWARD, ResultStatus.SUCCEEDED, output=output))


def test_an_oversize_output_fails_the_step_for_good_and_is_undone() -> None:
    run = SagaRun(TRIP)
    run.start()
    names = _succeed(run, "book_flight", b"x" * (MAX_STEP_OUTPUT_BYTES + 1))
    assert names[0] == "StepFailed book_flight 1"
    failed = run.events[-len(names)]
    assert isinstance(failed, ev.StepFailed) and failed.error_type == OUTPUT_REFUSED and not failed.retryable
    assert failed.error_message is not None and str(MAX_STEP_OUTPUT_BYTES) in failed.error_message
    # Not retried (the same output would come back), and as the booking happened (the reply said so), unwinding
    # cancels it straight away, and the hotel once it is booked.
    assert not any(name.startswith("StepRetryScheduled") for name in names)
    assert run.status() is SagaStatus.COMPENSATING
    assert run.saga.steps["book_flight"].status is StepStatus.COMPENSATING
    run.ok("book_hotel")
    run.comp_ok("book_flight")
    run.comp_ok("book_hotel")
    assert sorted(c.action for c in run.sent if c.kind is CommandKind.COMPENSATE) == ["cancel_flight", "cancel_hotel"]
    assert run.status() is SagaStatus.COMPENSATED


def test_an_output_that_would_take_a_later_command_over_its_budget_is_refused() -> None:
    run = SagaRun(TRIP)
    run.start()
    third = b"o" * (MAX_STEP_OUTPUTS_BYTES // 3 + 1)  # each under its own limit, the three over one budget
    assert len(third) <= MAX_STEP_OUTPUT_BYTES
    assert _succeed(run, "book_flight", third) == ["StepSucceeded book_flight 1"]
    assert _succeed(run, "book_hotel", third)[0] == "StepSucceeded book_hotel 1"
    problem = output_problem(TRIP, run.saga, "charge_card", third)
    # The refund of the charge would carry all three (as would the itinerary's command).
    assert problem is not None and problem.startswith("the compensation of charge_card would carry")
    assert _succeed(run, "charge_card", third)[0] == "StepFailed charge_card 1"
    assert run.status() is SagaStatus.COMPENSATING and not any(c.step == "send_itinerary" for c in run.sent)


def test_the_input_counts_against_a_command_budget() -> None:
    run = SagaRun(TRIP)
    run.start(payload=b"i" * (MAX_COMMAND_PAYLOAD_BYTES - 1000))
    problem = output_problem(TRIP, run.saga, "book_flight", b"o" * 1001)
    assert problem is not None and "input and step outputs" in problem
    assert output_problem(TRIP, run.saga, "book_flight", b"o" * 1000) is None


def test_outputs_at_their_limits_make_commands_that_can_be_sent() -> None:
    run = SagaRun(TRIP)
    half = MAX_STEP_OUTPUTS_BYTES // 2
    run.start(payload=b"i" * (MAX_COMMAND_PAYLOAD_BYTES - MAX_STEP_OUTPUTS_BYTES))
    assert _succeed(run, "book_flight", b"f" * half) == ["StepSucceeded book_flight 1"]
    assert _succeed(run, "book_hotel", b"h" * half)[0] == "StepSucceeded book_hotel 1"
    run.fail("charge_card", error="CardDeclined")
    assert run.status() is SagaStatus.COMPENSATING
    assert "payment.charge_card FORWARD 1" in [describe_command(command) for command in run.sent]
    for command in run.sent:  # the largest carries the input and both outputs, with a 300-byte saga id room
        assert len(wire.encode_command(command)) <= MAX_VALUE_BYTES


def test_a_long_error_message_is_cut_once_where_it_enters() -> None:
    # Cut by the parser at the door; the core records the text it is given as it is.
    parser = RecordParser(Topics(), DefinitionRegistry([TRIP]), default_registry(), PARTICIPANTS)
    long_text = "e" * (MAX_ERROR_MESSAGE_CHARS * 10)
    reply = StepResult(saga_id="s-1", step="book_flight", kind=CommandKind.FORWARD, idempotency_key="s-1:book_flight",
                       attempt=1, status=ResultStatus.FAILED, error_type="Boom", error_message=long_text)
    record = ConsumedRecord(topic=Topics().results("flight"), partition=0, offset=0, key=b"s-1",
                            value=wire.encode_result(reply))
    parsed = parser.parse(record).message
    assert isinstance(parsed, StepResult)
    assert parsed.error_message == "e" * MAX_ERROR_MESSAGE_CHARS + "..."
    run = SagaRun(TRIP, saga_id="s-1")
    run.start()
    run.send(parsed)
    failed = next(e for e in run.events if isinstance(e, ev.StepFailed))
    assert failed.error_message == parsed.error_message
    unclipped = SagaRun(TRIP, saga_id="s-1")
    unclipped.start()
    unclipped.send(reply)
    assert next(e for e in unclipped.events if isinstance(e, ev.StepFailed)).error_message == long_text


@pytest.mark.parametrize(
    ("outcome", "expected"),
    [
        (Succeeded(b"o" * MAX_STEP_OUTPUT_BYTES), Succeeded(b"o" * MAX_STEP_OUTPUT_BYTES)),
        (Succeeded(None), Succeeded(None)),
        (Failed("Boom", "short"), Failed("Boom", "short")),
    ],
)
def test_the_kit_keeps_outcomes_within_their_limits(outcome: Succeeded | Failed, expected: object) -> None:
    assert within_limits(outcome) == expected


def test_the_kit_turns_an_oversize_output_into_a_definitive_failure() -> None:
    checked = within_limits(Succeeded(b"o" * (MAX_STEP_OUTPUT_BYTES + 1)))
    assert isinstance(checked, Failed) and checked.error_type == OUTPUT_TOO_LARGE and not checked.retryable
    assert "rolled back" in checked.message
    cut = within_limits(Failed("Boom", "m" * (MAX_ERROR_MESSAGE_CHARS + 1), retryable=True))
    assert isinstance(cut, Failed) and cut.retryable and len(cut.message) == MAX_ERROR_MESSAGE_CHARS + 3


def _start(service: SagaService, saga_id: str, payload: bytes) -> None:
    envelope = Envelope(message=StartSaga(saga_id=saga_id, saga_type=TRIP.saga_type, input=payload, tenant_id=None),
                        message_id=f"start-{saga_id}", start_input={})  # decoded at the door: no keys
    assert asyncio.run(service.handle(envelope)) is Outcome.APPLIED


def test_the_orchestrators_cache_of_folded_states_is_held_within_its_bytes() -> None:
    runs = [SagaRun(TRIP, saga_id=f"s{n}") for n in range(4)]
    for n, run in enumerate(runs):
        run.start(payload=b"i" * (100_000 if n == 2 else 10))
    small, large = state_bytes(runs[0].saga), state_bytes(runs[2].saga)

    def service(cache_bytes: int) -> SagaService:
        return SagaService(MemoryStore(), DefinitionRegistry([TRIP]), Topics(), lambda: 1_700_000_000_000,
                           cache_bytes=cache_bytes)

    kept = service(3 * small)
    for run in runs[:3]:
        _start(kept, run.saga_id, run.saga.input)
    # A state larger than the whole cache is not kept, and pushes nothing out.
    assert sorted(kept._cache) == ["s0", "s1"]
    assert kept._cache.currsize == 2 * small
    kept = service(large + small)
    for run in runs:
        _start(kept, run.saga_id, run.saga.input)
    assert sorted(kept._cache) == ["s2", "s3"]  # the least recently used go first
    assert kept._cache.currsize == large + small
