"""A Decision, the builder that records one event at a time, and the recording helpers of every decision.

The builder applies every event to the state as soon as it is recorded, so later choices in the same
decision see the effect of earlier ones, and it derives the commands and timers from the events
(``effects_of``): a command exists if and only if its *Sent event does.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TypedDict

from ...schemas import event_types as ev
from ...schemas.ids import command_message_id, compensation_key, forward_key
from ...schemas.limits import MAX_COMMAND_PAYLOAD_BYTES, MAX_STEP_OUTPUT_BYTES, MAX_STEP_OUTPUTS_BYTES
from ...schemas.message_types import CommandKind, StepCommand, WithdrawStep
from .definition import Expiry, SagaDefinition
from .evolve import apply_event
from .model import IN_FLIGHT, SagaState, SagaStatus, StepState, StepStatus


class TimerKind(StrEnum):
    STEP_TIMEOUT = "STEP_TIMEOUT"
    STEP_RETRY = "STEP_RETRY"
    COMPENSATION_TIMEOUT = "COMPENSATION_TIMEOUT"
    COMPENSATION_RETRY = "COMPENSATION_RETRY"
    SAGA_DEADLINE = "SAGA_DEADLINE"
    WITHDRAWAL_TIMEOUT = "WITHDRAWAL_TIMEOUT"  # attempt: the how-manieth withdrawal of the step's latest attempt


@dataclass(frozen=True, kw_only=True)
class Timer:
    """A durable timer the orchestrator's scheduler fires at ``due_at`` (epoch ms)."""

    saga_id: str
    kind: TimerKind
    step: str
    attempt: int
    due_at: int

    @property
    def timer_id(self) -> str:
        return timer_id(self.kind, self.step, self.attempt)


def timer_id(kind: TimerKind, step: str, attempt: int) -> str:
    """The id of a saga's timer of ``kind`` for ``step``'s ``attempt``: unique within the saga, so arming it again
    replaces it, and what ``live_timer_ids`` names."""
    return f"{kind}:{step}:{attempt}"


@dataclass(frozen=True, kw_only=True)
class Decision:
    """What one message changes: new events (to append), commands and withdrawals (to send) and timers (to arm),
    and whether the message itself is parked on the dead-letter topic.

    ``obsolete_timers`` are ids (``Timer.timer_id``) of armed timers this decision made pointless (their
    step was answered, or the saga ended); deleting them is an optimisation, firing them is harmless.
    ``dead_letter`` is the reason the message goes to the dead-letter topic, with its original bytes (None:
    it does not). ``state`` is the state after ``events`` (None only when there was no saga and none was
    created).
    """

    events: tuple[ev.Event, ...] = ()
    commands: tuple[StepCommand, ...] = ()
    withdrawals: tuple[WithdrawStep, ...] = ()
    timers: tuple[Timer, ...] = ()
    obsolete_timers: tuple[str, ...] = ()
    dead_letter: str | None = None
    state: SagaState | None = None

    @property
    def is_empty(self) -> bool:
        """True when the message changed nothing (duplicate, stale or refused silently)."""
        return not self.events and self.dead_letter is None


class EventBase(TypedDict):
    saga_id: str
    seq: int
    definition_version: int
    occurred_at: int


