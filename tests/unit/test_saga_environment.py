"""``saga_orchestrator.testing``: sagas on the real pipeline with scripted participants and virtual time, and the
fault matrix of any saga; the trip's matrix asserts the compensations the README documents, in order."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import BaseModel

from saga_orchestrator.authoring import RetryPolicy, Saga, SagaApp, StepContext, participant
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.participants.trip.scenarios import SCENARIOS
from saga_orchestrator.schemas import event_types as ev
from saga_orchestrator.testing import (
    SagaEnvironment,
    SagaResult,
    SagaWaits,
    answer_late,
    defer,
    fail,
    fail_transiently,
    fault_matrix,
    succeed,
    time_out,
)
from saga_orchestrator.testing.fault_matrix import expect_failure

HAPPY = SCENARIOS["happy"].trip("t-1")


class Visit(BaseModel):
    visitor: str


class Badge(BaseModel):
    number: int


desk = participant("desk")
guard = participant("guard")


@desk.action
async def issue_badge(step: StepContext, visit: Visit) -> Badge:
    return Badge(number=1)


@issue_badge.undo
async def revoke_badge(step: StepContext, visit: Visit, badge: Badge) -> None:
    return None


@guard.action
async def escort(step: StepContext, visit: Visit, badge: Badge) -> None:
    return None


def _visit(deadline: timedelta | None = None, escort_timeout: timedelta = timedelta(seconds=5)) -> Saga:
    saga = Saga("visit", input=Visit, deadline=deadline)
    badge = saga.step(issue_badge, timeout=timedelta(seconds=2))
    saga.step(escort, after=[badge], timeout=escort_timeout)
    return saga


async def test_a_saga_runs_to_its_end_with_every_participant_succeeding() -> None:
    env = SagaEnvironment(TRIP)
    result = await env.result(await env.start("trip", HAPPY, saga_id="t-1"))
    assert result.status == "COMPLETED"
    assert result.succeeded == ["book_flight", "book_hotel", "charge_card", "send_itinerary"]
    assert result.effects == {step: (1, 0) for step in result.succeeded} and result.elapsed == timedelta(0)


async def test_typed_outputs_reach_the_result_decoded() -> None:
    env = SagaEnvironment(_visit())
    env.script(issue_badge, succeed(Badge(number=7)))
    result = await env.result(await env.start("visit", Visit(visitor="ada")))
    assert result.outputs == {"issue_badge": Badge(number=7)}


async def test_a_definitive_failure_undoes_what_took_effect() -> None:
    env = SagaEnvironment(TRIP)
    env.script(("payment", "charge_card"), fail("CardDeclined"))
    result = await env.result(await env.start("trip", HAPPY))
    assert result.status == "COMPENSATED" and result.compensated == ["book_hotel", "book_flight"]
    assert result.effects["book_flight"] == (1, 1) and "charge_card" not in result.effects


def test_a_script_for_an_action_no_step_sends_is_refused() -> None:
    env = SagaEnvironment(TRIP)
    with pytest.raises(ValueError, match=r"no step of the environment's sagas sends payment\.charge_crad \(they send: "
                                         r"flight\.book_flight, flight\.cancel_flight"):
        env.script(("payment", "charge_crad"), fail("CardDeclined"))
    env.script(("payment", "refund_card"), fail("Refused"))  # a compensation is sent too


async def test_a_transient_failure_is_retried_with_backoff_in_virtual_time() -> None:
    env = SagaEnvironment(TRIP)
    env.script(("payment", "charge_card"), fail_transiently(2))
    result = await env.result(await env.start("trip", HAPPY))
    assert result.status == "COMPLETED" and result.attempts("charge_card") == 3
    assert timedelta(milliseconds=500) < result.elapsed < timedelta(seconds=2)  # two backoffs of 200 and 400 ms


async def test_an_answer_after_the_timeout_is_waited_for_and_nothing_is_sent_again() -> None:
    env = SagaEnvironment(TRIP)
    env.script(("hotel", "book_hotel"), time_out(effect=True))
    result = await env.result(await env.start("trip", HAPPY))
    assert result.status == "COMPLETED" and result.attempts("book_hotel") == 1
    assert result.effects["book_hotel"] == (1, 0)
    assert "StepTimedOut" in result.event_types


async def test_a_late_answer_completes_the_step_it_answers() -> None:
    env = SagaEnvironment(TRIP)
    env.script(("flight", "book_flight"), answer_late(timedelta(seconds=3)))
    result = await env.result(await env.start("trip", HAPPY))
    assert result.status == "COMPLETED" and result.effects["book_flight"] == (1, 0)
    assert result.attempts("book_flight") == 1 and result.elapsed == timedelta(seconds=3)


async def test_advance_fires_what_comes_due_on_the_way() -> None:
    env = SagaEnvironment(TRIP)
    env.script(("payment", "charge_card"), time_out(effect=False, then=fail("CardDeclined")))
    saga_id = await env.start("trip", HAPPY)
    await env.advance(seconds=1)
    state = env.state(saga_id)
    assert state is not None and state.status.value == "RUNNING"
    await env.advance(seconds=2)  # the charge's 2 s timeout, then its retry, declined: the unwinding ran
    state = env.state(saga_id)
    assert state is not None and state.status.value == "COMPENSATED"


async def test_a_48_hour_deadline_passes_in_virtual_time_and_withdraws_the_wait_for_a_person() -> None:
    saga = _visit(deadline=timedelta(hours=48), escort_timeout=timedelta(hours=72))
    env = SagaEnvironment(saga)
    env.script(escort, defer())  # a guard who never answers
    saga_id = await env.start(saga, Visit(visitor="ada"))
    await env.advance(hours=1)
    assert env.awaiting(saga_id) == [f"{saga_id}:escort"]
    result = await env.result(saga_id)
    assert result.status == "CANCELLED" and result.compensated == ["issue_badge"]
    assert result.elapsed == timedelta(hours=48) and env.awaiting(saga_id) == []
    assert any(getattr(event, "reason", "").startswith("deadline of") for event in result.events)
    assert [(w.step, w.attempt) for w in result.withdrawn] == [("escort", 1)]


async def test_a_deadline_bounds_a_step_of_24_hours_times_4_that_never_answers() -> None:
    saga = Saga("slow", input=Visit, deadline=timedelta(hours=72))
    saga.step(issue_badge, timeout=timedelta(hours=24), retry=RetryPolicy(max_attempts=4))
    env = SagaEnvironment(saga)
    env.stop("desk")  # no worker of the desk runs: its command is not picked up
    saga_id = await env.start(saga, Visit(visitor="ada"))
    await env.advance(hours=72)
    state = env.state(saga_id)
    assert state is not None and state.status.value == "COMPENSATING"  # turned back at 72 h, waiting to hear
    await env.start_participant("desk")  # back: the command and its withdrawal, in one batch
    result = await env.result(saga_id)
    assert (result.status, result.elapsed) == ("CANCELLED", timedelta(hours=72))
    assert result.attempts(issue_badge) == 1  # never another attempt, whatever the step's own budget
    assert result.effects.get("issue_badge", (0, 0)) == (0, 0)  # withdrawn before it ran


async def test_a_cancel_an_hour_into_a_24_hour_wait_for_a_person_ends_the_saga_at_once() -> None:
    saga = _visit(escort_timeout=timedelta(hours=24))
    env = SagaEnvironment(saga)
    env.script(escort, defer(succeed(), after=timedelta(hours=20)))
    saga_id = await env.start(saga, Visit(visitor="ada"))
    await env.advance(hours=1)
    started = env.now
    await env.cancel(saga_id, "the visit was called off")
    result = await env.result(saga_id)
    assert result.status == "CANCELLED" and result.compensated == ["issue_badge"]
    assert env.now - started < 1_000 and env.awaiting(saga_id) == []  # the wait withdrawn: seconds, not hours
    await env.advance(hours=20)  # the answer the guard would have given no longer counts
    assert env.state(saga_id).status.value == "CANCELLED"  # type: ignore[union-attr]


async def test_a_deferred_answer_that_never_comes_times_out_at_the_steps_timeout() -> None:
    saga = _visit(escort_timeout=timedelta(hours=24))
    env = SagaEnvironment(saga)
    env.script(escort, defer())
    result = await env.result(await env.start(saga, Visit(visitor="ada")))
    assert result.status == "COMPENSATED" and result.compensated == ["issue_badge"]
    failed = [e for e in result.events if isinstance(e, ev.StepFailed)]
    assert [(e.step, e.error_type) for e in failed] == [("escort", "AnswerTimedOut")]
    assert result.elapsed == timedelta(hours=24)


async def test_commands_that_wait_for_a_stopped_participant_run_once_it_is_back_and_expired_ones_not() -> None:
    env = SagaEnvironment(TRIP)
    env.stop("flight")
    saga_id = await env.start("trip", HAPPY)
    await env.advance(seconds=10)  # the flight booking timed out long ago: the saga waits, spending nothing
    assert env.state(saga_id).steps["book_flight"].status.value == "TIMED_OUT"  # type: ignore[union-attr]
    await env.start_participant("flight")
    result = await env.result(saga_id)
    assert result.status == "COMPLETED" and result.attempts("book_flight") == 2  # the first expired unread
    expired = [e for e in result.events if isinstance(e, ev.StepFailed)]
    assert [(e.step, e.attempt, e.error_type) for e in expired] == [("book_flight", 1, "Expired")]
    assert result.effects["book_flight"] == (1, 0)


def test_a_result_names_steps_by_name_reference_or_action_and_refuses_a_name_it_has_not() -> None:
    env_result = SagaResult("v-1", "COMPLETED", [], [], {}, timedelta(0), definition=_visit().definition)
    assert env_result.step_name("escort") == env_result.step_name(escort) == "escort"
    with pytest.raises(ValueError, match=r"saga v-1 has no step 'escrot' \(its steps: issue_badge, escort\)"):
        env_result.attempts("escrot")
    with pytest.raises(ValueError, match="is the command of no step"):
        env_result.attempts(post_label)


async def test_a_saga_that_cannot_end_says_what_it_waits_for() -> None:
    env = SagaEnvironment(TRIP)
    env.script(("notification", "send_itinerary"), fail("Bounced", retryable=True))  # after the pivot: for ever
    saga_id = await env.start("trip", HAPPY)
    with pytest.raises(SagaWaits, match="send_itinerary"):
        await env.result(saga_id, within=timedelta(minutes=1))


async def test_duplicated_messages_change_nothing() -> None:
    env = SagaEnvironment(TRIP, duplicate_messages=True)
    result = await env.result(await env.start("trip", HAPPY))
    assert result.status == "COMPLETED" and all(effect == (1, 0) for effect in result.effects.values())


# -- the fault matrix -------------------------------------------------------------------------------------------------

TRIP_MATRIX = fault_matrix(TRIP)


def test_the_trips_matrix_has_a_failure_a_late_answer_and_a_cancel_per_step_and_a_duplicate_run() -> None:
    names = [case.name for case in TRIP_MATRIX]
    assert names == [*(f"{step} fails for good" for step in TRIP.order),
                     *(f"{step} answers after its timeout, its effect applied" for step in TRIP.order),
                     *(f"cancel while {step} waits for its participant" for step in TRIP.order),
                     "every message delivered twice"]
    cancels = {case.stopped: (case.status, case.compensated) for case in TRIP_MATRIX if case.turn_back == "cancel"}
    assert cancels == {
        "book_flight": ("CANCELLED", frozenset({"book_hotel"})),
        "book_hotel": ("CANCELLED", frozenset({"book_flight"})),
        "charge_card": ("CANCELLED", frozenset({"book_flight", "book_hotel"})),
        "send_itinerary": ("COMPLETED", frozenset()),  # past the pivot a cancel is refused
    }


def test_the_trips_matrix_expects_the_documented_compensations() -> None:
    # The README: compensation in reverse order before the pivot; a declined card undoes both bookings; after
    # the pivot the saga only moves forward.
    assert expect_failure(TRIP, "book_flight")[:2] == ("COMPENSATED", frozenset({"book_hotel"}))
    assert expect_failure(TRIP, "book_hotel")[:2] == ("COMPENSATED", frozenset({"book_flight"}))
    assert expect_failure(TRIP, "charge_card")[:2] == ("COMPENSATED", frozenset({"book_flight", "book_hotel"}))
    assert expect_failure(TRIP, "send_itinerary") == ("FAILED", frozenset(), ())


@pytest.mark.parametrize("case", TRIP_MATRIX, ids=repr)
async def test_the_trip_against_its_matrix(case: object) -> None:
    await case.run(TRIP, HAPPY)  # type: ignore[attr-defined]


async def test_a_case_that_does_not_hold_says_what_differed() -> None:
    case = TRIP_MATRIX[2]  # the pivot fails: both bookings undone
    broken = type(case)(case.name, case.scripts, False, case.status, frozenset({"book_flight"}))
    with pytest.raises(AssertionError, match=r"undid .* expected"):
        await broken.run(TRIP, HAPPY)


def test_a_dependent_is_undone_before_the_step_it_depends_on() -> None:
    status, undone, before = expect_failure(_visit().definition, "escort")
    assert (status, undone, before) == ("COMPENSATED", frozenset({"issue_badge"}), ())


def _deadline_visit() -> Saga:
    return _visit(deadline=timedelta(hours=48), escort_timeout=timedelta(hours=72))


def test_a_deadline_that_passes_before_a_late_answer_turns_the_saga_back_in_the_matrix() -> None:
    cases = {case.name: case for case in fault_matrix(_deadline_visit())}
    badge_late = cases["issue_badge answers after its timeout, its effect applied"]
    escort_late = cases["escort answers after its timeout, its effect applied"]
    assert (badge_late.status, badge_late.compensated) == ("COMPLETED", frozenset())
    # The escort had run, it has no undo, and the saga turned back: undone as far as it goes, for a human.
    assert (escort_late.status, escort_late.compensated) == ("FAILED", frozenset({"issue_badge"}))
    deadlines = {case.stopped: case.status for case in cases.values() if case.turn_back == "deadline"}
    assert deadlines == {"issue_badge": "CANCELLED", "escort": "CANCELLED"}


@pytest.mark.parametrize("case", fault_matrix(_deadline_visit()), ids=repr)
async def test_a_saga_with_a_deadline_against_its_matrix(case: object) -> None:
    await case.run(_deadline_visit(), Visit(visitor="ada"))  # type: ignore[attr-defined]


async def test_then_counts_the_attempts_it_is_handed_from_its_first() -> None:
    env = SagaEnvironment(TRIP)  # the charge has five attempts
    env.script(("payment", "charge_card"), time_out(effect=False, then=time_out(effect=False)))
    result = await env.result(await env.start("trip", HAPPY))
    assert result.status == "COMPLETED" and result.attempts("charge_card") == 3
    env = SagaEnvironment(TRIP)
    env.script(("payment", "charge_card"), fail_transiently(1, then=time_out(effect=False, then=fail_transiently(1))))
    result = await env.result(await env.start("trip", HAPPY))
    assert result.status == "COMPLETED" and result.attempts("charge_card") == 4


def test_a_chain_that_could_only_follow_a_recorded_attempt_is_refused() -> None:
    with pytest.raises(ValueError, match=r"time_out\(effect=True\) records"):
        time_out(then=time_out())
    with pytest.raises(ValueError, match="answer_late answers its first attempt"):
        answer_late(timedelta(seconds=3), then=answer_late(timedelta(seconds=3)))


def test_an_app_whose_saga_names_a_participant_it_does_not_serve_is_refused() -> None:
    app = SagaApp(sagas=[_visit()], participants=[desk])
    with pytest.raises(ValueError, match="sends to participant guard, which no participant of the app serves"):
        SagaEnvironment(app)


class Label(BaseModel):
    code: str


post, courier = participant("post"), participant("courier")


@post.action
async def post_label(step: StepContext, visit: Visit) -> Label:
    return Label(code="P")


@courier.action
async def courier_label(step: StepContext, visit: Visit) -> Label:
    return Label(code="C")


async def test_one_model_given_by_two_participants_is_encoded_in_each_ones_namespace() -> None:
    saga = Saga("labels", input=Visit)
    saga.step(post_label)
    saga.step(courier_label)
    env = SagaEnvironment(saga)
    env.script(post_label, succeed(Label(code="P")))
    env.script(courier_label, succeed(Label(code="C")))
    result = await env.result(await env.start(saga, Visit(visitor="ada")))
    given = {event.step: env.schemas.decode(event.output)[0] for event in result.events
             if isinstance(event, ev.StepSucceeded) and event.output}
    assert given == {"post_label": "saga.v1.post.Label", "courier_label": "saga.v1.courier.Label"}
    assert result.outputs == {"post_label": Label(code="P"), "courier_label": Label(code="C")}
