"""The fault matrix of a saga: one case per step failing for good, per step answering only after its timeout,
per step in flight when the saga is cancelled, per step in flight when its deadline passes, and one with every
message delivered twice; each with the outcome and the compensations it must have.

    for case in fault_matrix(checkout):
        result = await case.run(app, Order(...))        # an environment of its own, scripted; checked

What each case expects is worked out from the definition alone, not from the engine (``expect_failure``): the
orchestrator dispatches a step once the steps it depends on succeeded, in the definition's order, and hears
the answers in the order it sent the commands. When a step before the pivot fails for good, dispatching stops;
every step that took effect by then, or whose answer was still on its way, is undone by its compensation,
dependents before the steps they depend on, and the saga ends COMPENSATED (nothing undone: it turned back
before anything needed undoing). A step after the pivot that fails for good ends the saga FAILED with nothing
undone: past the pivot a saga only moves forward.

A step whose answer comes only after its timeout (its effect applied) is waited for, never sent again, and the
saga completes with every effect held once, unless the saga's deadline passes before that answer brings it past
its pivot (to its end, without one): then it turns back, and every step that took effect is undone, the one that
was late too; one without an undo that took effect ends the saga FAILED, for a human.

The turn-back fence, at each step: the step's participant is stopped, so its command waits unread, and the saga
is cancelled (or its deadline passes) while it waits. Before the pivot the saga ends CANCELLED, every step that
took effect undone, and the waiting command never runs (withdrawn before its participant picked it up); a
pivot without undo is withdrawn first and, had it not run, the saga turns back too. After the pivot a cancel is
refused and the deadline no longer applies: the saga completes once the participant is back. In every case no
forward command is sent after the turn-back.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from ..authoring import Saga, SagaApp
from ..orchestrator.domain.definition import FailureMode, SagaDefinition
from ..schemas import event_types as ev
from .behaviour import Behaviour, fail, time_out
from .environment import SagaEnvironment, SagaResult

__all__ = ["FaultCase", "expect_failure", "expect_timeout", "expect_turn_back", "fault_matrix"]

FAULT_CASE_ID = "fault-case"  # the saga id of every case (its retry backoffs' jitter comes from it)
TURNED_BACK = (ev.SagaCompensationStarted, ev.SagaCancelRequested)


@dataclass(frozen=True)
class FaultCase:
    """One fault and what the saga must then do.

    ``stopped``: a step whose participant is stopped before the saga starts (its command waits unread) and
    started again after the ``turn_back`` (``cancel``, or ``deadline``: past the saga's deadline), when given."""

    name: str
    scripts: Mapping[tuple[str, str], Behaviour]
    duplicate_messages: bool
    status: str
    compensated: frozenset[str]  # the steps undone
    undone_before: tuple[tuple[str, str], ...] = ()  # (dependent, its upstream): the first undone first
    waited_for: frozenset[str] = field(default_factory=frozenset)  # steps answered late: one attempt, never resent
    stopped: str | None = None
    turn_back: str | None = None  # "cancel" | "deadline"
    no_effect: frozenset[str] = field(default_factory=frozenset)  # steps that must not have taken effect

    async def run(self, deployment: Saga | SagaDefinition | SagaApp, saga_input: BaseModel | Mapping[str, Any],
                  saga_type: str | None = None) -> SagaResult:
        """Run the case in an environment of its own and check it (an AssertionError says what differed)."""
        environment = SagaEnvironment(deployment, duplicate_messages=self.duplicate_messages)
        for action, behaviour in self.scripts.items():
            environment.script(action, behaviour)
        if saga_type is None:
            types = environment.definitions.types()
            if len(types) != 1:
                raise ValueError(f"name the saga type to start: the deployment runs {', '.join(types)}")
            saga_type = types[0]
        definition = environment.definitions.latest(saga_type)
        assert definition is not None
        participant = None if self.stopped is None else definition.step(self.stopped).participant
        if participant is not None:
            environment.stop(participant)
        saga_id = await environment.start(saga_type, saga_input, saga_id=FAULT_CASE_ID)
        if self.turn_back == "cancel":
            await environment.cancel(saga_id, "the fault matrix cancels it")
        elif self.turn_back == "deadline":
            assert definition.deadline_ms is not None
            await environment.advance(milliseconds=definition.deadline_ms + 1)
        if participant is not None:
            await environment.start_participant(participant)
        result = await environment.result(saga_id)
        self.check(result)
        return result

    def check(self, result: SagaResult) -> None:
        """Assert that ``result`` is what this case expects."""
        where = f"{self.name}: "
        assert result.status == self.status, f"{where}ended {result.status}, expected {self.status}"
        assert frozenset(result.compensated) == self.compensated and len(result.compensated) == len(
            self.compensated), f"{where}undid {result.compensated}, expected {sorted(self.compensated)}"
        order = result.compensated
        for dependent, upstream in self.undone_before:
            assert order.index(dependent) < order.index(upstream), (
                f"{where}undid {upstream} before its dependent {dependent}: {order}")
        for step, (done, undone) in result.effects.items():
            assert done <= 1, f"{where}{step} took effect {done} times"
            assert undone == (1 if step in self.compensated else 0), f"{where}{step} was undone {undone} times"
        for step in self.waited_for:
            assert result.attempts(step) == 1, f"{where}{step} took {result.attempts(step)} attempts, expected 1"
        for step in self.no_effect:
            assert result.effects.get(step, (0, 0))[0] == 0, f"{where}{step} took effect after the saga turned back"
        turned = next((index for index, event in enumerate(result.events) if isinstance(event, TURNED_BACK)), None)
        if turned is not None:
            late = [event for event in result.events[turned:] if isinstance(event, ev.StepCommandSent)]
            assert not late, f"{where}sent {[(e.step, e.attempt) for e in late]} forward after the saga turned back"

    def __repr__(self) -> str:
        return f"<fault case {self.name}>"


def fault_matrix(saga: Saga | SagaDefinition) -> list[FaultCase]:
    """The fault cases of a saga type (see the module); a FAIL_FAST one (the default)."""
    return list(_cases(saga))


def _cases(saga: Saga | SagaDefinition) -> Iterator[FaultCase]:
    definition = saga.definition if isinstance(saga, Saga) else saga
    if definition.failure_mode is not FailureMode.FAIL_FAST:
        raise ValueError(f"saga {definition.saga_type!r} runs in {definition.failure_mode} mode: the fault matrix "
                         "works out FAIL_FAST sagas")
    for name in definition.order:
        step = definition.step(name)
        status, undone, before = expect_failure(definition, name)
        yield FaultCase(f"{name} fails for good", {(step.participant, step.command): fail("Scripted")}, False,
                        status, undone, before)
    for name in definition.order:
        step = definition.step(name)
        status, undone, before = expect_timeout(definition, name)
        yield FaultCase(f"{name} answers after its timeout, its effect applied",
                        {(step.participant, step.command): time_out(effect=True)}, False, status, undone, before,
                        waited_for=frozenset({name}) if status == "COMPLETED" else frozenset())
    for turn_back in ("cancel", "deadline"):
        if turn_back == "deadline" and definition.deadline_ms is None:
            continue
        for name in definition.order:
            status, undone, before = expect_turn_back(definition, name, turn_back)
            yield FaultCase(f"{turn_back} while {name} waits for its participant", {}, False, status, undone, before,
                            stopped=name, turn_back=turn_back,
                            no_effect=frozenset({name}) if status == "CANCELLED" else frozenset())
    yield FaultCase("every message delivered twice", {}, True, "COMPLETED", frozenset())


def expect_turn_back(definition: SagaDefinition, waiting: str, turn_back: str = "cancel"
                     ) -> tuple[str, frozenset[str], tuple[tuple[str, str], ...]]:
    """What the saga must do when it is cancelled (``turn_back`` "cancel") or its deadline passes ("deadline") while
    ``waiting``'s command waits unread at its stopped participant, every other step succeeding at once: past the
    pivot it completes once the participant is back, and so it does when a cancel meets a pivot without undo in
    flight (refused: the pivot may go through); before it, it ends CANCELLED, the waiting command withdrawn before
    it ran and every step that took effect undone."""
    pivot = definition.pivot
    if pivot is not None and waiting in definition.downstream(pivot.name):
        return "COMPLETED", frozenset(), ()
    if pivot is not None and waiting == pivot.name and pivot.compensation is None and turn_back == "cancel":
        return "COMPLETED", frozenset(), ()
    effected = set(definition.order) - definition.downstream(waiting) - {waiting}
    undone = frozenset(name for name in effected if definition.step(name).compensation is not None)
    return "CANCELLED", undone, _undo_order(definition, undone)


def expect_timeout(definition: SagaDefinition, late: str
                   ) -> tuple[str, frozenset[str], tuple[tuple[str, str], ...]]:
    """What the saga must do when ``late`` answers only after its timeout (its effect applied), every other step
    succeeding at once: COMPLETED, unless the deadline passes before that answer brings the saga past its pivot
    (to its end, without one); then it turns back with every step that took effect undone, ending CANCELLED, or
    FAILED when one without an undo had taken effect (a pivot without undo decides instead: it went through, so the
    saga completes)."""
    step = definition.step(late)
    pivot = definition.pivot
    holds_up = pivot is None or late == pivot.name or late in definition.upstream(pivot.name)
    answered_at = step.timeout_ms + 1  # sent at once, answered just after its timeout
    if definition.deadline_ms is None or not holds_up or answered_at <= definition.deadline_ms:
        return "COMPLETED", frozenset(), ()
    if pivot is not None and late == pivot.name and pivot.compensation is None:
        return "COMPLETED", frozenset(), ()  # withdrawn at the deadline, it had run: past the pivot, on it goes
    # It took effect, and so did every step it does not hold up (they succeed at once).
    effected = set(definition.order) - definition.downstream(late)
    undone = frozenset(name for name in effected if definition.step(name).compensation is not None)
    status = "CANCELLED" if definition.step(late).compensation is not None else "FAILED"
    return status, undone, _undo_order(definition, undone)


def expect_failure(definition: SagaDefinition, failing: str) -> tuple[str, frozenset[str], tuple[tuple[str, str], ...]]:
    """What the saga must do when ``failing`` fails for good, every other step succeeding at once: its status, the
    steps undone, and the (dependent, upstream) pairs whose undoing must come in that order."""
    pivot = definition.pivot
    if pivot is not None and failing in definition.downstream(pivot.name):
        return "FAILED", frozenset(), ()
    dispatched: list[str] = []
    effected: set[str] = set()
    stopped = False

    def dispatch() -> None:
        for name in definition.order:
            step = definition.step(name)
            if name not in dispatched and set(step.depends_on) <= effected:
                dispatched.append(name)

    dispatch()
    answered = 0
    while answered < len(dispatched):  # the answers come in the order the commands went out
        name = dispatched[answered]
        answered += 1
        if name == failing:
            stopped = True
            continue
        effected.add(name)
        if not stopped:
            dispatch()
    undone = frozenset(name for name in effected if definition.step(name).compensation is not None)
    return "COMPENSATED", undone, _undo_order(definition, undone)


def _undo_order(definition: SagaDefinition, undone: frozenset[str]) -> tuple[tuple[str, str], ...]:
    """The (dependent, upstream) pairs of ``undone`` whose undoing must come in that order."""
    return tuple((dependent, upstream) for upstream in sorted(undone) for dependent in sorted(undone)
                 if dependent in definition.downstream(upstream))

