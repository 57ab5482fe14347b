"""The orchestrator's Prometheus metrics count what committed decisions recorded."""

from __future__ import annotations

import logging

import pytest

from saga_orchestrator.infra.health import ServiceHealth
from saga_orchestrator.orchestrator.domain.builder import TimerKind
from saga_orchestrator.orchestrator.domain.decide import Decision
from saga_orchestrator.orchestrator.observe import SagaMetrics, alert_due
from saga_orchestrator.orchestrator.outbound import Settled
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.testing.history import SagaRun


def _value(health: ServiceHealth, name: str, **labels: str) -> float:
    return health.registry.get_sample_value(name, labels) or 0.0


def test_a_compensated_trip_counts_its_start_end_duration_and_step_outcomes() -> None:
    run = SagaRun(TRIP, saga_id="t-m1")
    decisions: list[Decision] = [run.start(), run.ok("book_flight"),
                                 run.fail("book_hotel", error="SoldOut"), run.comp_ok("book_flight")]
    health = ServiceHealth("orchestrator")
    SagaMetrics(health).observe(Settled(decisions=decisions, dead_lettered=2))

    assert _value(health, "saga_sagas_started_total", saga_type="trip") == 1
    assert _value(health, "saga_sagas_ended_total", saga_type="trip", status="COMPENSATED") == 1
    assert _value(health, "saga_sagas_ended_total", saga_type="trip", status="COMPLETED") == 0
    assert _value(health, "saga_duration_seconds_count", saga_type="trip", status="COMPENSATED") == 1
    ended_at, started_at = run.events[-1].occurred_at, run.saga.started_at
    assert _value(health, "saga_duration_seconds_sum", saga_type="trip",
                  status="COMPENSATED") == (ended_at - started_at) / 1000
    for step, outcome in (("book_flight", "succeeded"), ("book_hotel", "failed"), ("book_flight", "compensated")):
        assert _value(health, "saga_step_events_total", saga_type="trip", step=step, outcome=outcome) == 1
    assert _value(health, "saga_step_events_total", saga_type="trip", step="book_hotel", outcome="succeeded") == 0
    assert _value(health, "saga_messages_dead_lettered_total") == 2


def test_timeouts_retries_and_rejections_are_counted() -> None:
    run = SagaRun(TRIP, saga_id="t-m2")
    decisions = [run.start(), run.fire(TimerKind.STEP_TIMEOUT, "book_flight"),
                 run.fail("book_flight", "HandlerTimedOut", retryable=True)]
    again = SagaRun(TRIP, saga_id="t-m2", _state=run.state, events=list(run.events))
    decisions.append(again.start())  # a second start of a known saga: refused and recorded
    health = ServiceHealth("orchestrator")
    SagaMetrics(health).observe(Settled(decisions=decisions))
    assert _value(health, "saga_step_events_total", saga_type="trip", step="book_flight", outcome="timed_out") == 1
    assert _value(health, "saga_step_events_total", saga_type="trip", step="book_flight",
                  outcome="retry_scheduled") == 1
    assert _value(health, "saga_sagas_rejected_total") == 1
    assert _value(health, "saga_sagas_started_total", saga_type="trip") == 1


def test_a_compensation_that_keeps_failing_is_logged_at_5_10_20_failures(caplog: pytest.LogCaptureFixture) -> None:
    assert [n for n in range(1, 90) if alert_due(n)] == [5, 10, 20, 40, 80]
    run = SagaRun(TRIP, saga_id="t-stuck")
    run.start()
    run.ok("book_flight")
    decisions = [run.fail("book_hotel", error="SoldOut")]
    for attempt in range(1, 11):
        decisions.append(run.comp_fail("book_flight", error="AirlineDown", retryable=True, attempt=attempt))
        run.fire(TimerKind.COMPENSATION_RETRY, "book_flight")
    with caplog.at_level(logging.WARNING, logger="saga.orchestrator.alerts"):
        SagaMetrics(ServiceHealth("orchestrator")).observe(Settled(decisions=decisions))
    warned = [(r.saga_id, r.step, r.failed_attempts, r.error) for r in caplog.records]  # type: ignore[attr-defined]
    assert warned == [("t-stuck", "book_flight", n, "AirlineDown: book_flight said AirlineDown") for n in (5, 10)]


def test_a_step_is_timed_from_its_command_to_the_reply_of_that_attempt() -> None:
    run = SagaRun(TRIP, saga_id="t-timed")
    metrics = SagaMetrics(health := ServiceHealth("orchestrator"))
    metrics.observe(Settled(decisions=[run.start()]))  # book_flight and book_hotel sent
    run.now += 1_500
    metrics.observe(Settled(decisions=[run.ok("book_flight")]))
    run.now += 2_000
    metrics.observe(Settled(decisions=[run.fail("book_hotel", error="SoldOut")]))
    assert _value(health, "saga_step_duration_seconds_count", saga_type="trip", step="book_flight",
                  outcome="succeeded") == 1
    assert _value(health, "saga_step_duration_seconds_sum", saga_type="trip", step="book_flight",
                  outcome="succeeded") == 1.5
    assert _value(health, "saga_step_duration_seconds_sum", saga_type="trip", step="book_hotel",
                  outcome="failed") == 3.5
    assert not metrics._sent_at.get("t-timed")  # answered: nothing kept for them


def test_a_reply_whose_command_was_not_seen_here_is_not_timed() -> None:
    run = SagaRun(TRIP, saga_id="t-untimed")
    run.start()  # sent before this instance started: never observed
    metrics = SagaMetrics(health := ServiceHealth("orchestrator"))
    metrics.observe(Settled(decisions=[run.ok("book_flight")]))
    assert _value(health, "saga_step_duration_seconds_count", saga_type="trip", step="book_flight",
                  outcome="succeeded") == 0
    assert _value(health, "saga_step_events_total", saga_type="trip", step="book_flight", outcome="succeeded") == 1
