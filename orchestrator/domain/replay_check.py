"""Would a saga that is running now take its next step the same way on other definitions? The check behind
``saga definitions check``, run before a deploy on the histories of the sagas it would meet.

``changes.diff`` says what a change of a definition may mean for running sagas; this says what it does mean for
one of them. Its **next decision** is what ``decide`` answers to each message the saga can receive next:

- for each step with a forward attempt in flight (RUNNING): its success reply, and its failure reply that is not
  retryable; for each step whose undo is in flight (COMPENSATING): the same two replies to the undo;
- the firing of each timer that is live (``builder.live_timer_ids``) under either definition, so a timer one
  definition arms and the other does not is fired under both;
- ``advance``: what the saga does unprompted, with no message at all (a fresh decision recording whatever its
  state calls for; empty for a consistent history on its own definition). This is the only probe of a saga
  with nothing in flight (paused, waiting for an operator).

The history is folded with the definition each registry gives for the saga's (type, version). The candidate's
fold ignores the fingerprint recorded at the start: that refusal (``ShapeChanged``) is what this check looks
behind, so when the candidate lacks the recorded shape it folds a copy of the history whose SagaStarted carries
the candidate's fingerprint. Two
decisions are the same when their events agree by (type, step) and their commands and withdrawals by (step,
kind), in order; times, attempts' due dates and reasons are not compared. A probe that raises gives its error as
its result.

A saga whose recorded shape lacks a patch of the candidate (``SagaDefinition.patches``) is folded as it is: it
decides for itself whether it takes the patch. A probe at which it takes one (records PatchTaken) is what the
patch is for, not a difference; where it went past the patch, the skip of the patch's steps is not compared.

Verdicts: SAME, TAKES_PATCH (the probes at which it would take a patch, none different otherwise), DIFFERENT
(the first probe whose results differ, with both), WOULD_NOT_FOLD (the candidate lacks the saga's version, or its
history does not fit the candidate's steps), SKIPPED (ended, or never started: nothing is decided for it any
more).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from ...schemas import event_types as ev
from ...schemas.message_types import CommandKind, ResultStatus, StepResult
from .builder import Decision, DecisionBuilder, Timer, TimerKind, live_timer_ids
from .decide import decide
from .definition import DefinitionRegistry, SagaDefinition
from .errors import DomainError, UnknownDefinition
from .messages import IncomingMessage, TimerFired
from .model import SagaState, StepStatus
from .progress import advance
from .state import fold

PROBE_ERROR = "replay-check-probe"
"""The error type of the failure replies the check probes with."""


class Outcome(StrEnum):
    """What one saga's next decision does on the candidate definitions."""

    SAME = "same next decision"
    TAKES_PATCH = "takes a patched path"
    DIFFERENT = "different next decision"
    WOULD_NOT_FOLD = "would not fold"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class ReplayVerdict:
    """The check of one saga: its ``outcome``, and ``detail`` (one line; empty for SAME)."""

    saga_id: str
    outcome: Outcome
    detail: str = ""

    @property
    def failed(self) -> bool:
        """True for an outcome that should stop a deploy."""
        return self.outcome in (Outcome.DIFFERENT, Outcome.WOULD_NOT_FOLD)


Summary = tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]
"""A decision as compared: its events as (type, step), its commands and withdrawals as (step, kind)."""


def check_history(deployed: DefinitionRegistry, candidate: DefinitionRegistry,
                  events: Sequence[ev.Event]) -> ReplayVerdict:
    """The verdict for the saga of ``events`` (its whole history, in seq order) between the ``deployed``
    registry and the ``candidate`` one (see the module docstring). Never raises for a history: a history the
    deployed definitions cannot fold either is WOULD_NOT_FOLD, saying so."""
    if not events:
        return ReplayVerdict("", Outcome.SKIPPED, "no events")
    saga_id = events[0].saga_id
    started = next((event for event in events if isinstance(event, ev.SagaStarted)), None)
    if started is None:
        return ReplayVerdict(saga_id, Outcome.SKIPPED, "never started")
    migrated = next((event for event in reversed(events) if isinstance(event, ev.SagaMigrated)), None)
    version = started.definition_version if migrated is None else migrated.to_version
    where = f"{started.saga_type} v{version}"
    try:
        old_definition = deployed.get(started.saga_type, version)
        old_state = fold(old_definition, events)
    except DomainError as error:
        return ReplayVerdict(saga_id, Outcome.WOULD_NOT_FOLD, f"does not fold on the deployed definitions "
                                                              f"either: {error}")
    if old_state.is_terminal:
        return ReplayVerdict(saga_id, Outcome.SKIPPED, f"ended {old_state.status}")
    try:
        new_definition = candidate.get(started.saga_type, version)
    except UnknownDefinition:
        deployed_versions = ", ".join(f"v{v}" for v in candidate.versions(started.saga_type)) or "none"
        return ReplayVerdict(saga_id, Outcome.WOULD_NOT_FOLD, f"{where} not deployed (candidate has: "
                                                              f"{deployed_versions})")
    if new_definition.lacking(old_state.definition_fingerprint) is None:
        events = _restamped(events, migrated or started, new_definition)
    try:
        new_state = fold(new_definition, events)
    except DomainError as error:
        return ReplayVerdict(saga_id, Outcome.WOULD_NOT_FOLD, f"{type(error).__name__}: {error}")
    patched: list[str] = []
    passed = passed_by(new_definition, new_state)
    for probe, message in probes(old_definition, old_state, new_definition, new_state):
        before = _outcome(old_definition, old_state, message)
        after = _outcome(new_definition, new_state, message, passed)
        if isinstance(after, tuple) and any(name == ev.PatchTaken.__name__ for name, _ in after[0]):
            patched.append(f"{probe}: candidate {_text(after)}")
        elif before != after:
            return ReplayVerdict(saga_id, Outcome.DIFFERENT,
                                 f"{probe}: deployed {_text(before)}; candidate {_text(after)}")
    if patched:
        return ReplayVerdict(saga_id, Outcome.TAKES_PATCH, "; ".join(patched))
    return ReplayVerdict(saga_id, Outcome.SAME)


