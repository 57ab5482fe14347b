"""Fault injection: kill this process with SIGKILL at a named instant, to prove crash recovery.

Arm it with the ``SAGA_FAULTS`` environment variable, read once when this module is first imported::

    SAGA_FAULTS="orchestrator.after_commit=3,relay.after_publish=1,participant.after_commit=2"
    SAGA_FAULTS="relay.after_publish@p0.05"        # each time, with probability 0.05

``name=N`` kills the process the N-th time ``crash_point(name)`` is reached (counted per process, so a
restarted process starts counting again); ``name@pP`` kills it each time with probability P. The kill is a
real ``kill -9`` of the process itself: no exception, no ``finally``, no flush of anything but the one log
line written just before — exactly what a power cut or the OOM killer does at that instant.

Crash points in the code (each sits where a crash is most dangerous for the delivery guarantees):

- ``orchestrator.after_commit``: the orchestrator's Postgres transactions committed, its Kafka offsets not.
- ``relay.after_publish``: Kafka acknowledged a batch of outbox rows, the relay has not deleted them yet
  (any OutboxRelay: the relay service's, or the one inside each participant process).
- ``participant.after_commit``: a participant committed its business change and reply row, nothing is
  published and its Kafka offset is not committed.

Unset, ``crash_point`` costs one global lookup and a truth test.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass

ENV_VAR = "SAGA_FAULTS"

log = logging.getLogger("saga.faults")


@dataclass
class Trigger:
    """When one crash point fires: on hit number ``nth``, or with ``probability`` on every hit."""

    nth: int | None = None
    probability: float | None = None
    hits: int = 0

    def hit(self, draw: Callable[[], float] = random.random) -> bool:
        """Count one hit; True when this hit must crash the process."""
        self.hits += 1
        if self.nth is not None:
            return self.hits == self.nth
        return self.probability is not None and draw() < self.probability


def parse_faults(spec: str) -> dict[str, Trigger]:
    """``"a=3,b@p0.5"`` → {"a": Trigger(nth=3), "b": Trigger(probability=0.5)}; a clear error otherwise."""
    triggers: dict[str, Trigger] = {}
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        if "@p" in item:
            name, _, value = item.partition("@p")
            name = name.strip().removesuffix("=").strip()
            try:
                probability = float(value)
            except ValueError:
                raise ValueError(f"{ENV_VAR}: {item!r}: the probability after @p is not a number") from None
            if not 0.0 <= probability <= 1.0:
                raise ValueError(f"{ENV_VAR}: {item!r}: the probability must be between 0 and 1")
            trigger = Trigger(probability=probability)
        else:
            name, equals, value = item.partition("=")
            name = name.strip()
            if not equals or not value.strip().isdigit() or int(value) < 1:
                raise ValueError(f"{ENV_VAR}: {item!r} is neither name=N (N >= 1) nor name@pP (0 <= P <= 1)")
            trigger = Trigger(nth=int(value))
        if not name:
            raise ValueError(f"{ENV_VAR}: {item!r} names no crash point")
        triggers[name] = trigger
    return triggers


def _kill_self(name: str, hits: int, **detail: object) -> None:
    # The log line is the only trace the test (or operator) gets, so write it before the kill.
    log.critical("fault injection: kill -9 at crash point %s", name, extra={"crash_point": name, "hit": hits,
                                                                             "pid": os.getpid(), **detail})
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


_triggers: dict[str, Trigger] = parse_faults(os.environ.get(ENV_VAR, ""))
_kill: Callable[..., None] = _kill_self


def crash_point(name: str, detail: Callable[[], Mapping[str, object]] | None = None) -> None:
    """Kill this process with SIGKILL here if ``SAGA_FAULTS`` arms ``name`` and this hit is the one; its log line
    carries what ``detail()`` gives (called only then: the unarmed path costs nothing)."""
    if not _triggers:
        return
    trigger = _triggers.get(name)
    if trigger is not None and trigger.hit():
        _kill(name, trigger.hits, **(detail() if detail is not None else {}))


def arm(spec: str, kill: Callable[..., None] | None = None) -> dict[str, Trigger]:
    """Replace the armed crash points (tests; ``""`` disarms all); ``kill`` replaces the SIGKILL."""
    global _triggers, _kill
    _triggers = parse_faults(spec)
    _kill = kill or _kill_self
    return _triggers
