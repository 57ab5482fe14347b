"""Fold strictness, the transition tables, start/reject edge cases and the errors ``decide`` raises."""

from __future__ import annotations

from dataclasses import replace

import pytest

from saga_orchestrator.orchestrator.domain.builder import EventBase, Timer, TimerKind
from saga_orchestrator.orchestrator.domain.decide import DUPLICATE_START_REASON, decide
from saga_orchestrator.orchestrator.domain.definition import SagaDefinition, Step
from saga_orchestrator.orchestrator.domain.errors import (
    DomainError,
    HistoryMismatch,
    IllegalTransition,
    InvalidMessage,
    UnknownDefinition,
)
from saga_orchestrator.orchestrator.domain.messages import RejectedRecord, TimerFired
from saga_orchestrator.orchestrator.domain.model import PURGEABLE_STATUSES
from saga_orchestrator.orchestrator.domain.state import (
    SAGA_TRANSITIONS,
    STEP_TRANSITIONS,
    TERMINAL_STATUSES,
    SagaStatus,
    StepStatus,
    apply_event,
    fold,
    is_transition_valid,
)
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.participants.trip.scenarios import SCENARIOS
from saga_orchestrator.schemas import event_types as ev
from saga_orchestrator.schemas.event_types import SagaRejected
from saga_orchestrator.schemas.message_types import (
    CancelSaga,
    CommandKind,
    ResultStatus,
    ResumeCompensation,
    StartSaga,
    StepResult,
)
from saga_orchestrator.testing.history import SagaRun, event_names


def _base(seq: int, saga_id: str = "s1", version: int = 1) -> EventBase:
    return EventBase(saga_id=saga_id, seq=seq, definition_version=version, occurred_at=5)


STARTED = ev.SagaStarted(**_base(1), saga_type="trip", tenant_id=None, input=b"")


def _history_through(n: int) -> list[ev.Event]:
    run = SagaRun(TRIP)
    run.start()
    run.ok("book_flight")
    return run.events[:n]


# --- the tables --------------------------------------------------------------------------------------


def test_saga_table_terminal_states_have_no_way_out_but_the_documented_ones() -> None:
    assert set(SAGA_TRANSITIONS) == {None, *SagaStatus}
    # Quarantine (a message no retry mends) may stop any started saga, and a release puts it back where it stood.
    started = set(SagaStatus) - {SagaStatus.REJECTED, SagaStatus.PURGED, SagaStatus.QUARANTINED}
    assert {s for s in SAGA_TRANSITIONS if s is not None and SagaStatus.QUARANTINED in SAGA_TRANSITIONS[s]} == started
    assert SAGA_TRANSITIONS[SagaStatus.QUARANTINED] == started
    exits = {s: SAGA_TRANSITIONS[s] - {SagaStatus.PURGED, SagaStatus.QUARANTINED} for s in TERMINAL_STATUSES}
    assert {s: out for s, out in exits.items() if out} == {
        SagaStatus.COMPENSATION_FAILED: {SagaStatus.COMPENSATING, SagaStatus.TERMINATED},  # resume, or terminate
        # ForceCompensate, Redrive, or Terminate (settled by hand): FAILED means a human must act, and can
        SagaStatus.FAILED: {SagaStatus.COMPENSATING, SagaStatus.RUNNING, SagaStatus.TERMINATED},
        SagaStatus.REJECTED: {SagaStatus.RUNNING},  # a valid start after refusals
    }
    # Purging (retention) is the one way on from an end, and a saga waiting for an operator cannot be purged.
    assert set(PURGEABLE_STATUSES) == {SagaStatus.COMPLETED, SagaStatus.FAILED, SagaStatus.COMPENSATED,
                                       SagaStatus.CANCELLED, SagaStatus.COMPLETED_WITH_FAILURES, SagaStatus.REJECTED,
                                       SagaStatus.TERMINATED}
    assert PURGEABLE_STATUSES <= TERMINAL_STATUSES and not SAGA_TRANSITIONS[SagaStatus.PURGED]
    assert set(TERMINAL_STATUSES) == set(SagaStatus) - {SagaStatus.RUNNING, SagaStatus.COMPENSATING,
                                                        SagaStatus.QUARANTINED}


@pytest.mark.parametrize(
    ("current", "new", "valid"),
    [
        (None, SagaStatus.RUNNING, True),
        (None, SagaStatus.COMPLETED, False),
        (SagaStatus.RUNNING, SagaStatus.COMPENSATED, True),  # turned back with nothing to undo
        (SagaStatus.RUNNING, SagaStatus.COMPENSATION_FAILED, False),  # always through COMPENSATING
        (SagaStatus.RUNNING, SagaStatus.CANCELLED, True),
        (SagaStatus.COMPENSATING, SagaStatus.COMPLETED, False),
        (SagaStatus.COMPENSATING, SagaStatus.CANCELLED, True),
        (SagaStatus.COMPLETED, SagaStatus.RUNNING, False),
        (SagaStatus.COMPENSATION_FAILED, SagaStatus.COMPENSATING, True),
    ],
)
def test_is_transition_valid(current: SagaStatus | None, new: SagaStatus, valid: bool) -> None:
    assert is_transition_valid(current, new) is valid


