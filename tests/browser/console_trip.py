"""The trip with an hour between the card's attempts: a flaky card's trip waits on its retry long enough for an
operator to retry it now from the console. The services load it as
``SAGA_DEFINITIONS=tests.browser.console_trip:CONSOLE_TRIP``."""

from __future__ import annotations

from dataclasses import replace

from saga_orchestrator.participants.trip.definition import TRIP

HOUR_MS = 3_600_000

CONSOLE_TRIP = replace(TRIP, steps=tuple(
    replace(step, retry=replace(step.retry, initial_backoff_ms=HOUR_MS, max_backoff_ms=HOUR_MS))
    if step.name == "charge_card" else step for step in TRIP.steps))
