"""The orchestrator's log line per decision (structured, naming the saga)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ..schemas.event_types import Event, StepCommandSent, StepSucceeded

log = logging.getLogger("saga.orchestrator")


def log_decision(events: Sequence[Event]) -> None:
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


_ROUTINE = frozenset({StepCommandSent, StepSucceeded})
