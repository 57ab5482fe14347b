"""Signals to page on that the orchestrator reads from its own tables: timers overdue, the oldest running saga
of each type, compensations that keep retrying.

A chore refreshes them every few seconds (``outbox.depth.SIGNALS_EVERY_S``), never per scrape and never on the
path of a message; each read (``orchestrator.store.operations.signals``) reads a table that holds only live work
(``saga.timers``, the RUNNING rows of ``saga.saga_summary`` through its status index) under a statement timeout.

A compensation retries from its first ``CompensationRetryScheduled`` until it succeeds or fails for good (an
operator's resume starts the count afresh); while it does, its saga holds a COMPENSATION_RETRY timer, or a
COMPENSATION_TIMEOUT timer of an attempt after the first. Only the events of those sagas are read, and of
them only the retries and the operators' actions.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from prometheus_client import Gauge

from ..infra.health import ServiceHealth
from ..operations.ports import SignalStore
from ..schemas import event_types as ev
from ..schemas import wire
from ..schemas.codec import WireError
from .domain.builder import TimerKind
from .domain.model import RESUME_COMPENSATION

RETRYING_SAGAS_LOOKED_AT = 1000
"""At most this many sagas with a compensation retrying are looked at per refresh (the longest-waiting first):
enough to page on, and a bound on the events read."""


@dataclass(frozen=True)
class RetryingCompensation:
    """A compensation that is retrying: its saga, step, and when its first retry was scheduled (epoch s)."""

    saga_id: str
    saga_type: str
    step: str
    since_s: float


def retrying_since(saga_type: str, history: Iterable[tuple[ev.Event, float]],
                   retrying_steps: Iterable[str]) -> list[RetryingCompensation]:
    """When each of ``retrying_steps`` of one saga started retrying, from that saga's retry events and
    operator actions (each with its recorded time, epoch s) in seq order: its first CompensationRetryScheduled
    after the saga's last resume. A step whose retry events are gone is left out."""
    since: dict[str, float] = {}
    saga_id = ""
    for event, recorded_s in history:
        saga_id = event.saga_id
        if isinstance(event, ev.OperatorAction) and event.action == RESUME_COMPENSATION:
            since.clear()
        elif isinstance(event, ev.CompensationRetryScheduled):
            since.setdefault(event.step, recorded_s)
    return [RetryingCompensation(saga_id, saga_type, step, since[step]) for step in sorted(set(retrying_steps))
            if step in since]


class TableSignals:
    """The orchestrator's gauges over its tables (read through ``store``); ``refresh`` sets them all (a chore
    calls it)."""

    def __init__(self, store: SignalStore, health: ServiceHealth, compensation_alert_s: float,
                 wall: Callable[[], float] = time.time) -> None:
        self._store = store
        self._alert_s = compensation_alert_s
        self._wall = wall
        registry = health.registry
        self.timers_overdue = Gauge("saga_timers_overdue", "Durable timers whose due time has passed and that "
                                    "have not fired yet.", registry=registry)
        self.timers_overdue_age = Gauge(
            "saga_timers_overdue_oldest_age_seconds", "How long past its due time the most overdue timer is (0 "
            "when none is overdue).", registry=registry)
        self.oldest_running_age = Gauge(
            "saga_oldest_running_age_seconds", "Age of the oldest RUNNING saga of each type, from its start "
            "(types without a running saga are absent).", ["saga_type"], registry=registry)
        self.compensations_retrying = Gauge(
            "saga_compensations_retrying", "Compensations retrying now (a COMPENSATION_RETRY timer, or a "
            "retried compensation in flight).", ["saga_type"], registry=registry)
        self.compensations_retrying_too_long = Gauge(
            "saga_compensations_retrying_too_long", "Compensations retrying for longer than "
            "SAGA_COMPENSATION_ALERT_MINUTES since their first retry.", ["saga_type"], registry=registry)

    async def refresh(self) -> None:
        """Query the tables and set every gauge; raises what the database raised (the gauges keep their
        values)."""
        await self._timers()
        await self._running()
        await self._compensations()

    async def _timers(self) -> None:
        overdue, oldest_s = await self._store.overdue_timers()
        self.timers_overdue.set(overdue)
        self.timers_overdue_age.set(oldest_s)

    async def _running(self) -> None:
        _set_per_type(self.oldest_running_age, await self._store.oldest_running())

    async def _compensations(self) -> None:
        timers = await self._store.retry_timers([TimerKind.COMPENSATION_RETRY.value],
                                                TimerKind.COMPENSATION_TIMEOUT.value, RETRYING_SAGAS_LOOKED_AT)
        steps: dict[str, set[str]] = {}
        types: dict[str, str] = {}
        for timer in timers:
            steps.setdefault(timer.saga_id, set()).add(timer.step)
            types[timer.saga_id] = timer.saga_type
        events = await self._store.events_of(steps, [ev.CompensationRetryScheduled.__name__,
                                                     ev.OperatorAction.__name__])
        histories: dict[str, list[tuple[ev.Event, float]]] = {saga_id: [] for saga_id in steps}
        for row in events:
            try:
                event = wire.decode_event(row.body)
            except WireError:  # an event this build cannot read is the quarantine's business, not a gauge's
                continue
            histories[row.saga_id].append((event, (row.recorded_at_ms or 0) / 1000))
        retrying: dict[str, int] = dict.fromkeys(set(types.values()), 0)
        too_long: dict[str, int] = dict(retrying)
        now_s = self._wall()
        for saga_id, history in histories.items():
            for compensation in retrying_since(types[saga_id], history, steps[saga_id]):
                retrying[compensation.saga_type] += 1
                if now_s - compensation.since_s > self._alert_s:
                    too_long[compensation.saga_type] += 1
        _set_per_type(self.compensations_retrying, retrying)
        _set_per_type(self.compensations_retrying_too_long, too_long)


def _set_per_type(gauge: Gauge, values: Mapping[str, float]) -> None:
    """``gauge`` holds exactly ``values``, one series per saga type."""
    gauge.clear()
    for saga_type, value in values.items():
        gauge.labels(saga_type=saga_type).set(value)