class DecisionBuilder:
    """Collects the events of one decision, applying each to ``state`` as it goes."""

    def __init__(
        self, definition: SagaDefinition | None, state: SagaState | None, now: int, saga_id: str
    ) -> None:
        self.definition = definition
        self.state = state
        self.now = now
        self.saga_id = saga_id
        self._initial_timers = live_timer_ids(definition, state)
        self._events: list[ev.Event] = []
        self._commands: list[StepCommand] = []
        self._withdrawals: list[WithdrawStep] = []
        self._timers: list[Timer] = []

    @property
    def defn(self) -> SagaDefinition:
        """The definition; only called on paths where the saga has one."""
        assert self.definition is not None
        return self.definition

    @property
    def saga(self) -> SagaState:
        """The current state; only called on paths where the saga exists."""
        assert self.state is not None
        return self.state

    def base(self, definition_version: int | None = None) -> EventBase:
        """Base fields of the next event: consecutive seq, the saga's definition version, now."""
        if definition_version is None:
            definition_version = self.saga.definition_version
        seq = 1 if self.state is None else self.state.last_seq + 1
        return EventBase(
            saga_id=self.saga_id, seq=seq, definition_version=definition_version, occurred_at=self.now
        )

    def record(self, event: ev.Event) -> None:
        """Append ``event``, apply it to the state, and collect the commands and timers it implies."""
        self.state = apply_event(self.definition, self.state, event)
        self._events.append(event)
        if self.definition is not None:
            commands, timers = effects_of(self.definition, self.state, event)
            for command in commands:
                if isinstance(command, WithdrawStep):
                    self._withdrawals.append(command)
                else:
                    self._commands.append(command)
            if not self.state.paused:  # a retry scheduled while paused is sent on Unpause, not by a timer
                self._timers.extend(timers)

    def build(self, dead_letter: str | None = None) -> Decision:
        """The finished Decision (``dead_letter``: the reason its message is parked on the DLQ)."""
        if not self._events:
            return Decision(dead_letter=dead_letter, state=self.state)
        live = live_timer_ids(self.definition, self.state)
        obsolete = self._initial_timers - live
        timers = [timer for timer in self._timers if timer.timer_id in live]  # not one a later event made stale
        if DEADLINE_TIMER_ID in live - self._initial_timers:
            timers = [*timers, self._deadline_timer()]
        return Decision(
            events=tuple(self._events),
            commands=tuple(self._commands),
            withdrawals=tuple(self._withdrawals),
            timers=tuple(timers),
            obsolete_timers=tuple(sorted(obsolete)),
            dead_letter=dead_letter,
            state=self.state,
        )

    def _deadline_timer(self) -> Timer:
        deadline_ms = self.defn.deadline_ms
        assert deadline_ms is not None
        return _timer(self.saga, TimerKind.SAGA_DEADLINE, "", 0, self.saga.started_at + deadline_ms)


def effects_of(
    definition: SagaDefinition, state: SagaState, event: ev.Event
) -> tuple[tuple[StepCommand | WithdrawStep, ...], tuple[Timer, ...]]:
    """The commands to send and timers to arm because ``event`` was recorded (``state`` includes it)."""
    if isinstance(event, ev.StepCommandSent | ev.CompensationSent):
        step = definition.step(event.step)
        forward = isinstance(event, ev.StepCommandSent)
        action = step.command if forward else step.compensation
        assert action is not None, "CompensationSent for a step without compensation"
        command = StepCommand(
            saga_id=state.saga_id,
            saga_type=state.saga_type,
            step=step.name,
            participant=step.participant,
            action=action,
            kind=CommandKind.FORWARD if forward else CommandKind.COMPENSATE,
            idempotency_key=event.idempotency_key,
            attempt=event.attempt,
            input=state.input,
            message_id=event.message_id,
            step_outputs=outputs_for(definition, state, step.name, forward),
            # The attempt's clock: picked up later, it does not run; once picked up, it may take the step's timeout.
            expires_at=event.timeout_at if forward else None,
            timeout_ms=step.timeout_ms if forward else None,
        )
        kind = TimerKind.STEP_TIMEOUT if forward else TimerKind.COMPENSATION_TIMEOUT
        return (command,), (_timer(state, kind, event.step, event.attempt, event.timeout_at),)
    if isinstance(event, ev.StepWithdrawn):
        step = definition.step(event.step)
        withdrawal = WithdrawStep(saga_id=state.saga_id, saga_type=state.saga_type, step=step.name,
                                  participant=step.participant, action=step.command,
                                  idempotency_key=event.idempotency_key, attempt=event.attempt,
                                  reason=event.reason, message_id=event.message_id)
        if event.timeout_at is None:
            return (withdrawal,), ()
        withdrawals = state.steps[event.step].withdrawals
        return (withdrawal,), (_timer(state, TimerKind.WITHDRAWAL_TIMEOUT, event.step, withdrawals, event.timeout_at),)
    if isinstance(event, ev.SignalAwaited):  # nothing is sent: the wait's end is a timer
        return (), (_timer(state, TimerKind.STEP_TIMEOUT, event.step, event.attempt, event.timeout_at),)
    if isinstance(event, ev.StepRetryScheduled):
        return (), (_timer(state, TimerKind.STEP_RETRY, event.step, event.attempt, event.due_at),)
    if isinstance(event, ev.CompensationRetryScheduled):
        return (), (_timer(state, TimerKind.COMPENSATION_RETRY, event.step, event.attempt, event.due_at),)
    return (), ()


