"""The invariants ``saga verify`` checks, as pure functions of a saga's folded state and its effect counts.

Where each step's effect shows is derived, never written by hand: a step's participant declares which count of
its effect table each action adds to (``participants.kit.effects.EffectTable``), so the step's command gives
the count of its effect and its compensation the count of its undoing (``step_effects``). How a saga ended then
says what each step's effect must be now (``STATUS_EXPECTATIONS``): held exactly once, undone (no net effect),
absent, or left as it is. A step whose participant declares no effect for its command is not checked here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import NoReturn

from .domain.definition import SagaDefinition
from .domain.model import trouble
from .domain.state import SagaState, SagaStatus, StepStatus
from .ports import SagaSummaryRow

EffectCounts = Mapping[str, Mapping[str, int]]
"""participant → count name → value, e.g. {"flight": {"booked": 1, "cancelled": 0}}."""

DeclaredEffects = Mapping[str, Mapping[str, str]]
"""participant → action → the count its effect adds to, as the participants declare them."""


@dataclass(frozen=True)
class StepEffect:
    """Where one step's effect shows: ``done`` counts it, ``undone`` its undoing (None: cannot be undone)."""

    participant: str
    done: str
    undone: str | None = None


def step_effects(definition: SagaDefinition, declared: DeclaredEffects) -> dict[str, StepEffect]:
    """Step name → where its effect shows, for every step whose command has a declared effect."""
    found = {}
    for step in definition.steps:
        actions = declared.get(step.participant, {})
        done = actions.get(step.command)
        if done is not None:
            undone = actions.get(step.compensation) if step.compensation is not None else None
            found[step.name] = StepEffect(step.participant, done, undone)
    return found


class Expect(StrEnum):
    """What a step's effect must be in a finished saga."""

    HELD = "hold its effect exactly once"  # done == 1, undone == 0
    UNDONE = "have no net effect"  # done == undone <= 1 (or done == 0 when it cannot be undone)
    ABSENT = "have no effect"  # done == 0
    AS_IS = "have at most one effect"  # done <= 1: only a double effect is wrong


Expectation = Callable[[SagaState, str, StepEffect], Expect]


def _by_step_status(state: SagaState, step: str, effect: StepEffect) -> Expect:
    """What the fold says about the step alone: succeeded holds, compensated is undone, never ran is absent."""
    status = state.steps[step].status
    if state.steps[step].waived:
        return Expect.AS_IS  # an operator skipped it after it was sent: it may or may not have taken effect
    if status is StepStatus.SUCCEEDED:
        return Expect.HELD
    if status in (StepStatus.PENDING, StepStatus.SKIPPED):
        return Expect.ABSENT
    if status is StepStatus.COMPENSATED:
        return Expect.UNDONE
    return Expect.AS_IS


def _completed(state: SagaState, step: str, effect: StepEffect) -> Expect:
    if state.steps[step].waived:
        return Expect.AS_IS
    return Expect.ABSENT if state.steps[step].status is StepStatus.SKIPPED else Expect.HELD


def _unwound(state: SagaState, step: str, effect: StepEffect) -> Expect:
    """A saga that turned back (COMPENSATED, CANCELLED): every undoable effect is undone. A step without an undo
    holds its effect only when its success was recorded; any other has none: once the saga turned back no
    forward command may take effect (the fence), so one that did and is not in the history is a violation."""
    if effect.undone is not None:
        return Expect.UNDONE
    state_of = state.steps[step]
    if state_of.waived or (state_of.status is StepStatus.FAILED and state_of.outcome_unknown):
        return Expect.AS_IS  # skipped by an operator, or given up with its outcome unknown
    return Expect.HELD if state_of.status is StepStatus.SUCCEEDED else Expect.ABSENT


def _failed(state: SagaState, step: str, effect: StepEffect) -> Expect:
    # A saga that turned back and ended FAILED (a step without undo took effect after the turn-back, recorded) is
    # held to the unwinding; one that failed after its pivot only moved forward, so each step keeps what the fold
    # says it did.
    turned_back = not state.pivot_passed or any(s.landed_late for s in state.steps.values())
    return _unwound(state, step, effect) if turned_back else _by_step_status(state, step, effect)


def _compensation_failed(state: SagaState, step: str, effect: StepEffect) -> Expect:
    if step == state.compensation_failed_step:
        return Expect.HELD  # its undoing was refused: the effect is still there, waiting for a human
    if effect.undone is not None and state.steps[step].status is StepStatus.SUCCEEDED:
        return Expect.HELD  # the unwinding stopped before it reached this step
    return _unwound(state, step, effect)


def _as_is(state: SagaState, step: str, effect: StepEffect) -> Expect:
    return Expect.AS_IS


def _absent(state: SagaState, step: str, effect: StepEffect) -> Expect:
    return Expect.ABSENT


