"""A saga's history, message by message, through the pure core: feed messages to ``decide``, keep the events,
fold again; no store, no clock but the one you move.

Every step checks the core's own promises: events get consecutive seqs, ``Decision.state`` equals the fold of
the whole history, and commands/timers match the *Sent / *Scheduled events (an AssertionError names which).
For a whole saga with its participants scripted, see ``saga_orchestrator.testing.environment``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..orchestrator.domain.builder import Timer, TimerKind
from ..orchestrator.domain.decide import Decision, decide
from ..orchestrator.domain.definition import SagaDefinition
from ..orchestrator.domain.messages import IncomingMessage, TimerFired
from ..orchestrator.domain.state import SagaState, SagaStatus, fold
from ..schemas import event_types as ev
from ..schemas.ids import compensation_key, forward_key
from ..schemas.message_types import (
    CancelSaga,
    CommandKind,
    Lever,
    OperateSaga,
    ReleaseSaga,
    ResultStatus,
    ResumeCompensation,
    SignalSaga,
    StartSaga,
    StepCommand,
    StepResult,
    WithdrawStep,
)

T0 = 1_000_000


@dataclass
class SagaRun:
    """One saga driven message by message."""

    definition: SagaDefinition | None
    saga_id: str = "s1"
    now: int = T0
    events: list[ev.Event] = field(default_factory=list)
    armed: dict[str, Timer] = field(default_factory=dict)  # timer_id -> timer
    sent: list[StepCommand] = field(default_factory=list)
    withdrawn: list[WithdrawStep] = field(default_factory=list)

    _state: SagaState | None = None  # the state after ``events``, checked against a full fold each time

    @property
    def state(self) -> SagaState | None:
        return self._state

    @property
    def saga(self) -> SagaState:
        state = self.state
        assert state is not None
        return state

    def status(self) -> SagaStatus:
        """The saga's status now (a call, so that a type checker does not keep an earlier assertion's)."""
        return self.saga.status

    def send(self, message: IncomingMessage, *, at: int | None = None) -> Decision:
        if at is not None:
            self.now = at
        return self.take(decide(self.definition, self.state, message, self.now))

    def take(self, decision: Decision) -> Decision:
        """Keep what ``decision`` (made now, of the current state) recorded, checking the core's promises."""
        first_seq = (self.events[-1].seq if self.events else 0) + 1
        assert [e.seq for e in decision.events] == list(range(first_seq, first_seq + len(decision.events)))
        assert all(e.occurred_at == self.now for e in decision.events)
        self.events.extend(decision.events)
        if decision.events:
            assert decision.state == fold(self.definition, self.events)
            self._state = decision.state
        sent_events = [e for e in decision.events if isinstance(e, ev.StepCommandSent | ev.CompensationSent)]
        assert [c.message_id for c in decision.commands] == [e.message_id for e in sent_events]
        withdrawn = [e for e in decision.events if isinstance(e, ev.StepWithdrawn)]
        assert [w.message_id for w in decision.withdrawals] == [e.message_id for e in withdrawn]
        for timer_id in decision.obsolete_timers:
            self.armed.pop(timer_id, None)
        for timer in decision.timers:
            self.armed[timer.timer_id] = timer
        self.sent.extend(decision.commands)
        self.withdrawn.extend(decision.withdrawals)
        return decision

    # --- messages -------------------------------------------------------------------------------------
    def start(self, saga_type: str | None = None, payload: bytes = b"input") -> Decision:
        if saga_type is None:
            assert self.definition is not None
            saga_type = self.definition.saga_type
        return self.send(StartSaga(saga_id=self.saga_id, saga_type=saga_type, tenant_id="t1", input=payload))

    def reply(
        self,
        step: str,
        kind: CommandKind,
        status: ResultStatus,
        attempt: int | None = None,
        **fields: object,
    ) -> Decision:
        if attempt is None:
            current = self.saga.steps[step]
            attempt = current.attempt if kind is CommandKind.FORWARD else current.compensation_attempt
        key = (forward_key if kind is CommandKind.FORWARD else compensation_key)(self.saga_id, step)
        result = StepResult(
            saga_id=self.saga_id,
            step=step,
            kind=kind,
            idempotency_key=key,
            attempt=attempt,
            status=status,
            **fields,  # type: ignore[arg-type]
        )
        return self.send(result)

    def ok(self, step: str, attempt: int | None = None) -> Decision:
        return self.reply(step, CommandKind.FORWARD, ResultStatus.SUCCEEDED, attempt)

    def fail(
        self, step: str, error: str = "Boom", retryable: bool = False, attempt: int | None = None
    ) -> Decision:
        return self.reply(
            step,
            CommandKind.FORWARD,
            ResultStatus.FAILED,
            attempt,
            error_type=error,
            retryable=retryable,
            error_message=f"{step} said {error}",
        )

    def comp_ok(self, step: str, attempt: int | None = None) -> Decision:
        return self.reply(step, CommandKind.COMPENSATE, ResultStatus.SUCCEEDED, attempt)

    def comp_fail(
        self, step: str, error: str = "Boom", retryable: bool = False, attempt: int | None = None
    ) -> Decision:
        return self.reply(
            step,
            CommandKind.COMPENSATE,
            ResultStatus.FAILED,
            attempt,
            error_type=error,
            retryable=retryable,
            error_message=f"{step} said {error}",
        )

    def fire(self, kind: TimerKind, step: str, attempt: int | None = None) -> Decision:
        """Fire the armed timer of that kind and step (or a made-up one for an explicit attempt)."""
        if attempt is None:
            matches = [t for t in self.armed.values() if t.kind is kind and t.step == step]
            assert len(matches) == 1, f"armed {kind} timers for {step}: {matches}"
            timer = matches[0]
        else:
            timer = Timer(saga_id=self.saga_id, kind=kind, step=step, attempt=attempt, due_at=self.now)
        self.armed.pop(timer.timer_id, None)
        return self.send(TimerFired(timer=timer), at=max(self.now, timer.due_at))

    def cancel(self, reason: str = "customer changed plans") -> Decision:
        return self.send(CancelSaga(saga_id=self.saga_id, reason=reason))

    def resume(self) -> Decision:
        return self.send(ResumeCompensation(saga_id=self.saga_id, operator="ops", detail="fixed by hand"))

    def release(self) -> Decision:
        return self.send(ReleaseSaga(saga_id=self.saga_id, operator="ops", detail="deployed the fix"))

    def signal(self, signal: str, payload: bytes = b"signal", signal_id: str | None = None) -> Decision:
        """Send a SignalSaga (``signal_id``: default one new per call)."""
        return self.send(SignalSaga(saga_id=self.saga_id, signal_id=signal_id or f"sig-{len(self.events)}",
                                    signal=signal, payload=payload, sender="ops"))

    def operate(self, action: str, step: str | None = None, reason: str | None = "asked by support") -> Decision:
        """Pull an operator's lever (OperateSaga) as operator ``ops``."""
        return self.send(OperateSaga(saga_id=self.saga_id, action=action, step=step, operator="ops", reason=reason))

    def migrate(self, target: SagaDefinition | None, version: int | None = None,
                reason: str | None = "asked by support") -> Decision:
        """Pull Migrate to ``version`` (default ``target.version``) as operator ``ops``, ``target`` being what the
        orchestrator's registry holds for it (None: nothing); once it applied, the run goes on by ``target``."""
        version = version if version is not None or target is None else target.version
        message = OperateSaga(saga_id=self.saga_id, action=Lever.MIGRATE, step=None, operator="ops", reason=reason,
                              definition_version=version)
        decision = decide(self.definition, self.state, message, self.now, target)
        if any(isinstance(event, ev.SagaMigrated) for event in decision.events):
            self.definition = target
        return self.take(decision)


Action = Callable[[SagaRun], Decision]


def describe(event: ev.Event) -> str:
    """A compact, readable form of an event for table-driven expectations."""
    parts = [type(event).__name__]
    step = getattr(event, "step", None)
    if step is not None:
        parts.append(step)
    attempt = getattr(event, "attempt", None)
    if attempt is not None:
        parts.append(str(attempt))
    return " ".join(parts)


def describe_command(command: StepCommand | WithdrawStep) -> str:
    kind = "WITHDRAW" if isinstance(command, WithdrawStep) else command.kind
    return f"{command.participant}.{command.action} {kind} {command.attempt}"


def event_names(decision: Decision) -> list[str]:
    return [describe(e) for e in decision.events]


def command_names(decision: Decision) -> list[str]:
    """The commands and withdrawals a decision sends, in the order of their events."""
    order = {getattr(e, "message_id", None): index for index, e in enumerate(decision.events)}
    sent: list[StepCommand | WithdrawStep] = [*decision.commands, *decision.withdrawals]
    return [describe_command(c) for c in sorted(sent, key=lambda c: order.get(c.message_id, len(order)))]