def outputs_for(definition: SagaDefinition, state: SagaState, name: str,
                forward: bool) -> tuple[tuple[str, bytes], ...]:
    """What a command of step ``name`` carries of earlier steps' outputs: those of every step it depends on,
    directly or not, and for a compensation its own forward output too (what there is to undo)."""
    sources = definition.upstream(name) if forward else definition.upstream(name) | {name}
    found = ((source, state.steps[source].output) for source in sorted(sources))
    return tuple((source, output) for source, output in found if output is not None)


def output_problem(definition: SagaDefinition, state: SagaState, name: str, output: bytes | None) -> str | None:
    """Why step ``name``'s output cannot be taken on (None when it can): it is over MAX_STEP_OUTPUT_BYTES, or a
    command that would carry it (a later step's, or a compensation's) would break its budget.

    Every command carries the outputs of a fixed set of steps (``outputs_for``), all known by the time the last
    of them succeeds, so checking each success here means no command is ever decided that cannot be sent.
    """
    if output is None:
        return None
    if len(output) > MAX_STEP_OUTPUT_BYTES:
        return f"output of {len(output)} bytes is over the {MAX_STEP_OUTPUT_BYTES} a step output may have"
    sizes = {other: len(step.output) for other, step in state.steps.items() if step.output is not None}
    sizes[name] = len(output)
    for step in definition.steps:
        upstream = definition.upstream(step.name)
        carriers = [("command", upstream)] if name in upstream else []
        if step.compensation is not None and (name in upstream or name == step.name):
            carriers.append(("compensation", upstream | {step.name}))
        for what, sources in carriers:
            outputs = sum(sizes.get(source, 0) for source in sources)
            if outputs > MAX_STEP_OUTPUTS_BYTES:
                return (f"the {what} of {step.name} would carry {outputs} bytes of step outputs, over the "
                        f"{MAX_STEP_OUTPUTS_BYTES} allowed")
            if outputs + len(state.input) > MAX_COMMAND_PAYLOAD_BYTES:
                return (f"the {what} of {step.name} would carry {outputs + len(state.input)} bytes of input and "
                        f"step outputs, over the {MAX_COMMAND_PAYLOAD_BYTES} allowed")
    return None


def _timer(state: SagaState, kind: TimerKind, step: str, attempt: int, due_at: int) -> Timer:
    return Timer(saga_id=state.saga_id, kind=kind, step=step, attempt=attempt, due_at=due_at)


def in_flight(step: StepState) -> bool:
    """True while a forward attempt of the step may still take effect at its participant: sent and unanswered,
    or waiting on a retry after an attempt whose outcome is unknown."""
    return step.status in IN_FLIGHT or (step.status is StepStatus.RETRY_SCHEDULED and step.outcome_unknown)


def needs_resolution(definition: SagaDefinition, step: StepState) -> bool:
    """True for a step whose forward outcome is still open while the saga unwinds: the unwinding waits for it.

    A step in flight when the saga turned back was withdrawn (WITHDRAWING): its participant says whether it had
    run, and a success is then compensated (or, without an undo, reported), a failure settles it. A saga that
    turned back before withdrawals existed waits, as it did then, for its compensable steps in flight.
    """
    if step.status is StepStatus.WITHDRAWING:
        return True
    if definition.step(step.name).compensation is None:
        return False
    return in_flight(step)


def to_undo(definition: SagaDefinition, step: StepState) -> bool:
    """True for a compensable step whose effect an unwinding saga must undo: it succeeded, or it was given
    up after its attempts timed out and so may have taken effect (undoing what never happened is a no-op)."""
    if definition.step(step.name).compensation is None:
        return False
    return step.status is StepStatus.SUCCEEDED or (step.status is StepStatus.FAILED and step.outcome_unknown)


