"""Signals: data a person or a service brings into a running saga (SignalSaga), and the steps that wait for it.

Part of ``decide``. A signal is taken once per id and once per name: recorded (SignalReceived), it completes the
step waiting for it, at once or when that step comes to wait; one the saga cannot take is refused with its reason
(SignalRefused) and changes nothing else.
"""

from __future__ import annotations

from ...schemas import event_types as ev
from ...schemas.message_types import SignalSaga
from .builder import DecisionBuilder, output_problem, take_signal
from .model import SagaStatus, StepStatus
from .progress import advance


def handle_signal(b: DecisionBuilder, signal: SignalSaga) -> None:
    """Take ``signal`` into the saga, or record why not; a signal id seen before changes nothing."""
    if signal.signal_id in b.saga.signal_ids:
        return
    refusal = signal_refusal(b, signal)
    if refusal is not None:
        b.record(ev.SignalRefused(**b.base(), signal_id=signal.signal_id, signal=signal.signal,
                                  sender=signal.sender, reason=refusal))
        return
    b.record(ev.SignalReceived(**b.base(), signal_id=signal.signal_id, signal=signal.signal, payload=signal.payload,
                               sender=signal.sender))
    for name in b.defn.order:
        if b.defn.step(name).signal == signal.signal and b.saga.steps[name].status is StepStatus.AWAITING_SIGNAL:
            take_signal(b, name, signal.payload)
    advance(b)


def refuse_signal(b: DecisionBuilder, signal: SignalSaga, reason: str) -> None:
    """Record ``signal`` refused for ``reason`` (a saga that runs nothing: rejected or purged)."""
    if signal.signal_id not in b.saga.signal_ids:
        b.record(ev.SignalRefused(**b.base(), signal_id=signal.signal_id, signal=signal.signal,
                                  sender=signal.sender, reason=reason))


def signal_refusal(b: DecisionBuilder, signal: SignalSaga) -> str | None:
    """Why the saga cannot take ``signal`` (None: it can)."""
    state, definition = b.saga, b.defn
    if state.status is not SagaStatus.RUNNING:
        return f"saga is {state.status}: it takes signals only while RUNNING"
    if definition.signal_record(signal.signal) is None:
        declared = ", ".join(name for name, _ in definition.signals) or "none"
        return f"saga type {definition.saga_type} takes no signal {signal.signal!r} (it takes: {declared})"
    taken = state.signals.get(signal.signal)
    if taken is not None:
        return f"signal {signal.signal} was taken already (signal id {taken[0]})"
    waiting = [name for name in definition.order if definition.step(name).signal == signal.signal]
    if waiting and all(state.steps[name].status not in (StepStatus.PENDING, StepStatus.AWAITING_SIGNAL)
                       for name in waiting):
        return f"no step waits for signal {signal.signal} any more ({', '.join(waiting)} settled)"
    for name in waiting:
        problem = output_problem(definition, state, name, signal.payload)
        if problem is not None:
            return f"its payload cannot be step {name}'s output: {problem}"
    return None