def test_every_status_is_reachable_from_nothing() -> None:
    seen: set[SagaStatus | None] = {None}
    frontier: list[SagaStatus | None] = [None]
    while frontier:
        for nxt in SAGA_TRANSITIONS[frontier.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    assert seen == {None, *SagaStatus}
    assert set(STEP_TRANSITIONS) == set(StepStatus)


# --- fold is strict ------------------------------------------------------------------------------------

BAD_HISTORIES = [
    ("empty", [], HistoryMismatch, "empty history"),
    ("does not start at 1", [replace(STARTED, seq=2)], HistoryMismatch, "starts at seq 2"),
    ("first event not a start", [ev.SagaCompleted(**_base(1))], HistoryMismatch, "not SagaStarted"),
    ("gap", [STARTED, ev.SagaCompleted(**_base(3))], HistoryMismatch, "seq 3 follows 1"),
    ("foreign saga", [STARTED, ev.SagaCompleted(**_base(2, saga_id="other"))], HistoryMismatch, "'other'"),
    ("other version", [STARTED, ev.SagaCompleted(**_base(2, version=7))], HistoryMismatch, "version 7"),
    (
        "unknown step",
        [STARTED, ev.StepSkipped(**_base(2), step="teleport", reason="x")],
        HistoryMismatch,
        "unknown step 'teleport'",
    ),
    ("second start", [STARTED, replace(STARTED, seq=2)], IllegalTransition, "from RUNNING to RUNNING"),
    (
        "completed twice",
        [STARTED, ev.SagaCompleted(**_base(2)), ev.SagaCompleted(**_base(3))],
        IllegalTransition,
        "from COMPLETED to COMPLETED",
    ),
    (
        "compensation failed without compensating",
        [STARTED, ev.SagaCompensationFailed(**_base(2), step="book_flight", reason="r")],
        IllegalTransition,
        "from RUNNING to COMPENSATION_FAILED",
    ),
    (
        "success of a step never sent",
        [STARTED, ev.StepSucceeded(**_base(2), step="book_flight", attempt=1)],
        IllegalTransition,
        "step 'book_flight' from PENDING to SUCCEEDED",
    ),
]


@pytest.mark.parametrize(
    ("events", "error", "message"), [c[1:] for c in BAD_HISTORIES], ids=[c[0] for c in BAD_HISTORIES]
)
def test_fold_refuses_histories_that_do_not_fit(
    events: list[ev.Event], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        fold(TRIP, events)


def test_fold_needs_the_right_definition() -> None:
    other = SagaDefinition(
        saga_type="trip", version=2, input_schema="x", steps=(Step(name="a", participant="p", command="c"),)
    )
    with pytest.raises(HistoryMismatch, match="folded with 'trip' v2"):
        fold(other, [STARTED])
    with pytest.raises(HistoryMismatch, match="no definition given"):
        fold(None, [STARTED])
    state = fold(TRIP, [STARTED])
    with pytest.raises(HistoryMismatch, match="needs the saga's definition"):
        apply_event(None, state, ev.SagaCompleted(**_base(2)))


def test_fold_is_a_left_fold_of_apply_event() -> None:
    history = _history_through(10)
    state = None
    for event in history:
        state = apply_event(TRIP, state, event)
    assert state == fold(TRIP, history)
    assert fold(TRIP, history[:3]).steps["book_flight"].status is StepStatus.RUNNING


# --- start, reject, restart -----------------------------------------------------------------------------


def test_unknown_saga_type_is_rejected_and_a_later_valid_start_still_works() -> None:
    run = SagaRun(None)
    rejected = run.start(saga_type="cruise")
    assert event_names(rejected) == ["SagaRejected"]
    event = rejected.events[0]
    assert isinstance(event, ev.SagaRejected)
    assert (event.reason, event.definition_version, event.saga_type) == (
        "unknown saga type 'cruise'",
        0,
        "cruise",
    )
    assert run.saga.status is SagaStatus.REJECTED and run.saga.is_terminal
    assert event_names(run.cancel()) == ["SagaCancelRefused"]
    assert decide(
        None,
        run.saga,
        StepResult(
            saga_id="s1",
            step="x",
            kind=CommandKind.FORWARD,
            idempotency_key="s1:x",
            attempt=1,
            status=ResultStatus.SUCCEEDED,
        ),
        run.now,
    ).is_empty
    run.definition = TRIP  # the caller now passes the latest definition of the requested type
    started = run.start()
    assert event_names(started)[:1] == ["SagaStarted"] and started.events[0].seq == 3
    restarted = run.saga
    assert restarted.status is SagaStatus.RUNNING and restarted.started_at == run.events[0].occurred_at


def test_duplicate_start_is_recorded_and_changes_nothing() -> None:
    run = SagaRun(TRIP)
    run.start()
    before = run.saga
    decision = run.start()
    event = decision.events[0]
    assert isinstance(event, ev.SagaRejected) and event.reason == DUPLICATE_START_REASON
    assert event.definition_version == 1 and not decision.commands
    assert replace(run.saga, last_seq=before.last_seq, updated_at=before.updated_at) == before


def test_decide_is_deterministic() -> None:
    run = SagaRun(TRIP)
    run.start()
    run.ok("book_hotel")
    message = StepResult(
        saga_id="s1",
        step="book_flight",
        kind=CommandKind.FORWARD,
        idempotency_key="s1:book_flight",
        attempt=1,
        status=ResultStatus.FAILED,
        retryable=True,
        error_type="Busy",
    )
    assert decide(TRIP, run.saga, message, 42) == decide(TRIP, run.saga, message, 42)


# --- errors ---------------------------------------------------------------------------------------------


def _start(saga_id: str = "s1") -> StartSaga:
    return SCENARIOS["happy"].start(saga_id)


def _reply(step: str = "book_flight", key: str = "s1:book_flight", saga_id: str = "s1") -> StepResult:
    return StepResult(
        saga_id=saga_id,
        step=step,
        kind=CommandKind.FORWARD,
        idempotency_key=key,
        attempt=1,
        status=ResultStatus.SUCCEEDED,
    )


def test_messages_for_an_unknown_saga_are_dead_lettered_and_record_nothing() -> None:
    for message in (_reply(), CancelSaga(saga_id="s1", reason="r"),
                    ResumeCompensation(saga_id="s1", operator=None, detail=None)):
        decision = decide(TRIP, None, message, 0)
        assert decision.events == () and decision.commands == () and decision.state is None
        assert decision.dead_letter == f"no saga 's1': {type(message).__name__} has nothing to act on"


def test_a_timer_of_a_saga_that_is_gone_changes_nothing() -> None:
    fired = TimerFired(timer=Timer(saga_id="s1", kind=TimerKind.STEP_TIMEOUT, step="book_flight", attempt=1,
                                   due_at=5))
    assert decide(TRIP, None, fired, 10).is_empty


def test_a_rejected_record_is_dead_lettered_and_recorded_in_the_stream_it_names() -> None:
    unnamed = decide(None, None, RejectedRecord(saga_id=None, saga_type=None, reason="undecodable"), 7)
    assert (unnamed.events, unnamed.dead_letter, unnamed.state) == ((), "undecodable", None)
    first = decide(None, None, RejectedRecord(saga_id="s1", saga_type="cruise", reason="unknown type"), 7)
    [rejected] = first.events
    assert rejected == SagaRejected(saga_id="s1", seq=1, definition_version=0, occurred_at=7, saga_type="cruise",
                                    reason="unknown type")
    assert first.dead_letter == "unknown type" and first.state is not None
    assert first.state.status is SagaStatus.REJECTED
    running = fold(TRIP, decide(TRIP, None, _start(), 1).events)
    later = decide(TRIP, running, RejectedRecord(saga_id="s1", saga_type=None, reason="key differs"), 9)
    assert [type(e).__name__ for e in later.events] == ["SagaRejected"]
    assert later.events[0].seq == running.last_seq + 1 and later.events[0].definition_version == 1
    assert later.commands == () and later.timers == () and later.obsolete_timers == ()
    assert later.state is not None and later.state.status is SagaStatus.RUNNING


@pytest.mark.parametrize(
    ("message", "error", "match"),
    [
        (_reply(step="teleport", key="s1:teleport"), InvalidMessage, "has no step 'teleport'"),
        (_reply(key="s2:book_flight"), InvalidMessage, "carries key 's2:book_flight'"),
        (_reply(key="s1:book_flight:compensate"), InvalidMessage, "expected 's1:book_flight'"),
        (_reply(saga_id="s2", key="s2:book_flight"), InvalidMessage, "given the state of 's1'"),
    ],
)
def test_foreign_replies_are_loud(message: StepResult, error: type[DomainError], match: str) -> None:
    run = SagaRun(TRIP)
    run.start()
    with pytest.raises(error, match=match):
        decide(TRIP, run.saga, message, 0)
    assert not error.retriable


def test_a_started_saga_needs_its_own_definition() -> None:
    run = SagaRun(TRIP)
    run.start()
    with pytest.raises(UnknownDefinition, match="'trip' v1, which is not registered"):
        decide(None, run.saga, _reply(), 0)
    v2 = replace(TRIP, version=2)
    with pytest.raises(HistoryMismatch, match="not on 'trip' v2"):
        decide(v2, run.saga, _reply(), 0)
    with pytest.raises(InvalidMessage, match="given the definition of 'trip'"):
        SagaRun(TRIP).start(saga_type="cruise")
