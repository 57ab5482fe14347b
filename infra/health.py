"""What a service knows about its own health: dependency state, progress, and its Prometheus metrics.

One ``ServiceHealth`` per process (``current()``), named by the service at start (``configure``). The
probes in ``infra/health_server.py`` report each dependency's state; components report their progress
(messages handled, rows published). A dependency that changes state is logged once, as a structured line:

    {"level": "warning", "msg": "kafka unavailable", "dependency": "kafka", "error": "..."}
    {"level": "info", "msg": "kafka reachable again", "dependency": "kafka", "outage_s": 14.2}
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

log = logging.getLogger("saga.health")


class Dependency(StrEnum):
    """What a service needs to make progress."""

    KAFKA = "kafka"
    POSTGRES = "postgres"


@dataclass
class DependencyState:
    """The last known state of one dependency (``ok`` is None until the first probe answered)."""

    ok: bool | None = None
    since: float | None = None  # wall clock of the last change
    changed_at: float = 0.0  # monotonic clock of the last change
    error: str | None = None
    outages: int = 0  # how often it went from reachable (or unknown) to unavailable


class ServiceHealth:
    """Dependency states, progress and metrics of one service process."""

    def __init__(self, service: str = "saga", *, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.service = service
        self._clock = clock
        self._wall = wall
        self._started = clock()
        self.states = {dependency: DependencyState() for dependency in Dependency}
        # Components waiting out a platform fault their own work met (``infra.isolation.OutageWait``): what each
        # waits for and since when (monotonic). A database can answer the probes' SELECT 1 and still be unable
        # to take a write (out of disk), so these are kept apart from the probes' verdicts.
        self.waits: dict[str, tuple[str, float]] = {}
        self._waits_over_at: dict[str, float] = {}  # component -> when its last wait ended (monotonic)
        self.last_progress: float | None = None  # wall clock
        # True while the service's consumer is in its group with partitions assigned (GET /ready); a service
        # without a consumer (the separate relay) sets it once it runs.
        self.consuming = False
        self.handled_total = 0
        self.published_total = 0
        # Async callables run before each scrape, e.g. to refresh a gauge from the database.
        self.before_scrape: list[Callable[[], Awaitable[None]]] = []
        self._lag_labels: dict[str, set[tuple[str, int]]] = {}  # group -> partitions in consumer_lag
        self.registry = CollectorRegistry()
        self.messages_handled = Counter(
            "saga_messages_handled", "Messages this service handled (consumed and committed).",
            registry=self.registry)
        self.relay_rows_published = Counter(
            "saga_relay_rows_published", "Outbox rows the relay published to Kafka.", ["table"],
            registry=self.registry)
        self.relay_rows_parked = Counter(
            "saga_relay_rows_parked", "Outbox rows the relay parked: the broker refused them for good.", ["table"],
            registry=self.registry,
        )
        self.messages_dead_lettered = Counter(
            "saga_messages_dead_lettered", "Messages this service could not process and parked on saga.dlq.",
            registry=self.registry)
        self.commands = Counter(
            "saga_participant_commands", "Commands a participant handled, by what became of them: recorded, "
            "transient (failure replied, nothing recorded), duplicate (recorded reply sent again), dead_lettered.",
            ["participant", "disposition"], registry=self.registry)
        self.sagas = Gauge("saga_sagas", "Sagas by status in the read model (orchestrator only).", ["status"],
                           registry=self.registry)
        self.dependency_up = Gauge("saga_dependency_up", "1 when the dependency answers, else 0.",
                                   ["dependency"], registry=self.registry)
        self.waiting_out = Gauge(
            "saga_waiting_out_platform_fault", "1 while the component waits out a platform fault its work met.",
            ["component"], registry=self.registry)
        self.platform_faults = Counter(
            "saga_platform_faults", "Platform faults a component's work met and waited out (each counted once).",
            ["component"], registry=self.registry)
        # The outbox a service writes, refreshed every few seconds by the service (``outbox.depth``).
        self.outbox_rows = Gauge("saga_outbox_rows", "Outbox rows not yet published, held-back ones included.",
                                 ["table"], registry=self.registry)
        self.outbox_oldest_age = Gauge(
            "saga_outbox_oldest_age_seconds", "How long the oldest outbox row that is due has waited to be "
            "published (0 when none is due).", ["table"], registry=self.registry)
        self.outbox_parked_rows = Gauge(
            "saga_outbox_parked_rows", "Outbox rows parked because the broker refused them for good (saga outbox "
            "list).", ["table"], registry=self.registry)
        self.consumer_lag = Gauge(
            "saga_consumer_lag", "Records of an assigned partition this service's consumer has not handled yet: "
            "the partition's last known end offset minus the consumer's position.",
            ["group", "topic", "partition"], registry=self.registry)
        self.last_progress_gauge = Gauge("saga_last_progress_timestamp_seconds",
                                         "When this service last made progress (epoch seconds).",
                                         registry=self.registry)

    # -- dependencies ------------------------------------------------------------------------------------

    def report(self, dependency: Dependency, ok: bool, error: str | None = None) -> None:
        """Record a probe's verdict; a change of state is logged once (structured)."""
        state = self.states[dependency]
        self.dependency_up.labels(dependency=dependency.value).set(1 if ok else 0)
        if state.ok is ok:
            if not ok:
                state.error = error
            return
        now, previous, previous_at = self._clock(), state.ok, state.changed_at
        state.ok, state.since, state.changed_at, state.error = ok, self._wall(), now, None if ok else error
        fields: dict[str, Any] = {"dependency": dependency.value, "service": self.service}
        if not ok:
            state.outages += 1
            log.warning(f"{dependency.value} unavailable", extra={**fields, "error": error})
        elif previous is False:
            log.info(f"{dependency.value} reachable again",
                     extra={**fields, "outage_s": round(now - previous_at, 3)})
        else:
            log.info(f"{dependency.value} reachable", extra=fields)

    def waiting(self, component: str, what: str) -> None:
        """``component`` waits out a platform fault: ``what`` (shown by /ready and /health)."""
        since = self.waits[component][1] if component in self.waits else self._clock()
        if component not in self.waits:
            self.platform_faults.labels(component=component).inc()
        self.waits[component] = (what, since)
        self.waiting_out.labels(component=component).set(1)

    def resumed(self, component: str) -> None:
        """``component``'s work goes through again."""
        if self.waits.pop(component, None) is not None:
            self._waits_over_at[component] = self._clock()
            self.waiting_out.labels(component=component).set(0)

    def is_up(self, dependency: Dependency) -> bool:
        """True unless the last probe of ``dependency`` failed (unknown counts as up)."""
        return self.states[dependency].ok is not False

    def outage_within(self, seconds: float, ignoring: Collection[str] = ()) -> bool:
        """True while a dependency is down or a component (but those ``ignoring`` names) waits out a platform
        fault, and for ``seconds`` after the last one came back."""
        now = self._clock()
        if any(component not in ignoring for component in self.waits) or any(
                now - over_at < seconds for component, over_at in self._waits_over_at.items()
                if component not in ignoring):
            return True
        for state in self.states.values():
            if state.ok is False:
                return True
            if state.outages and now - state.changed_at < seconds:
                return True
        return False

    # -- progress and metrics ----------------------------------------------------------------------------

    def handled(self, count: int = 1) -> None:
        """``count`` messages were handled and committed."""
        if count <= 0:
            return
        self.handled_total += count
        self.messages_handled.inc(count)
        self.progress()

    def dead_lettered(self, count: int) -> None:
        """``count`` messages were parked on saga.dlq (committed)."""
        if count > 0:
            self.messages_dead_lettered.inc(count)

    def commands_handled(self, participant: str, dispositions: Iterable[str]) -> None:
        """A participant committed a batch of commands with these dispositions."""
        for disposition, count in collections.Counter(dispositions).items():
            self.commands.labels(participant=participant, disposition=disposition).inc(count)

    def published(self, table: str, rows: int) -> None:
        """The relay of ``table`` published ``rows`` rows."""
        if rows <= 0:
            return
        self.published_total += rows
        self.relay_rows_published.labels(table=table).inc(rows)
        self.progress()

    def parked(self, table: str, rows: int) -> None:
        """The relay of ``table`` parked ``rows`` rows."""
        self.relay_rows_parked.labels(table=table).inc(rows)

    def consumer_lags(self, group: str, lags: Mapping[tuple[str, int], int]) -> None:
        """The lag of each (topic, partition) consumer group ``group`` has assigned here now; partitions it no
        longer has drop out of ``saga_consumer_lag``."""
        for labels in list(self._lag_labels.get(group, ())):
            if labels not in lags:
                self.consumer_lag.remove(group, labels[0], str(labels[1]))
        for (topic, partition), lag in lags.items():
            self.consumer_lag.labels(group=group, topic=topic, partition=str(partition)).set(lag)
        self._lag_labels[group] = set(lags)

    def progress(self) -> None:
        """The service did useful work just now."""
        self.last_progress = self._wall()
        self.last_progress_gauge.set(self.last_progress)

    def readiness(self) -> tuple[bool, list[str]]:
        """Whether the service should get traffic (GET /ready): its consumer joined its group and Postgres
        and Kafka answer; else why not."""
        waiting = []
        if not self.consuming:
            waiting.append("the consumer has not joined its group yet")
        for dependency in (Dependency.POSTGRES, Dependency.KAFKA):
            if self.states[dependency].ok is not True:
                waiting.append(f"{dependency.value} has not answered" if self.states[dependency].ok is None
                               else f"{dependency.value} does not answer: {self.states[dependency].error}")
        now = self._clock()
        for component, (what, since) in sorted(self.waits.items()):
            waiting.append(f"{component} waits out a platform fault for {now - since:.1f} s: {what}")
        return not waiting, waiting

    def snapshot(self) -> dict[str, Any]:
        """The body of GET /health."""
        kafka, postgres = self.states[Dependency.KAFKA], self.states[Dependency.POSTGRES]
        return {
            "service": self.service,
            "status": "ok" if kafka.ok is not False and postgres.ok is not False and not self.waits else "degraded",
            "kafka_ok": kafka.ok,
            "postgres_ok": postgres.ok,
            "last_progress": self.last_progress,
            "messages_handled": self.handled_total,
            "rows_published": self.published_total,
            "uptime_s": round(self._clock() - self._started, 3),
            "waiting_out": {component: {"fault": what, "for_s": round(self._clock() - since, 3)}
                            for component, (what, since) in self.waits.items()},
            "dependencies": {
                dependency.value: {"ok": state.ok, "since": state.since, "error": state.error,
                                   "outages": state.outages}
                for dependency, state in self.states.items()
            },
        }

    async def metrics(self) -> bytes:
        """The body of GET /metrics (Prometheus text format), after the ``before_scrape`` hooks ran."""
        for hook in self.before_scrape:
            try:
                await hook()
            except Exception as error:  # a failed refresh leaves the gauge as it was; never fail a scrape
                log.debug("metrics refresh failed", extra={"error": repr(error)})
        return generate_latest(self.registry)


_current = ServiceHealth()


def current() -> ServiceHealth:
    """This process's health (a fresh, unnamed one until ``configure``)."""
    return _current


def configure(service: str) -> ServiceHealth:
    """Start this process's health record under the service's name; returns it."""
    global _current
    _current = ServiceHealth(service)
    return _current
