"""The durable-timer scheduler: fires due timers (stored in Postgres) through the normal decision path."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Iterable

from ..infra.health import current as current_health
from ..infra.isolation import OutageWait
from ..infra.startup import sleep_or_stop, sleep_or_woken
from .service import SagaService

log = logging.getLogger("saga.orchestrator.timers")


TIMERS_COMPONENT = "orchestrator timers"
"""How the scheduler names itself while it waits out a platform fault. Its own wait does not hold the timers (it
is the one that fires them, and it retries on its own)."""
MAX_SLEEP_S = 1.0
"""Longest the scheduler sleeps without a look at the table: timers another orchestrator wrote wake nobody here."""


class TimerScheduler:
    """Fires due timers; they survive restarts because they live in the database.

    It looks when the earliest stored timer is due (an index lookup), and sleeps until then (at most
    ``MAX_SLEEP_S``); a timer this process arms earlier than that wakes it (``armed``). Only a look that finds
    a timer due scans (claims and fires due timers in a transaction): a quiet orchestrator looks once a
    second and never scans, a busy one scans as its timers come due. While a due timer waits for the read
    horizon it looks every ``poll_interval_s``.

    ``hold`` (when given) is asked before each scan: while it returns True no timer fires, so an outage of
    Kafka or Postgres is not mistaken for participants that do not answer. ``horizon`` (when given) is the
    read horizon in epoch ms (orchestrator/horizon.py): only timers due at or before it fire, so a reply
    still unread in a backlog is not mistaken for a missing one. Held timers fire late, never not.
    ``partitions`` (when given) are the partition numbers this instance's consumer owns: only timers of sagas
    on them fire here, against this instance's read horizon (None: every timer).
    """

    def __init__(self, service: SagaService, poll_interval_s: float = 0.05, batch: int = 100,
                 hold: Callable[[], bool] | None = None, horizon: Callable[[], int] | None = None,
                 clock_ms: Callable[[], int] | None = None,
                 partitions: Callable[[], Collection[int] | None] | None = None) -> None:
        self._service = service
        self._poll_interval_s = poll_interval_s
        self._batch = batch
        self._hold = hold or (lambda: False)
        self._horizon = horizon
        self._partitions = partitions or (lambda: None)
        self._clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)
        self._holding = False
        self._outage = OutageWait(TIMERS_COMPONENT)
        self._sleeping_until_ms: int | None = None
        self._woken = asyncio.Event()
        self.fired = 0
        self.scans = 0  # transactions that claimed due timers
        self.looks = 0  # lookups of the earliest due time

    def armed(self, due_at_ms: Iterable[int]) -> None:
        """Timers were committed: wake the scheduler when one is due before it means to look again."""
        earliest = min(due_at_ms, default=None)
        if earliest is not None and (self._sleeping_until_ms is None or earliest < self._sleeping_until_ms):
            self._woken.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Fire due timers until ``stop`` is set; database outages are waited out with backoff."""
        while not stop.is_set():
            if self._held():
                await sleep_or_stop(stop, 0.2)
                continue
            try:
                self.looks += 1
                owned = self._partitions()
                next_due_ms = await self._service.next_timer_due_ms(owned)
                if next_due_ms is not None and next_due_ms <= self._clock_ms():
                    self.scans += 1
                    fired = await self._service.fire_due_timers(self._batch, due_by_ms=self._due_by(),
                                                                partitions=owned)
                    self.fired += fired
                    if fired:
                        current_health().progress()
                    if fired == self._batch:
                        continue  # more may be due: look again at once
                    self.looks += 1
                    next_due_ms = await self._service.next_timer_due_ms(owned)
            except Exception as error:  # a platform fault: the timers stay stored and due
                await self._outage.pause(error, stop)
                continue
            self._outage.over()
            await self._sleep(stop, next_due_ms)

    async def _sleep(self, stop: asyncio.Event, next_due_ms: int | None) -> None:
        """Until ``next_due_ms`` (at most MAX_SLEEP_S; ``poll_interval_s`` when it is due already and waits
        for the read horizon), ``stop``, or a timer armed earlier."""
        now = self._clock_ms()
        if next_due_ms is not None and next_due_ms <= now:
            seconds = self._poll_interval_s
        else:
            seconds = MAX_SLEEP_S if next_due_ms is None else min(MAX_SLEEP_S, (next_due_ms - now) / 1000)
        self._sleeping_until_ms = now + int(seconds * 1000)
        self._woken.clear()
        try:
            await sleep_or_woken(stop, self._woken, seconds)
        finally:
            self._sleeping_until_ms = None

    def _due_by(self) -> int | None:
        return None if self._horizon is None else self._horizon()

    def _held(self) -> bool:
        held = self._hold()
        if held != self._holding:
            self._holding = held
            log.info("timers held: a dependency is or just was unavailable" if held else "timers released")
        return held
