"""What the orchestrator decided about a lever the console pulled: applied (and what followed), refused and why,
or not decided yet.

A lever is a control command with a message id, queued after the saga's event ``after_seq``. The core records
its decision in the saga's own stream after that seq: ``OperatorAction`` (applied) or ``OperatorActionRefused``
for a lever, ``SagaCancelRequested`` or ``SagaCancelRefused`` for a cancel, ``SagaReleased`` for a release, or,
for a release whose cause is not fixed, ``SagaQuarantined`` naming the command's message id. A command the
orchestrator took (its inbox holds the id) without any of these was dead-lettered: a lever on a quarantined saga
is, as is every message for a saga whose history does not fold.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

from ..client.api import saga_segment
from ..operations.reads import Reads
from ..orchestrator.domain.model import RESUME_COMPENSATION
from ..orchestrator.domain.state import SagaStatus
from ..schemas import event_types as ev
from ..schemas.message_types import CANCEL, RELEASE, RESUME

APPLIED, REFUSED = "applied", "refused"
"""A decided lever's outcome."""
PENDING = ("queued", "sent")
"""A lever not decided yet: still in the orchestrator's outbox, or published and not taken yet."""

FOLLOWED_SHOWN = 20  # how many of the events that followed an applied lever its decision names
_DECISIONS = (ev.OperatorAction, ev.OperatorActionRefused, ev.SagaCancelRequested, ev.SagaCancelRefused,
              ev.SagaReleased)


@dataclass(frozen=True)
class Pulled:
    """A lever queued for ``operator``: its command's message id (``action_id``) and the saga's last seq then."""

    saga_id: str
    action: str
    step: str | None
    operator: str | None
    action_id: str
    after_seq: int

    def query(self) -> str:
        """The query string that names this lever to ``decision`` (the action id is the path's last part)."""
        return urlencode({"action": self.action, "after_seq": self.after_seq, **(
            {"operator": self.operator} if self.operator else {})})

    def path(self) -> str:
        """Where its decision is read, under a saga's ``/actions``."""
        return f"{saga_segment(self.saga_id)}/actions/{quote(self.action_id, safe='')}?{self.query()}"


@dataclass(frozen=True)
class LeverDecision:
    """``outcome``: applied, refused, queued or sent (the last two: not decided yet). ``seq`` is the event that
    decided it, ``reason`` why it was refused, ``followed`` the types of the events that came of it."""

    outcome: str
    reason: str | None = None
    seq: int | None = None
    followed: tuple[str, ...] = field(default=())

    @property
    def decided(self) -> bool:
        return self.outcome in (APPLIED, REFUSED)

    def describe(self, action: str) -> str:
        """One line for an operator."""
        if self.outcome == APPLIED:
            then = f"; then {', '.join(self.followed)}" if self.followed else ""
            return f"{action} applied (event {self.seq}){then}"
        if self.outcome == REFUSED:
            return f"{action} refused: {self.reason}"
        if self.outcome == "queued":
            return f"{action} queued: the orchestrator's relay has not published it yet"
        return f"{action} published: the orchestrator has not taken it yet"

    def to_json(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "decided": self.decided, "reason": self.reason, "seq": self.seq,
                "followed": list(self.followed)}


def _answers(pulled: Pulled, event: ev.Event) -> bool:
    """Whether ``event`` is the core's decision of ``pulled`` (same action, same operator when known)."""
    names = {pulled.action, RESUME_COMPENSATION} if pulled.action == RESUME else {pulled.action}
    if isinstance(event, ev.OperatorAction | ev.OperatorActionRefused):
        return event.action in names and pulled.operator in (None, event.operator)
    if isinstance(event, ev.SagaCancelRequested | ev.SagaCancelRefused):
        return pulled.action == CANCEL and pulled.operator in (None, event.operator)
    if isinstance(event, ev.SagaReleased):
        return pulled.action == RELEASE and pulled.operator in (None, event.operator)
    if isinstance(event, ev.SagaQuarantined):
        return event.message_id == pulled.action_id
    return False


def decided(pulled: Pulled, events: Sequence[ev.Event]) -> LeverDecision | None:
    """The decision of ``pulled`` among the saga's ``events`` after its ``after_seq``; None when none is there."""
    for index, event in enumerate(events):
        if event.seq <= pulled.after_seq or not _answers(pulled, event):
            continue
        if isinstance(event, ev.OperatorActionRefused | ev.SagaCancelRefused):
            return LeverDecision(REFUSED, event.reason, event.seq)
        if isinstance(event, ev.SagaQuarantined):
            return LeverDecision(REFUSED, f"still quarantined: {event.reason}", event.seq)
        followed: list[str] = []
        for later in events[index + 1:]:
            if isinstance(later, _DECISIONS) or len(followed) == FOLLOWED_SHOWN:
                break
            followed.append(type(later).__name__)
        return LeverDecision(APPLIED, None, event.seq, tuple(followed))
    return None


async def decision(reads: Reads, pulled: Pulled) -> LeverDecision:
    """What the orchestrator has decided about ``pulled`` so far."""
    found = decided(pulled, [event for _, event in await reads.events_after(pulled.saga_id, pulled.after_seq)])
    if found is not None:
        return found
    progress = await reads.message_progress(pulled.action_id)
    if progress != "taken":
        return LeverDecision(progress)
    return LeverDecision(REFUSED, await _dead_lettered(reads, pulled))


async def _dead_lettered(reads: Reads, pulled: Pulled) -> str:
    """Why the orchestrator took a lever and recorded nothing: it dead-lettered it."""
    view = await reads.saga(pulled.saga_id)
    state = view.state if view is not None else None
    why = (state.quarantine_reason if state is not None and state.status is SagaStatus.QUARANTINED
           else view.fold_error if view is not None else None)
    if why is None:
        return "dead-lettered: the orchestrator recorded nothing of it (see the dead letters)"
    if pulled.action == RELEASE:
        return (f"dead-lettered: the orchestrator still cannot run the saga ({why}); fix the cause (deploy its "
                "definition), then release it again")
    return f"dead-lettered: the saga is quarantined ({why}); only a release moves it on, once the cause is fixed"


async def await_decision(reads: Reads, pulled: Pulled, wait_s: float, poll_s: float = 0.2) -> LeverDecision:
    """``decision``, looked for again every ``poll_s`` until it is decided or ``wait_s`` passed."""
    deadline = time.monotonic() + wait_s
    while True:
        found = await decision(reads, pulled)
        if found.decided or time.monotonic() >= deadline:
            return found
        await asyncio.sleep(poll_s)
