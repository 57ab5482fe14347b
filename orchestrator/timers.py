"""The durable-timer scheduler: fires due timers (stored in Postgres) through the normal decision path."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ..infra.health import current as current_health
from ..infra.startup import sleep_or_stop
from .service import SagaService

log = logging.getLogger("saga.orchestrator.timers")


class TimerScheduler:
    """Polls for due timers; they survive restarts because they live in the database.

    ``hold`` (when given) is asked before each scan: while it returns True no timer fires, so an outage of
    Kafka or Postgres is not mistaken for participants that do not answer. ``horizon`` (when given) is the
    read horizon in epoch ms (orchestrator/horizon.py): only timers due at or before it fire, so a reply
    still unread in a backlog is not mistaken for a missing one. Held timers fire late, never not.
    """

    def __init__(self, service: SagaService, poll_interval_s: float = 0.05, batch: int = 100,
                 hold: Callable[[], bool] | None = None, horizon: Callable[[], int] | None = None) -> None:
        self._service = service
        self._poll_interval_s = poll_interval_s
        self._batch = batch
        self._hold = hold or (lambda: False)
        self._horizon = horizon
        self._holding = False
        self.fired = 0

    async def run(self, stop: asyncio.Event) -> None:
        """Fire due timers until ``stop`` is set; database outages are waited out with backoff."""
        backoff = 0.1
        while not stop.is_set():
            if self._held():
                await sleep_or_stop(stop, 0.2)
                continue
            try:
                fired = await self._service.fire_due_timers(self._batch, due_by_ms=self._due_by())
                self.fired += fired
                if fired:
                    current_health().progress()
                backoff = 0.1
            except Exception as error:
                log.error("timer scan failed, retrying", extra={"error": repr(error), "backoff_s": backoff})
                fired = 0
                await sleep_or_stop(stop, backoff)
                backoff = min(backoff * 2, 5.0)
            if fired < self._batch:
                await sleep_or_stop(stop, self._poll_interval_s)

    def _due_by(self) -> int | None:
        return None if self._horizon is None else self._horizon()

    def _held(self) -> bool:
        held = self._hold()
        if held != self._holding:
            self._holding = held
            log.info("timers held: a dependency is or just was unavailable" if held else "timers released")
        return held
