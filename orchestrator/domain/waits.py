"""What a saga waits for, step by step, in words a person acts on: a signal, a person's answer, a worker that has
not picked its command up, a participant's word on a withdrawal. Read by ``saga status``, the API and the console.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ...schemas import event_types as ev
from .definition import SagaDefinition
from .model import SagaState, StepStatus


@dataclass(frozen=True)
class PersonWait:
    """A command its participant deferred until a person answers it (``saga awaiting`` lists it)."""

    participant: str
    idempotency_key: str
    since: int  # epoch ms
    answer_by: int | None


@dataclass(frozen=True)
class Wait:
    """One step waiting: for ``what``, since ``since`` (epoch ms), under ``key``, until ``expires_at``."""

    step: str
    what: str
    since: int
    key: str | None
    expires_at: int | None
    hint: str | None = None  # the command that ends the wait, where a person can

    def describe(self) -> str:
        parts = [f"waiting for {self.what} since {_when(self.since)}"]
        if self.key is not None:
            parts.append(f"key {self.key}")
        if self.expires_at is not None:
            parts.append(f"expires at {_when(self.expires_at)}")
        return ", ".join(parts) + (f" ({self.hint})" if self.hint else "")


def waits(definition: SagaDefinition, state: SagaState, events: Sequence[ev.Event],
          persons: Mapping[str, PersonWait] | None = None) -> list[Wait]:
    """Every step of ``state`` that waits, in the definition's order; ``persons``: the deferred commands of the
    saga by step (the participants' awaiting tables), which the history cannot tell from a slow participant."""
    sent: dict[str, ev.Event] = {}
    for event in events:
        if isinstance(event, ev.StepCommandSent | ev.SignalAwaited | ev.StepWithdrawn):
            sent[event.step] = event
    found = []
    for name in definition.order:
        step, started = state.steps[name], sent.get(name)
        if started is None or state.is_terminal:
            continue
        declared = definition.step(name)
        person = (persons or {}).get(name)
        if step.status is StepStatus.AWAITING_SIGNAL and isinstance(started, ev.SignalAwaited):
            found.append(Wait(name, f"signal {started.signal}", started.occurred_at, None, started.timeout_at,
                              f"saga signal {state.saga_id} {started.signal} --payload ..."))
        elif step.status is StepStatus.WITHDRAWING and isinstance(started, ev.StepWithdrawn):
            found.append(Wait(name, f"{declared.participant} to say whether the withdrawn command had run",
                              started.occurred_at, step.idempotency_key, started.timeout_at))
        elif person is not None and step.status in (StepStatus.RUNNING, StepStatus.TIMED_OUT):
            found.append(Wait(name, f"a person's answer to {person.participant}", person.since, person.idempotency_key,
                              person.answer_by, f"saga answer {person.participant} {person.idempotency_key} ..."))
        elif step.status is StepStatus.TIMED_OUT and isinstance(started, ev.StepCommandSent):
            found.append(Wait(name, f"a worker of {declared.participant} (no answer within the step's timeout)",
                              started.occurred_at, step.idempotency_key, None))
        elif step.status is StepStatus.RUNNING and isinstance(started, ev.StepCommandSent):
            found.append(Wait(name, f"{declared.participant}'s answer", started.occurred_at, step.idempotency_key,
                              started.timeout_at))
    return found


def _when(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
