"""The fault matrix of a saga: one case per step failing for good, per step timing out with its effect applied,
and one with every message delivered twice, each with the outcome and the compensations it must have.

    for case in fault_matrix(checkout):
        result = await case.run(app, Order(...))        # an environment of its own, scripted; checked

What each case expects is worked out from the definition alone, not from the engine (``expect_failure``): the
orchestrator dispatches a step once the steps it depends on succeeded, in the definition's order, and hears
the answers in the order it sent the commands. When a step before the pivot fails for good, dispatching stops;
every step that took effect by then, or whose answer was still on its way, is undone by its compensation,
dependents before the steps they depend on, and the saga ends COMPENSATED (FAILED when nothing was undone). A
step after the pivot that fails for good ends the saga FAILED with nothing undone: past the pivot a saga only
moves forward. A step that times out once with its effect applied is retried under the same key, answered from
the participant's record, and the saga completes with every effect held once, unless the saga's deadline
passes before that retry brings it past its pivot (to its end, without one): then it is cancelled, and every
step that took effect is undone, the one that timed out too. A saga whose every message arrives twice
completes with every effect held once.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from ..orchestrator.authoring import Saga, SagaApp
from ..orchestrator.domain.definition import FailureMode, SagaDefinition
from .behaviour import Behaviour, fail, time_out
from .environment import SagaEnvironment, SagaResult

__all__ = ["FaultCase", "expect_failure", "expect_timeout", "fault_matrix"]

FAULT_CASE_ID = "fault-case"  # the saga id of every case (its retry backoffs' jitter comes from it)


@dataclass(frozen=True)
class FaultCase:
    """One fault and what the saga must then do."""

    name: str
    scripts: Mapping[tuple[str, str], Behaviour]
    duplicate_messages: bool
    status: str
    compensated: frozenset[str]  # the steps undone
    undone_before: tuple[tuple[str, str], ...] = ()  # (dependent, its upstream): the first undone first
    retried: frozenset[str] = field(default_factory=frozenset)  # steps that take a second attempt

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
        result = await environment.result(await environment.start(saga_type, saga_input, saga_id=FAULT_CASE_ID))
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
        for step in self.retried:
            assert result.attempts(step) == 2, f"{where}{step} took {result.attempts(step)} attempts, expected 2"

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
        yield FaultCase(f"{name} times out once, its effect applied",
                        {(step.participant, step.command): time_out(effect=True)}, False, status, undone, before,
                        retried=frozenset({name}) if status == "COMPLETED" else frozenset())
    yield FaultCase("every message delivered twice", {}, True, "COMPLETED", frozenset())


def expect_timeout(definition: SagaDefinition, timing_out: str
                   ) -> tuple[str, frozenset[str], tuple[tuple[str, str], ...]]:
    """What the saga must do when ``timing_out`` times out once with its effect applied, every other step
    succeeding at once: COMPLETED, unless the deadline passes before the retry brings the saga past its pivot
    (to its end, without one); then CANCELLED, with every step that took effect undone."""
    step = definition.step(timing_out)
    pivot = definition.pivot
    holds_up = pivot is None or timing_out == pivot.name or timing_out in definition.upstream(pivot.name)
    retried_at = step.timeout_ms + step.retry.backoff_ms(1, f"{FAULT_CASE_ID}:{timing_out}:1")
    if definition.deadline_ms is None or not holds_up or retried_at < definition.deadline_ms:
        return "COMPLETED", frozenset(), ()
    # It took effect, and so did every step it does not hold up (they succeed at once).
    effected = set(definition.order) - definition.downstream(timing_out)
    undone = frozenset(name for name in effected if definition.step(name).compensation is not None)
    return "CANCELLED", undone, _undo_order(definition, undone)


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
    return ("COMPENSATED" if undone else "FAILED"), undone, _undo_order(definition, undone)


def _undo_order(definition: SagaDefinition, undone: frozenset[str]) -> tuple[tuple[str, str], ...]:
    """The (dependent, upstream) pairs of ``undone`` whose undoing must come in that order."""
    return tuple((dependent, upstream) for upstream in sorted(undone) for dependent in sorted(undone)
                 if dependent in definition.downstream(upstream))