def live_timer_ids(definition: SagaDefinition | None, state: SagaState | None) -> frozenset[str]:
    """Ids of the timers that would still change something in ``state`` when they fire.

    ``decide`` acts on a fired timer exactly when its id is in this set, so the set is the single truth
    about stale timers, and the difference before/after a decision gives the obsolete ones.
    """
    if definition is None or state is None:
        return frozenset()
    if state.status not in (SagaStatus.RUNNING, SagaStatus.COMPENSATING) or state.paused:
        return frozenset()  # terminal, paused, or waiting for an operator: timers are re-armed on resume
    unwinding = state.status is SagaStatus.COMPENSATING
    live: set[str] = set()
    if definition.deadline_ms is not None and not (unwinding or state.pivot_passed or state.cancel_requested
                                                   or deadline_withdrew_pivot(definition, state)):
        live.add(DEADLINE_TIMER_ID)
    for step in state.steps.values():
        forward_open = not unwinding or needs_resolution(definition, step)
        if step.status in (StepStatus.RUNNING, StepStatus.AWAITING_SIGNAL) and forward_open:
            live.add(timer_id(TimerKind.STEP_TIMEOUT, step.name, step.attempt))
        elif step.status is StepStatus.RETRY_SCHEDULED and forward_open:
            live.add(timer_id(TimerKind.STEP_RETRY, step.name, step.attempt))
        elif step.status is StepStatus.WITHDRAWING:
            live.add(timer_id(TimerKind.WITHDRAWAL_TIMEOUT, step.name, step.withdrawals))
        elif step.status is StepStatus.COMPENSATING:
            live.add(timer_id(TimerKind.COMPENSATION_TIMEOUT, step.name, step.compensation_attempt))
        elif step.status is StepStatus.COMPENSATION_RETRY_SCHEDULED:
            live.add(timer_id(TimerKind.COMPENSATION_RETRY, step.name, step.compensation_attempt))
    return frozenset(live)


DEADLINE_TIMER_ID = timer_id(TimerKind.SAGA_DEADLINE, "", 0)
"""The id of a saga's deadline timer (``Timer.timer_id`` of kind SAGA_DEADLINE, no step, attempt 0): armed
whenever it becomes live (``live_timer_ids``), due ``deadline_ms`` after the start."""


def deadline_withdrew_pivot(definition: SagaDefinition, state: SagaState) -> bool:
    """True while the saga's deadline, passed with a pivot without undo in flight, waits for the pivot's
    participant to say whether it ran: the saga goes on if it did, and turns back if it did not."""
    pivot = definition.pivot
    return (pivot is not None and state.status is SagaStatus.RUNNING
            and state.steps[pivot.name].status is StepStatus.WITHDRAWING)


def pivot_blocks_cancel(definition: SagaDefinition, state: SagaState) -> bool:
    """True while a pivot step without compensation is in flight: it may succeed any moment and nothing
    could undo it, so the saga must be allowed to go forward (a cancel is refused, a deadline waits)."""
    pivot = definition.pivot
    if pivot is None or pivot.compensation is not None or state.pivot_passed:
        return False
    step = state.steps[pivot.name]
    return step.status in (StepStatus.RUNNING, StepStatus.TIMED_OUT) or (
        step.status is StepStatus.RETRY_SCHEDULED and step.outcome_unknown
    )


def send_step(b: DecisionBuilder, name: str, attempt: int) -> None:
    """Record StepCommandSent for ``attempt`` of step ``name`` (its command and timeout timer follow)."""
    base = b.base()
    b.record(
        ev.StepCommandSent(
            **base,
            step=name,
            attempt=attempt,
            idempotency_key=forward_key(b.saga_id, name),
            message_id=command_message_id(b.saga_id, base["seq"]),
            timeout_at=b.now + b.defn.step(name).timeout_ms,
        )
    )


SIGNAL_TIMED_OUT = "SignalTimedOut"
"""error_type of a step whose wait for a signal ended without it, declared to fail then (``Expiry.FAIL``)."""


