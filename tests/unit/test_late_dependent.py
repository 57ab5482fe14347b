"""A dependent whose success arrives after the unwinding began: it is undone before its upstream step's
compensation is sent again (dependents are undone first, whether by a wave, a retry that comes due or a
resume)."""

from __future__ import annotations

from saga_orchestrator.orchestrator.domain.builder import TimerKind
from saga_orchestrator.orchestrator.domain.definition import RetryPolicy, SagaDefinition, Step
from saga_orchestrator.orchestrator.domain.model import SagaStatus, StepStatus
from saga_orchestrator.schemas import event_types as ev
from saga_orchestrator.testing.history import SagaRun

RETRY = RetryPolicy(max_attempts=3, initial_backoff_ms=10, max_backoff_ms=100)
CHAIN = SagaDefinition(
    saga_type="chain", version=1, input_schema="x",
    steps=(Step(name="reserve", participant="p", command="reserve", compensation="release", retry=RETRY,
                compensation_retry=RetryPolicy(max_attempts=None, initial_backoff_ms=10, max_backoff_ms=100,
                                               non_retryable_errors=frozenset({"Refused"}))),
           Step(name="ship", participant="p", command="ship", compensation="recall", depends_on=("reserve",),
                retry=RETRY)),
)


def _sent(decision_events: tuple[ev.Event, ...]) -> list[tuple[str, str]]:
    return [(type(e).__name__, getattr(e, "step", "")) for e in decision_events
            if isinstance(e, ev.CompensationSent | ev.CompensationRetryScheduled)]


def _unwinding_with_a_late_success(refusal: str) -> SagaRun:
    """``reserve`` done, ``ship`` failed once (retry due), the saga cancelled: ``release`` went out and was
    refused (``refusal``: retryable or for good); then ``ship``'s first attempt answers: it did succeed."""
    run = SagaRun(CHAIN)
    run.start()
    run.ok("reserve")
    run.fail("ship", error="Busy", retryable=True)
    decision = run.cancel()
    assert _sent(decision.events) == [("CompensationSent", "reserve")]  # ship had not taken effect, so far
    run.comp_fail("reserve", error=refusal, retryable=refusal != "Refused")
    run.ok("ship", attempt=1)
    assert run.saga.steps["ship"].status is StepStatus.SUCCEEDED
    return run


def test_a_compensation_retry_waits_for_a_dependent_that_succeeded_late() -> None:
    run = _unwinding_with_a_late_success("Busy")
    decision = run.fire(TimerKind.COMPENSATION_RETRY, "reserve")
    assert _sent(decision.events) == [("CompensationSent", "ship"), ("CompensationRetryScheduled", "reserve")]
    decision = run.fire(TimerKind.COMPENSATION_RETRY, "reserve")  # ship's undo not answered yet: again later
    assert _sent(decision.events) == [("CompensationRetryScheduled", "reserve")]
    run.comp_ok("ship")
    decision = run.fire(TimerKind.COMPENSATION_RETRY, "reserve")
    assert _sent(decision.events) == [("CompensationSent", "reserve")]
    run.comp_ok("reserve")
    assert run.saga.status is SagaStatus.CANCELLED


def test_a_resume_undoes_a_dependent_that_succeeded_late_first() -> None:
    run = _unwinding_with_a_late_success("Refused")
    assert run.saga.status is SagaStatus.COMPENSATION_FAILED
    decision = run.resume()
    assert _sent(decision.events) == [("CompensationSent", "ship"), ("CompensationRetryScheduled", "reserve")]
    run.comp_ok("ship")
    decision = run.fire(TimerKind.COMPENSATION_RETRY, "reserve")
    assert _sent(decision.events) == [("CompensationSent", "reserve")]
    run.comp_ok("reserve")
    assert run.status() is SagaStatus.CANCELLED  # (read anew: the assertion above narrowed run.saga.status)
