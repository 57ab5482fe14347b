"""Hypothesis properties of the core over generated saga definitions and message sequences.

1. Any failure point in any DAG: exactly the completed compensable steps are compensated, in
   reverse-topological waves, and the saga ends COMPENSATED (FAILED, for a human, when a step without undo that
   was in flight at the turn-back turns out to have run).
2. Any sequence of messages (replies of any attempt, duplicates, stale and live timers, the deadline, cancels,
   resumes, duplicate starts and every lever): every status change is legal (``fold`` asserts the tables on
   every event), ``decide`` is deterministic, answering what is outstanding always brings the saga to a
   terminal status, no forward command is sent after the saga turned back (the fence), and every step sent
   forward in a saga that turned back ends compensated, withdrawn (failed, never run) or recorded as having
   taken effect without an undo.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import event as note
from hypothesis import strategies as st

from saga_orchestrator.orchestrator.domain.builder import DecisionBuilder, Timer, TimerKind, live_timer_ids
from saga_orchestrator.orchestrator.domain.decide import TIMED_OUT_ERROR, decide
from saga_orchestrator.orchestrator.domain.definition import (
    Condition,
    Expiry,
    FailureMode,
    RetryPolicy,
    SagaDefinition,
    Step,
)
from saga_orchestrator.orchestrator.domain.messages import TimerFired
from saga_orchestrator.orchestrator.domain.progress import advance
from saga_orchestrator.orchestrator.domain.state import (
    SagaState,
    SagaStatus,
    StepStatus,
    apply_event,
    fold,
    is_transition_valid,
)
from saga_orchestrator.schemas import event_types as ev
from saga_orchestrator.schemas.message_types import CommandKind, Lever, ResultStatus, StepCommand, WithdrawStep
from saga_orchestrator.testing.history import SagaRun

SETTINGS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FAST = dict(initial_backoff_ms=10, max_backoff_ms=100)


@st.composite
def simple_dags(draw: st.DrawFn) -> SagaDefinition:
    """Fail-fast DAGs without retries: every failure is definitive."""
    n = draw(st.integers(1, 7))
    steps = []
    for i in range(n):
        deps = draw(st.sets(st.integers(0, i - 1), max_size=3)) if i else set()
        steps.append(
            Step(
                name=f"s{i}",
                participant="p",
                command=f"do{i}",
                compensation=f"undo{i}" if draw(st.booleans()) else None,
                depends_on=tuple(f"s{d}" for d in sorted(deps)),
                retry=RetryPolicy(max_attempts=1),
            )
        )
    return SagaDefinition(saga_type="g", version=1, steps=tuple(steps), input_schema="x")


@st.composite
def rich_dags(draw: st.DrawFn) -> SagaDefinition:
    """Any mode, conditions, retry policies, and optionally a pivot splitting the saga in two."""
    mode = draw(st.sampled_from(FailureMode))
    undo_on_continue = mode is FailureMode.CONTINUE and draw(st.booleans())
    conditions = list(Condition) if mode is FailureMode.CONTINUE else [Condition.ON_SUCCESS, Condition.ALWAYS]

    def make(name: str, deps: set[str], post_pivot: bool, pivot: bool = False) -> Step:
        run_if = Condition.ON_SUCCESS if pivot or not deps else draw(st.sampled_from(conditions))
        return Step(
            name=name,
            participant="p",
            command=f"do_{name}",
            compensation=f"undo_{name}" if draw(st.booleans()) else None,
            depends_on=tuple(sorted(deps)),
            run_if=run_if,
            pivot=pivot,
            skippable=not pivot and draw(st.booleans()),
            retry=RetryPolicy(
                max_attempts=None if post_pivot else draw(st.integers(1, 3)),
                non_retryable_errors=frozenset({"Fatal"}),
                jitter=draw(st.sampled_from([0.0, 0.5])),
                **FAST,
            ),
            compensation_retry=RetryPolicy(
                max_attempts=draw(st.sampled_from([None, 1, 2])),
                non_retryable_errors=frozenset({"Refused"}),
                **FAST,
            ),
        )

    def wait(name: str, deps: set[str], post_pivot: bool) -> Step:
        return Step(name=name, participant="", command="", signal="S", depends_on=tuple(sorted(deps)),
                    skippable=draw(st.booleans()),
                    timeout_ms=draw(st.sampled_from([1, 300, 5_000])), on_expiry=draw(st.sampled_from(Expiry)),
                    retry=RetryPolicy(max_attempts=None if post_pivot else 1, initial_backoff_ms=10,
                                      max_backoff_ms=100))

    pre = [f"a{i}" for i in range(draw(st.integers(0 if draw(st.booleans()) else 1, 4)))]
    steps = []
    for i, n in enumerate(pre):
        deps = {pre[d] for d in draw(st.sets(st.integers(0, max(i - 1, 0)), max_size=2)) if d < i}
        steps.append(make(n, deps, False))
    waits = draw(st.booleans())  # a step that waits for signal S, before the pivot or after it
    if waits and (not draw(st.booleans()) or not steps):
        steps.append(wait("w", set(pre[:1]), False))
        waits = False
    if draw(st.booleans()) or not steps:
        steps.append(make("pivot", {step.name for step in steps}, False, pivot=True))
        post = [f"z{i}" for i in range(draw(st.integers(0, 3)))]
        for i, n in enumerate(post):
            extra = {post[d] for d in draw(st.sets(st.integers(0, max(i - 1, 0)), max_size=2)) if d < i}
            steps.append(make(n, {"pivot", *extra}, True))
        if waits:
            steps.append(wait("w", {"pivot"}, True))
    return SagaDefinition(
        saga_type="g", version=1, steps=tuple(steps), input_schema="x",
        failure_mode=mode, compensate_on_continue=undo_on_continue,
        deadline_ms=draw(st.sampled_from([None, None, 1, 400, 5_000])), signals=(("S", "x.S"),),
    )


def awaited(run: SagaRun) -> list[StepCommand | WithdrawStep]:
    """Commands whose reply the saga still waits for (latest attempt of a step in flight, the withdrawal of a
    withdrawn one)."""
    state = run.saga
    out: list[StepCommand | WithdrawStep] = []
    for command in run.sent:
        step = state.steps[command.step]
        if command.kind is CommandKind.FORWARD:
            if step.status in (StepStatus.RUNNING, StepStatus.TIMED_OUT) and step.attempt == command.attempt:
                out.append(command)
        elif step.status is StepStatus.COMPENSATING and step.compensation_attempt == command.attempt:
            out.append(command)
    withdrawing = {name for name, step in state.steps.items() if step.status is StepStatus.WITHDRAWING}
    out += list({w.step: w for w in run.withdrawn if w.step in withdrawing}.values())
    return out


def answer(
    run: SagaRun, command: StepCommand | WithdrawStep, status: ResultStatus, error: str = "", retryable: bool = False
) -> None:
    kind = CommandKind.FORWARD if isinstance(command, WithdrawStep) else command.kind
    output = output_of(command.step) if status is ResultStatus.SUCCEEDED and kind is CommandKind.FORWARD else None
    run.reply(command.step, kind, status, command.attempt, error_type=error or None, retryable=retryable,
              output=output)


def output_of(step: str) -> bytes:
    """What a participant answers for ``step`` in these runs (so a command's step_outputs can be checked)."""
    return f"out:{step}".encode()


def seq_of(run: SagaRun, event_type: type[ev.Event], step: str) -> int:
    """The seq of the first ``event_type`` of ``step`` (any, for "": saga events), or one past the last event."""
    matching = (e.seq for e in run.events
                if isinstance(e, event_type) and (not step or getattr(e, "step", None) == step))
    return next(matching, len(run.events) + 1)


def _check_the_fence(run: SagaRun) -> None:
    """No forward command after the saga turned back (until a Redrive runs an ended one again) or of a step
    after it was skipped, nor a signal
    taken; a wait sends no command; a signal is taken once; and once the saga ended after turning back, no step is
    still in flight: each was compensated, withdrawn, or recorded as landed."""
    turned_back, skipped = False, set()
    for event in run.events:
        if isinstance(event, ev.StepSkipped):
            skipped.add(event.step)
        if isinstance(event, ev.StepCommandSent):
            assert event.step not in skipped, f"{event.step} attempt {event.attempt} sent after it was skipped"
        if isinstance(event, ev.SagaCompensationStarted):
            turned_back = True
        elif isinstance(event, ev.OperatorAction) and event.action == Lever.REDRIVE:
            turned_back = False
        elif isinstance(event, ev.StepCommandSent):
            assert not turned_back, f"{event.step} attempt {event.attempt} sent forward after the turn-back"
            assert run.definition is None or not run.definition.step(event.step).waits, "a wait sent a command"
        elif isinstance(event, ev.SignalReceived):
            assert not turned_back, f"signal {event.signal_id} taken after the turn-back"
    taken = [event.signal_id for event in run.events if isinstance(event, ev.SignalReceived)]
    assert len(taken) == len(set(taken)) <= 1, f"signals taken: {taken}"  # once per id, and once per name
    state = run.saga
    if turned_back and state.status in (SagaStatus.COMPENSATED, SagaStatus.CANCELLED, SagaStatus.FAILED):
        open_ = {name: step.status for name, step in state.steps.items()
                 if step.status in (StepStatus.RUNNING, StepStatus.TIMED_OUT, StepStatus.WITHDRAWING)
                 or (step.status is StepStatus.RETRY_SCHEDULED and step.outcome_unknown)}
        assert not open_, f"ended {state.status} with steps still in flight: {open_}"


# --- property 1 ---------------------------------------------------------------------------------------


@SETTINGS
@given(definition=simple_dags(), data=st.data())
def test_any_failure_compensates_exactly_the_completed_compensable_steps_in_waves(
    definition: SagaDefinition, data: st.DataObject
) -> None:
    failing = data.draw(st.sampled_from(definition.order), label="failing step")
    run = SagaRun(definition)
    run.start()
    waves: list[list[str]] = []
    while not run.saga.is_terminal:
        pending = awaited(run)
        assert pending, f"stuck in {run.saga.status}"
        command = data.draw(st.sampled_from(pending), label="answered")
        if isinstance(command, WithdrawStep):  # had it run before the withdrawal reached it?
            if data.draw(st.booleans(), label="had run"):
                answer(run, command, ResultStatus.SUCCEEDED)
            else:
                answer(run, command, ResultStatus.FAILED, "Withdrawn")
        elif command.kind is CommandKind.FORWARD and command.step == failing:
            answer(run, command, ResultStatus.FAILED, "Fatal")
        else:
            answer(run, command, ResultStatus.SUCCEEDED)
    for event in run.events:
        if isinstance(event, ev.CompensationSent):
            if not waves or _wave_closed(run, waves[-1], event.seq):
                waves.append([])
            waves[-1].append(event.step)

    state = fold(definition, run.events)
    completed = {e.step for e in run.events if isinstance(e, ev.StepSucceeded)}
    compensable = {n for n in completed if definition.step(n).compensation is not None}
    compensated = {e.step for e in run.events if isinstance(e, ev.StepCompensated)}
    assert compensated == compensable
    landed = {name for name, step in state.steps.items() if step.landed_late}
    assert landed == {n for n in completed if definition.step(n).compensation is None
                      and seq_of(run, ev.StepSucceeded, n) > seq_of(run, ev.SagaCompensationStarted, "")}
    assert state.status is (SagaStatus.FAILED if landed else SagaStatus.COMPENSATED)
    _check_the_fence(run)
    # The step a human must look at: the one that took effect without undo after the turn-back, else the failing one.
    assert state.failed_step == (min(landed, key=definition.order.index) if landed else failing)
    assert state.steps[failing].status is StepStatus.FAILED
    for name in compensated:  # reverse-topological: dependents first
        sent = seq_of(run, ev.CompensationSent, name)
        for dependent in definition.downstream(name) & compensated:
            done = seq_of(run, ev.StepCompensated, dependent)
            assert sent is not None and done is not None and done < sent, (name, dependent)
    for wave in waves:  # within a wave nobody depends on anybody
        for name in wave:
            assert not definition.downstream(name) & set(wave)
    for name, step in state.steps.items():
        expected = {
            name in compensated: StepStatus.COMPENSATED,
            name in completed and name not in compensated: StepStatus.SUCCEEDED,
        }.get(True)
        if expected is not None:
            assert step.status is expected


def _wave_closed(run: SagaRun, wave: list[str], at_seq: int) -> bool:
    """True when every compensation of ``wave`` had succeeded before ``at_seq`` (the wave drained)."""
    return all((seq_of(run, ev.StepCompensated, n) or at_seq + 1) < at_seq for n in wave)


# --- property 2 ---------------------------------------------------------------------------------------

ACTIONS = [
    *["answer"] * 6, "any_reply", "fire", "fire", "stale_timer", "cancel", "resume", "restart", "lever", "signal",
]
LEVERS = [Lever.FORCE_COMPENSATE, Lever.TERMINATE, Lever.PAUSE, Lever.UNPAUSE, Lever.RETRY_NOW, Lever.REDRIVE,
          Lever.SKIP]


@SETTINGS
@given(definition=rich_dags(), data=st.data())
def test_random_message_sequences_stay_legal_and_always_finish(
    definition: SagaDefinition, data: st.DataObject
) -> None:
    run = SagaRun(definition)
    run.start()
    tracker = Tracker()
    # some runs never cancel, so failures get to unwind on their own
    actions = ACTIONS if data.draw(st.booleans(), label="cancels") else [a for a in ACTIONS if a != "cancel"]
    for _ in range(data.draw(st.integers(0, 60), label="chaos steps")):
        run.now += data.draw(st.integers(0, 500))
        _random_action(run, definition, data, actions)
        _check_invariants(run, definition, tracker)
    for _ in range(400):  # drain: answer everything with success, fire due timers, resume when stuck
        state = run.saga
        if state.is_terminal and state.status is not SagaStatus.COMPENSATION_FAILED:
            break
        if state.status is SagaStatus.COMPENSATION_FAILED:
            run.resume()
        elif state.paused:
            run.operate(Lever.UNPAUSE)
        elif pending := awaited(run):
            answer(run, pending[0], ResultStatus.SUCCEEDED)
        else:
            assert run.armed, f"stuck in {state.status} with nothing in flight: {dict(state.steps)}"
            timer = min(run.armed.values(), key=lambda t: (t.due_at, t.timer_id))
            run.fire(timer.kind, timer.step)
        _check_invariants(run, definition, tracker)
    assert run.saga.is_terminal and run.saga.status is not SagaStatus.COMPENSATION_FAILED
    assert fold(definition, run.events) == fold(definition, list(run.events))
    _check_the_fence(run)
    for status in set(tracker.statuses):
        note(f"passed through {status}")
    note(f"ended {run.saga.status}")


def _random_action(run: SagaRun, definition: SagaDefinition, data: st.DataObject, actions: list[str]) -> None:
    action = data.draw(st.sampled_from(actions), label="action")
    if action == "answer" and (pending := awaited(run)):
        command = data.draw(st.sampled_from(pending))
        outcome = data.draw(st.sampled_from(["ok", "ok", "busy", "fatal", "refused", "expired", "withdrawn"]))
        if outcome in ("expired", "withdrawn"):
            answer(run, command, ResultStatus.FAILED, outcome.capitalize(), retryable=outcome == "expired")
        elif outcome == "ok":
            answer(run, command, ResultStatus.SUCCEEDED)
        else:
            error = {"busy": "Busy", "fatal": "Fatal", "refused": "Refused"}[outcome]
            answer(run, command, ResultStatus.FAILED, error, retryable=outcome != "fatal")
    elif action == "any_reply":
        step = data.draw(st.sampled_from(definition.order))
        kind = data.draw(st.sampled_from(CommandKind))
        current = run.saga.steps[step]
        top = current.attempt if kind is CommandKind.FORWARD else current.compensation_attempt
        status = data.draw(st.sampled_from(ResultStatus))
        run.reply(step, kind, status, data.draw(st.integers(1, top + 1)), error_type="Busy", retryable=True)
    elif action == "fire" and run.armed:
        timer = data.draw(st.sampled_from(sorted(run.armed.values(), key=lambda t: t.timer_id)))
        run.fire(timer.kind, timer.step)
    elif action == "stale_timer":
        timer = Timer(saga_id=run.saga_id, kind=data.draw(st.sampled_from(TimerKind)),
                      step=data.draw(st.sampled_from(definition.order)), attempt=data.draw(st.integers(1, 4)),
                      due_at=run.now)
        run.send(TimerFired(timer=timer))
    elif action == "cancel":
        run.cancel()
    elif action == "lever":
        lever = data.draw(st.sampled_from(LEVERS))
        named = data.draw(st.sampled_from(definition.order)) if lever in (Lever.RETRY_NOW, Lever.SKIP) else None
        run.operate(lever, named, reason="the property asks")
    elif action == "signal":  # a few ids and names: duplicates, and names the saga does not take
        run.signal(data.draw(st.sampled_from(["S", "S", "T"])), signal_id=data.draw(st.sampled_from(["s1", "s2"])))
    elif action == "resume":
        run.resume()
    elif action == "restart":
        run.start()


@dataclass
class Tracker:
    """Replays the history event by event alongside the run, remembering every status passed through."""

    replayed: SagaState | None = None
    seen: int = 0
    statuses: list[SagaStatus] = field(default_factory=list)


def _check_invariants(run: SagaRun, definition: SagaDefinition, tracker: Tracker) -> None:
    state = run.saga
    for event in run.events[tracker.seen :]:  # every status change, event by event, is in the table
        before = tracker.replayed.status if tracker.replayed else None
        tracker.replayed = apply_event(definition, tracker.replayed, event)
        if tracker.replayed.status is not before:
            assert is_transition_valid(before, tracker.replayed.status)
            tracker.statuses.append(tracker.replayed.status)
    tracker.seen = len(run.events)
    # decide is a function: the same input gives the same decision
    probe = TimerFired(
        timer=Timer(saga_id=run.saga_id, kind=TimerKind.STEP_RETRY, step=definition.order[0], attempt=1,
                    due_at=run.now)
    )
    assert decide(definition, state, probe, run.now) == decide(definition, state, probe, run.now)
    # quiescence: every decision ends with ``advance``, so advancing again has nothing left to do
    if state.status is not SagaStatus.REJECTED:
        builder = DecisionBuilder(definition, state, run.now, run.saga_id)
        advance(builder)
        assert builder.build().is_empty
    # the timers the caller keeps armed (new ones added, obsolete ones dropped) are exactly the live ones
    assert set(run.armed) == live_timer_ids(definition, state)
    first: dict[tuple[type[ev.Event], str], int] = {}
    for event in run.events:
        first.setdefault((type(event), getattr(event, "step", "")), event.seq)
        if isinstance(event, ev.StepFailed) and event.error_type == TIMED_OUT_ERROR:
            # given up after timeouts: it may have taken effect, so it counts as done for undoing
            first.setdefault((ev.StepSucceeded, event.step), event.seq)
    for command in run.sent:  # a command carries outputs of its upstream steps only (and its own, to undo)
        allowed = definition.upstream(command.step) | (
            {command.step} if command.kind is CommandKind.COMPENSATE else set())
        assert all(step in allowed and output == (b"signal" if definition.step(step).waits else output_of(step))
                   for step, output in command.step_outputs)  # a wait's output is its signal's payload
    compensation_sent = [e for e in run.events if isinstance(e, ev.CompensationSent)]
    if state.pivot_passed and not state.forced_compensation:  # after the pivot the saga only moves forward (and
        assert not compensation_sent  # it never unwound before), unless an operator compensates it by force
    for sent in compensation_sent:
        succeeded = first.get((ev.StepSucceeded, sent.step))
        assert succeeded is not None and succeeded < sent.seq
        for dependent in definition.downstream(sent.step):  # dependents that had completed are undone first
            done = first.get((ev.StepSucceeded, dependent))
            if done is not None and done < sent.seq and definition.step(dependent).compensation:
                undone = first.get((ev.StepCompensated, dependent))
                assert undone is not None and undone < sent.seq, (sent.step, dependent)