STATUS_EXPECTATIONS: Mapping[SagaStatus, Expectation] = {
    SagaStatus.COMPLETED: _completed,
    SagaStatus.COMPENSATED: _unwound,
    SagaStatus.CANCELLED: _unwound,
    SagaStatus.FAILED: _failed,
    SagaStatus.COMPENSATION_FAILED: _compensation_failed,
    SagaStatus.COMPLETED_WITH_FAILURES: _as_is,  # reported as it is
    SagaStatus.TERMINATED: _as_is,  # settled by hand: whatever its steps left is the operator's to answer for
    SagaStatus.REJECTED: _absent,  # never started
    SagaStatus.RUNNING: _as_is,
    SagaStatus.COMPENSATING: _as_is,
}

def _meets(expect: Expect, done: int, undone: int, undoable: bool) -> bool:
    if expect is Expect.HELD:
        return done == 1 and undone == 0
    if expect is Expect.UNDONE:
        return done == undone <= 1 if undoable else done == 0
    if expect is Expect.ABSENT:
        return done == 0 and undone == 0
    return done <= 1 and undone <= done


def effect_problems(state: SagaState, counts: EffectCounts, effects: Mapping[str, StepEffect]) -> list[str]:
    """Every step whose effect (``effects``: by step, from ``step_effects``) does not match how the saga
    ended."""
    expectation = STATUS_EXPECTATIONS.get(state.status)
    if expectation is None:
        return []
    problems = []
    for step, effect in effects.items():
        expect = Expect.ABSENT if step not in state.steps else expectation(state, step, effect)
        found = counts.get(effect.participant, {})
        done = found.get(effect.done, 0)
        undone = found.get(effect.undone, 0) if effect.undone else 0
        if not _meets(expect, done, undone, effect.undone is not None):
            shown = f"{effect.done}={done}" + (f", {effect.undone}={undone}" if effect.undone else "")
            problems.append(f"{step} ({effect.participant}: {shown}): a {state.status.value} saga must "
                            f"{expect.value} here")
    return problems


def summary_problems(state: SagaState, summary: SagaSummaryRow | None) -> list[str]:
    """Where the saga_summary read model disagrees with the fold of the saga's events."""
    if summary is None:
        return ["no saga_summary row"]
    stuck = trouble(state)
    expected = {
        "saga_type": state.saga_type, "status": state.status.value, "last_seq": state.last_seq,
        "failed_step": state.failed_step or state.compensation_failed_step, "reason": state.reason,
        "current_step": None if stuck is None else stuck.step, "step_failures": 0 if stuck is None else stuck.failures,
        "last_error": None if stuck is None else stuck.error,
    }
    return [f"saga_summary.{name} is {getattr(summary, name)!r}, the events say {value!r}"
            for name, value in expected.items() if getattr(summary, name) != value]


@dataclass(frozen=True)
class PendingTimer:
    """A durable timer still waiting in saga.timers."""

    kind: str
    step: str
    attempt: int
    due_at_ms: int


def why_not_terminal(state: SagaState, last_event: str, timers: list[PendingTimer],
                     outbox_rows: Mapping[str, int], now_ms: int) -> str:
    """A one-line explanation of where a saga that has not ended is waiting."""
    parts = [f"last event {last_event} (seq {state.last_seq}, {(now_ms - state.updated_at) / 1000:.1f}s ago)"]
    if state.status is SagaStatus.QUARANTINED:
        parts.insert(0, f"quarantined ({state.quarantine_reason}): release it with `saga release {state.saga_id}` "
                        "once the cause is fixed")
    if timers:
        parts.append("timers: " + ", ".join(
            f"{t.kind} {t.step}#{t.attempt} due in {(t.due_at_ms - now_ms) / 1000:.1f}s" for t in timers))
    else:
        parts.append("no pending timer")
    rows = {table: n for table, n in outbox_rows.items() if n}
    parts.append("outbox rows: " + (", ".join(f"{t} {n}" for t, n in sorted(rows.items())) if rows else "none"))
    running = [s.name for s in state.steps.values()
               if s.status not in (StepStatus.PENDING, StepStatus.SUCCEEDED, StepStatus.SKIPPED,
                                   StepStatus.COMPENSATED, StepStatus.FAILED)]
    if running:
        parts.append("waiting on: " + ", ".join(f"{n} {state.steps[n].status.value}" for n in running))
    return "; ".join(parts)


REPLACED_IN_02 = {
    name: "declare where each participant's effects show instead: participant(..., effects=EffectTable(...)) and "
          "effect= on its actions, or Participant(effects=...) written by hand; saga verify reads those "
          "(docs/upgrading.md)"
    for name in ("EffectRules", "register_rules", "EffectReader", "DuplicateReader")
}
"""Names a 0.1 saga package imported from here that 0.2 replaced: what to write now."""


def __getattr__(name: str) -> NoReturn:
    if name in REPLACED_IN_02:
        raise ImportError(f"{__name__}.{name} was removed in 0.2: {REPLACED_IN_02[name]}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
