"""What the orchestrator tells its operators about the decisions it commits: a log line per decision, the
Prometheus metrics of what sagas do, and a ``saga.decide`` span per message decided, in the saga's trace.

``/metrics`` of the orchestrator answers what an operator asks first: how many sagas start and end, in which
state, how long they take, which steps fail, time out or are compensated, and how much input was
dead-lettered. Both are observed once the unit of work committed. A saga that ends COMPENSATION_FAILED and is
resumed ends again later: it counts once per end.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from opentelemetry.trace import Span, Status, StatusCode
from prometheus_client import Counter, Histogram

from ..infra.health import ServiceHealth
from ..infra.logging import saga_trace
from ..schemas import event_types as ev
from .domain.decide import Decision
from .domain.messages import IncomingMessage, TimerFired
from .domain.state import SagaStatus
from .outbound import Settled

log = logging.getLogger("saga.orchestrator")
alerts = logging.getLogger("saga.orchestrator.alerts")

FIRST_ALERT_ATTEMPT = 5
"""A compensation that failed this many times is logged as a WARNING, then again each time the count doubles
(5, 10, 20, 40...): compensations retry without limit, and one that never succeeds needs a human."""

DURATION_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, 3600.0, 86400.0)

SAGAS_TIMED_AT_ONCE = 100_000
"""Sagas whose step commands in flight ``saga_step_duration_seconds`` keeps the send times of, at most."""

STEP_OUTCOMES: dict[type[ev.Event], str] = {
    ev.StepSucceeded: "succeeded",
    ev.StepFailed: "failed",
    ev.StepTimedOut: "timed_out",
    ev.StepRetryScheduled: "retry_scheduled",
    ev.StepSkipped: "skipped",
    ev.StepWithdrawn: "withdrawn",
    ev.StepCompensated: "compensated",
    ev.CompensationFailed: "compensation_failed",
    ev.CompensationTimedOut: "compensation_timed_out",
    ev.CompensationRetryScheduled: "compensation_retry_scheduled",
}
"""The step events counted by ``saga_step_events_total``, and the ``outcome`` label of each."""


class SagaMetrics:
    """Counters and a histogram on the service's registry; ``observe`` is the service's ``on_settled``."""

    def __init__(self, health: ServiceHealth) -> None:
        self._health = health
        registry = health.registry
        self.started = Counter("saga_sagas_started", "Sagas started.", ["saga_type"], registry=registry)
        self.ended = Counter("saga_sagas_ended", "Sagas that reached a terminal state, by that state.",
                             ["saga_type", "status"], registry=registry)
        self.duration = Histogram("saga_duration_seconds", "From SagaStarted to the terminal event.",
                                  ["saga_type", "status"], buckets=DURATION_BUCKETS_S, registry=registry)
        self.steps = Counter("saga_step_events", "Step outcomes recorded: succeeded, failed, timed out, retried, "
                             "compensated...", ["saga_type", "step", "outcome"], registry=registry)
        self.rejected = Counter("saga_sagas_rejected", "SagaRejected events recorded (bad or duplicate starts).",
                                registry=registry)
        self.step_duration = Histogram(
            "saga_step_duration_seconds", "From a step's StepCommandSent to the StepSucceeded or StepFailed of "
            "that attempt, by outcome (succeeded, failed).", ["saga_type", "step", "outcome"],
            buckets=DURATION_BUCKETS_S, registry=registry)
        # When each step command in flight was sent (epoch ms), by saga, then (step, attempt): the start of its
        # duration. Kept here, not in the state, so the fold stays as it is; a command sent before a restart
        # (or by another instance) has no entry and its reply is not timed. A saga's entry goes when it ends.
        self._sent_at: dict[str, dict[tuple[str, int], int]] = {}
        self.conflicts = Counter(
            "saga_concurrency_conflicts", "Units of work retried because another writer appended to one of their "
            "sagas first (two instances handling one saga: 0 while each saga stays on one instance).",
            registry=registry)

    def observe(self, settled: Settled) -> None:
        """Count what the committed decisions recorded."""
        for decision in settled.decisions:
            state = decision.state
            if state is None:
                continue
            for event in decision.events:
                kind = type(event)
                if kind is ev.SagaStarted:
                    self.started.labels(saga_type=state.saga_type).inc()
                elif kind is ev.SagaRejected:
                    self.rejected.inc()
                elif isinstance(event, ev.StepCommandSent):
                    self._sent(event)
                elif isinstance(event, ev.TERMINAL_EVENTS):
                    labels = {"saga_type": state.saga_type, "status": state.status.value}
                    self.ended.labels(**labels).inc()
                    self.duration.labels(**labels).observe(max(0, event.occurred_at - state.started_at) / 1000)
                    self._forget(state.saga_id)
                elif (outcome := STEP_OUTCOMES.get(kind)) is not None:
                    if isinstance(event, ev.StepSucceeded | ev.StepFailed):
                        self._answered(state.saga_type, event, outcome)
                    self.steps.labels(saga_type=state.saga_type, step=getattr(event, "step", ""),
                                      outcome=outcome).inc()
                    if isinstance(event, ev.CompensationRetryScheduled) and alert_due(event.attempt - 1):
                        with saga_trace(state.traceparent):
                            _warn_stuck(decision.events, event)
        self._health.dead_lettered(settled.dead_lettered)

    def _sent(self, event: ev.StepCommandSent) -> None:
        in_flight = self._sent_at.get(event.saga_id)
        if in_flight is None:
            if len(self._sent_at) >= SAGAS_TIMED_AT_ONCE:  # bound the memory: the longest-known saga goes untimed
                del self._sent_at[next(iter(self._sent_at))]
            in_flight = self._sent_at[event.saga_id] = {}
        in_flight[(event.step, event.attempt)] = event.occurred_at

    def _answered(self, saga_type: str, event: ev.StepSucceeded | ev.StepFailed, outcome: str) -> None:
        in_flight = self._sent_at.get(event.saga_id)
        sent_at = in_flight.pop((event.step, event.attempt), None) if in_flight is not None else None
        if sent_at is not None:
            self.step_duration.labels(saga_type=saga_type, step=event.step, outcome=outcome).observe(
                max(0, event.occurred_at - sent_at) / 1000)

    def _forget(self, saga_id: str) -> None:
        """An ended saga's commands still in flight (timed out, or their replies are late) are not timed."""
        self._sent_at.pop(saga_id, None)