def passed_by(definition: SagaDefinition, state: SagaState) -> frozenset[str]:
    """The steps of the patches ``state``'s shape lacks: a saga that goes past them skips them, which keeps its
    path, so the check does not count those skips as a difference."""
    lacking = definition.lacking(state.definition_fingerprint) or frozenset()
    return frozenset(name for patch in lacking for name in definition.patch_steps(patch))


def _restamped(events: Sequence[ev.Event], pinned: ev.SagaStarted | ev.SagaMigrated,
               definition: SagaDefinition) -> list[ev.Event]:
    """``events`` with the event that pins the saga's shape (its SagaStarted, or its last SagaMigrated) carrying
    ``definition``'s fingerprint (the events are not changed)."""
    stamped: ev.Event = (dataclasses.replace(pinned, definition_fingerprint=definition.fingerprint)
                         if isinstance(pinned, ev.SagaStarted)
                         else dataclasses.replace(pinned, to_fingerprint=definition.fingerprint))
    return [stamped if event is pinned else event for event in events]


Probe = tuple[str, IncomingMessage | None]
"""A probe's name and its message; None for ``advance``, a decision without a message."""


def probes(old_definition: SagaDefinition, old_state: SagaState, new_definition: SagaDefinition,
           new_state: SagaState) -> list[Probe]:
    """Every message the saga can receive next (module docstring), ``advance`` first, in a fixed order."""
    found: list[Probe] = [("advance", None)]
    for step in old_state.steps.values():
        if step.status is StepStatus.RUNNING:
            kind, key, attempt = CommandKind.FORWARD, step.idempotency_key, step.attempt
        elif step.status is StepStatus.COMPENSATING:
            kind, key, attempt = CommandKind.COMPENSATE, step.compensation_key, step.compensation_attempt
        else:
            continue
        what = "" if kind is CommandKind.FORWARD else " undo"
        for status in (ResultStatus.SUCCEEDED, ResultStatus.FAILED):
            failed = status is ResultStatus.FAILED
            reply = StepResult(saga_id=old_state.saga_id, step=step.name, kind=kind, idempotency_key=key,
                               attempt=attempt, status=status, retryable=False,
                               error_type=PROBE_ERROR if failed else None,
                               error_message="a failure that is not retried" if failed else None)
            found.append((f"{'failure' if failed else 'success'} of {step.name}{what} attempt {attempt}", reply))
    live = live_timer_ids(old_definition, old_state) | live_timer_ids(new_definition, new_state)
    for timer_id in sorted(live):
        kind_text, _, rest = timer_id.partition(":")
        name, _, attempt_text = rest.rpartition(":")
        timer = Timer(saga_id=old_state.saga_id, kind=TimerKind(kind_text), step=name, attempt=int(attempt_text),
                      due_at=old_state.updated_at)
        found.append((f"timer {timer_id} firing", TimerFired(timer=timer)))
    return found


def _decided(definition: SagaDefinition, state: SagaState, message: IncomingMessage | None) -> Decision:
    if message is not None:
        return decide(definition, state, message, state.updated_at)
    b = DecisionBuilder(definition, state, state.updated_at, state.saga_id)
    advance(b)
    return b.build()


def summary(decision: Decision) -> Summary:
    """What of ``decision`` the check compares: its events and what it sends, each as a sorted multiset, since
    what one decision records and sends for several steps at once (two undos, two ready steps) happens together,
    in an order the declaration order of the steps sets and nothing depends on."""
    events = tuple(sorted((type(event).__name__, str(getattr(event, "step", "") or "")) for event in decision.events))
    commands = [(command.step, str(command.kind)) for command in decision.commands]
    withdrawals = [(withdrawal.step, "WITHDRAW") for withdrawal in decision.withdrawals]
    return events, tuple(sorted(commands + withdrawals))


def _outcome(definition: SagaDefinition, state: SagaState, message: IncomingMessage | None,
             passed: frozenset[str] = frozenset()) -> Summary | str:
    try:
        events, commands = summary(_decided(definition, state, message))
    except DomainError as error:
        return f"{type(error).__name__}: {error}"
    skipped = ev.StepSkipped.__name__
    return tuple(event for event in events if event[0] != skipped or event[1] not in passed), commands


def _text(result: Summary | str) -> str:
    if isinstance(result, str):
        return f"raises {result}"
    events, commands = result
    if not events and not commands:
        return "does nothing"
    shown = [f"{name}({step})" if step else name for name, step in events]
    shown += [f"{kind} {step}" for step, kind in commands]
    return ", ".join(shown)
