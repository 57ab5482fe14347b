"""Prometheus metrics of what the orchestrator decided, observed once each unit of work committed.

``/metrics`` of the orchestrator then answers what an operator asks first: how many sagas start and end, in
which state, how long they take, which steps fail, time out or are compensated, and how much input was
dead-lettered. A saga that ends COMPENSATION_FAILED and is resumed ends again later: it counts once per end.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from infra.health import ServiceHealth
from orchestrator.domain import events as ev
from orchestrator.writes import Settled

DURATION_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, 3600.0, 86400.0)

STEP_OUTCOMES: dict[type[ev.Event], str] = {
    ev.StepSucceeded: "succeeded",
    ev.StepFailed: "failed",
    ev.StepTimedOut: "timed_out",
    ev.StepRetryScheduled: "retry_scheduled",
    ev.StepSkipped: "skipped",
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
                elif isinstance(event, ev.TERMINAL_EVENTS):
                    labels = {"saga_type": state.saga_type, "status": state.status.value}
                    self.ended.labels(**labels).inc()
                    self.duration.labels(**labels).observe(max(0, event.occurred_at - state.started_at) / 1000)
                elif (outcome := STEP_OUTCOMES.get(kind)) is not None:
                    self.steps.labels(saga_type=state.saga_type, step=getattr(event, "step", ""),
                                      outcome=outcome).inc()
        self._health.dead_lettered(settled.dead_lettered)