def alert_due(failed_attempts: int) -> bool:
    """True after 5, 10, 20, 40... failed attempts: ``FIRST_ALERT_ATTEMPT`` times a power of two."""
    ratio, remainder = divmod(failed_attempts, FIRST_ALERT_ATTEMPT)
    return remainder == 0 and ratio > 0 and ratio & (ratio - 1) == 0


def _warn_stuck(events: tuple[ev.Event, ...], retry: ev.CompensationRetryScheduled) -> None:
    failed = next((e for e in events if isinstance(e, ev.CompensationFailed) and e.step == retry.step), None)
    alerts.warning("compensation keeps failing, retrying without limit", extra={
        "saga_id": retry.saga_id, "step": retry.step, "failed_attempts": retry.attempt - 1,
        "error": f"{failed.error_type}: {failed.error_message}" if failed else "no reply (timed out)"})


def log_decision(events: Sequence[ev.Event]) -> None:
    """One line per decision, e.g. ``saga advanced saga_id=t-1 seq=4 events="StepSucceeded:book_flight
    StepCommandSent:charge_card"``: at INFO when it holds more than a step moving forward (a start, an end,
    a failure, a timeout, a retry, a compensation, a cancel), else at DEBUG. Logging every routine step at
    INFO cost a fifth of the orchestrator's CPU; ``saga history`` has every event."""
    level = logging.INFO if any(type(event) not in _ROUTINE for event in events) else logging.DEBUG
    if not log.isEnabledFor(level):
        return
    labels = " ".join(f"{type(event).__name__}:{step}" if (step := getattr(event, "step", None))
                      else type(event).__name__ for event in events)
    log.log(level, "saga advanced", extra={"saga_id": events[0].saga_id, "seq": events[0].seq, "events": labels})


_ROUTINE = frozenset({ev.StepCommandSent, ev.StepSucceeded})


def describe_decision(span: Span, message: IncomingMessage, decision: Decision) -> None:
    """On the (recording) span of deciding ``message``: the saga's id and type, the message's type and step, the
    types of the events ``decision`` recorded and the saga's status after them, and an error status when it
    dead-lettered the message or quarantined the saga (the reason)."""
    step = message.timer.step if isinstance(message, TimerFired) else getattr(message, "step", None)
    state = decision.state
    span.set_attributes({
        "saga.id": message.saga_id or "",
        "saga.type": (state.saga_type if state is not None else None) or getattr(message, "saga_type", None) or "",
        "saga.message": type(message).__name__,
        "saga.events": [type(event).__name__ for event in decision.events],
        **({"saga.step": step} if step else {}),
        **({"saga.status": state.status.value} if state is not None else {}),
    })
    quarantined = state is not None and state.status is SagaStatus.QUARANTINED
    if decision.dead_letter is not None or quarantined:
        span.set_status(Status(StatusCode.ERROR, decision.dead_letter or (state.reason if state is not None else None)))