def await_signal(b: DecisionBuilder, name: str, until: int | None = None) -> None:
    """Record SignalAwaited for step ``name`` (a wait: nothing is sent), ending at ``until`` (default: its timeout
    from now); a signal the saga took already is taken by it at once."""
    step = b.defn.step(name)
    assert step.signal is not None
    b.record(ev.SignalAwaited(**b.base(), step=name, signal=step.signal, attempt=b.saga.steps[name].attempt + 1,
                              timeout_at=b.now + step.timeout_ms if until is None else max(b.now, until)))
    taken = b.saga.signals.get(step.signal)
    if taken is not None:
        take_signal(b, name, taken[1])


def take_signal(b: DecisionBuilder, name: str, payload: bytes | None) -> None:
    """Step ``name``, waiting, goes on with ``payload`` as its output (None: its wait expired, declared to go on)."""
    b.record(ev.StepSucceeded(**b.base(), step=name, attempt=b.saga.steps[name].attempt, output=payload))


def expire_wait(b: DecisionBuilder, name: str) -> None:
    """Step ``name``'s wait for its signal ended without it: it fails for good, or goes on, as declared."""
    step = b.defn.step(name)
    if step.on_expiry is Expiry.GO_ON:
        take_signal(b, name, None)
        return
    b.record(ev.StepFailed(**b.base(), step=name, attempt=b.saga.steps[name].attempt, error_type=SIGNAL_TIMED_OUT,
                           error_message=f"no {step.signal} signal within {step.timeout_ms / 1000:g} s",
                           retryable=False))


WITHDRAWAL_MAX_WAIT_MS = 300_000
"""The longest a withdrawal waits for its answer before it is sent again."""


def withdraw(b: DecisionBuilder, name: str, reason: str, *, wait: bool) -> None:
    """Record StepWithdrawn for step ``name``'s latest forward attempt: a WithdrawStep goes to its participant
    (with ``wait``, sent again each compensation timeout until it answers whether the attempt had run)."""
    step = b.saga.steps[name]
    base = b.base()
    # Sent again, unanswered, after the compensation's timeout, doubling up to WITHDRAWAL_MAX_WAIT_MS: a participant
    # that is down finds a handful queued when it is back, not one per timeout.
    again = step.withdrawals if step.status is StepStatus.WITHDRAWING else 0
    wait_ms = min(b.defn.step(name).compensation_timeout_ms * 2 ** min(again, 20), WITHDRAWAL_MAX_WAIT_MS)
    timeout_at = b.now + wait_ms if wait else None
    b.record(ev.StepWithdrawn(**base, step=name, attempt=max(1, step.attempt),
                              idempotency_key=forward_key(b.saga_id, name),
                              message_id=command_message_id(b.saga_id, base["seq"]),
                              reason=reason, timeout_at=timeout_at))


def send_compensation(b: DecisionBuilder, name: str, attempt: int) -> None:
    """Record CompensationSent for ``attempt`` of step ``name``'s compensation."""
    base = b.base()
    b.record(
        ev.CompensationSent(
            **base,
            step=name,
            attempt=attempt,
            idempotency_key=compensation_key(b.saga_id, name),
            message_id=command_message_id(b.saga_id, base["seq"]),
            timeout_at=b.now + b.defn.step(name).compensation_timeout_ms,
        )
    )


def schedule_step_retry(b: DecisionBuilder, name: str, failed_attempt: int) -> None:
    """Record StepRetryScheduled for the attempt after ``failed_attempt``, after the policy's backoff (counted from
    the step's latest Redrive, as its attempt budget is)."""
    spent = b.saga.steps[name].attempt_base
    delay = b.defn.step(name).retry.backoff_ms(failed_attempt - spent, f"{b.saga_id}:{name}:{failed_attempt}")
    b.record(ev.StepRetryScheduled(**b.base(), step=name, attempt=failed_attempt + 1, due_at=b.now + delay))


def schedule_compensation_retry(b: DecisionBuilder, name: str, failed_attempt: int) -> None:
    """Record CompensationRetryScheduled for the attempt after ``failed_attempt``."""
    policy = b.defn.step(name).compensation_retry
    delay = policy.backoff_ms(failed_attempt, f"{b.saga_id}:{name}:compensate:{failed_attempt}")
    b.record(
        ev.CompensationRetryScheduled(**b.base(), step=name, attempt=failed_attempt + 1, due_at=b.now + delay)
    )
