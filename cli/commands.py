"""``saga start``, ``saga cancel``, ``saga resume``, ``saga release`` and the levers (``saga retry-now``, ``skip``,
``force-compensate``, ``terminate``, ``pause``, ``unpause``, ``redrive``): publish commands onto the saga topics.

Every command an operator pulls records who: ``--operator``, or the login name when it is not given."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import typer

from ..client.saga_client import SagaInputError, client_headers
from ..orchestrator.domain.errors import DomainError
from ..orchestrator.domain.model import RESUME_COMPENSATION
from ..orchestrator.domain.state import SagaStatus, fold
from ..schemas import wire
from ..schemas.event_types import SagaCompensated, SagaCompleted, SagaQuarantined, SagaReleased, SagaStarted
from ..schemas.message_types import (
    CancelSaga,
    Lever,
    OperateSaga,
    ReleaseSaga,
    ResumeCompensation,
)
from .context import (
    OPERATOR_HELP,
    console,
    deployed_client,
    deployed_definitions,
    fail,
    operator_or_login,
    producer,
    run,
    settings,
    topics,
)
from .inspect_cmd import folded, follow, load_events_of


def _parse_json_object(text: str, option: str = "--input") -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        fail(f"{option} is not valid JSON ({error.msg} at line {error.lineno} column {error.colno})")
    if not isinstance(value, dict):
        fail(f"{option} must be a JSON object, e.g. '{{\"customer_id\": \"c1\", ...}}'")
    return value


_OPTION_OF = {"saga_id": "--id", "saga_input": "--input"}
_SIGNAL_OPTION_OF = {"saga_id": "SAGA_ID", "signal": "SIGNAL", "signal_id": "--signal-id", "payload": "--payload",
                     "saga_type": "--type", "saga_input": "--start-input"}


def start(
    saga_type: str = typer.Argument(..., help="Saga type, e.g. trip."),
    saga_id: str = typer.Option(..., "--id", help="The saga id (business key); also the Kafka key."),
    input_json: str = typer.Option(..., "--input", help="The saga input as a JSON object."),
    tenant: str | None = typer.Option(None, "--tenant", help="Optional tenant id."),
    wait: bool = typer.Option(False, "--wait", help="Print the saga's events until it ends; exit 0 when it "
                                                    "COMPLETED, 1 when it ended otherwise."),
    force: bool = typer.Option(False, "--force", help="Publish without first checking the event store for the id "
                                                      "(the orchestrator still refuses an id already started)."),
) -> None:
    """Validate, encode and publish a StartSaga on saga.start; an id already started is refused here first."""
    current = settings()
    client = deployed_client(current)
    try:
        value = client.encode_start(saga_type, saga_id, _parse_json_object(input_json), tenant)
    except SagaInputError as error:
        fail(f"{_OPTION_OF[error.field]} {error.problem}" if error.field in _OPTION_OF else error.problem)
    if not force and any(isinstance(event, SagaStarted) for event in run(load_events_of(saga_id))):
        fail(f"saga {saga_id!r} already exists, so this start would be refused; choose another --id, or "
             f"follow that saga with `saga history {saga_id} --follow`")
    run(_publish(current, topics(current).start, saga_id, value, saga_type))
    console.print(f"published StartSaga [bold]{saga_id}[/] ({saga_type}) on {topics(current).start}")
    if wait:
        try:
            ended = run(follow(saga_id))
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        console.print(f"saga [bold]{saga_id}[/] ended: {type(ended).__name__}")
        raise typer.Exit(0 if isinstance(ended, SagaCompleted) else 1)


def signal(
    saga_id: str = typer.Argument(..., help="The saga to signal."),
    name: str = typer.Argument(..., metavar="SIGNAL", help="The signal, as its saga type declares it (e.g. Approval)."),
    payload_json: str = typer.Option(..., "--payload", help="The signal's record as a JSON object."),
    signal_id: str | None = typer.Option(None, "--signal-id", help="Its id: sent again with the same id, it changes "
                                                                   "nothing (default: a fresh one, printed)."),
    sender: str | None = typer.Option(None, "--sender", help="Who sends it (default: the login name); recorded."),
    saga_type: str | None = typer.Option(None, "--type", help="The saga type, where several take a signal of this "
                                                              "name; needed with --start-input."),
    start_input: str | None = typer.Option(None, "--start-input", help="Signal-with-start: the input (JSON) of the "
                                                                       "saga started when there is none yet."),
) -> None:
    """Validate, encode and publish a SignalSaga on saga.control: a step waiting for the signal goes on with its
    record as its output; the saga records it once per id, or why it could not take it (`saga history`)."""
    current = settings()
    client = deployed_client(current)
    payload = _parse_json_object(payload_json, "--payload")
    starting = None if start_input is None else _parse_json_object(start_input, "--start-input")
    try:
        message = client.encode_signal(saga_id, name, payload, signal_id=signal_id,
                                       sender=operator_or_login(sender), saga_type=saga_type, start_input=starting)
    except SagaInputError as error:
        where = _SIGNAL_OPTION_OF.get(error.field)
        fail(f"{where} {error.problem}" if where else error.problem)
    run(_publish(current, topics(current).control, saga_id, wire.encode_signal(message), saga_type))
    console.print(f"published SignalSaga {name} for [bold]{saga_id}[/] (signal id {message.signal_id})")


FORCE_HELP = "Publish without first checking the saga's state in the event store."


def _status_of(saga_id: str) -> SagaStatus:
    """The saga's status folded from the store; exits with what to do when there is no such saga."""
    events = run(load_events_of(saga_id))
    if not events:
        fail(f"no saga {saga_id!r} in the event store (check the id, or `saga list`); --force publishes anyway")
    return folded(saga_id, events).status


def cancel(
    saga_id: str = typer.Argument(..., help="The saga to cancel."),
    reason: str = typer.Option(..., "--reason", help="Why; recorded in the saga's history."),
    operator: str | None = typer.Option(None, "--operator", help=OPERATOR_HELP),
    force: bool = typer.Option(False, "--force", help=FORCE_HELP),
) -> None:
    """Publish a CancelSaga on saga.control (refused and recorded once the pivot step succeeded)."""
    if not reason.strip():
        fail("--reason must not be empty")
    if not force and (status := _status_of(saga_id)).is_terminal:
        fail(f"saga {saga_id!r} already ended {status.value}: there is nothing to cancel")
    current = settings()
    body = wire.encode_cancel(CancelSaga(saga_id=saga_id, reason=reason, operator=operator_or_login(operator)))
    run(_publish(current, topics(current).control, saga_id, body, None))
    console.print(f"published CancelSaga for [bold]{saga_id}[/]")


def resume(
    saga_id: str = typer.Argument(..., help="A COMPENSATION_FAILED saga."),
    operator: str | None = typer.Option(None, "--operator", help=OPERATOR_HELP),
    detail: str | None = typer.Option(None, "--detail", help="What was fixed; recorded."),
    wait: bool = typer.Option(False, "--wait", help="Print the events the resume brings until the saga ends again; "
                                                    "exit 0 when it ended COMPENSATED, 1 when it was refused or "
                                                    "ended otherwise."),
    force: bool = typer.Option(False, "--force", help=FORCE_HELP),
) -> None:
    """Ask a COMPENSATION_FAILED saga to retry its failed compensation (after a human fixed the cause)."""
    events = run(load_events_of(saga_id)) if wait or not force else []
    if not force:
        if not events:
            fail(f"no saga {saga_id!r} in the event store (check the id, or `saga list`); --force publishes anyway")
        if (status := folded(saga_id, events).status) is not SagaStatus.COMPENSATION_FAILED:
            fail(f"saga {saga_id!r} is {status.value}: only a COMPENSATION_FAILED saga can be resumed")
    current = settings()
    message = ResumeCompensation(saga_id=saga_id, operator=operator_or_login(operator), detail=detail)
    body = wire.encode_resume(message)
    run(_publish(current, topics(current).control, saga_id, body, None))
    console.print(f"published ResumeCompensation for [bold]{saga_id}[/]")
    if wait:
        try:  # what the resume brings: the events after those it was decided on
            ended = run(follow(saga_id, after_seq=events[-1].seq if events else 0, lever=RESUME_COMPENSATION))
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        console.print(f"saga [bold]{saga_id}[/] ended: {type(ended).__name__}")
        raise typer.Exit(0 if isinstance(ended, SagaCompensated) else 1)


def release(
    saga_id: str = typer.Argument(..., help="A QUARANTINED saga."),
    operator: str | None = typer.Option(None, "--operator", help=OPERATOR_HELP),
    detail: str | None = typer.Option(None, "--detail", help="What was fixed; recorded."),
    force: bool = typer.Option(False, "--force", help=FORCE_HELP),
) -> None:
    """Release a QUARANTINED saga once the cause is fixed: it goes on where it stood, its open steps sent again."""
    if not force:
        _check_quarantined(saga_id)
    current = settings()
    message = ReleaseSaga(saga_id=saga_id, operator=operator_or_login(operator), detail=detail)
    body = wire.encode_release(message)
    run(_publish(current, topics(current).control, saga_id, body, None))
    console.print(f"published ReleaseSaga for [bold]{saga_id}[/]")


def retry_now(
    saga_id: str = typer.Argument(..., help="A saga with a step or a compensation waiting on its retry backoff."),
    step: str = typer.Argument(..., help="That step."),
    operator: str | None = typer.Option(None, "--operator", help=OPERATOR_HELP),
    reason: str | None = typer.Option(None, "--reason", help="Why; recorded."),
) -> None:
    """Send a step (or its compensation) waiting on its retry backoff at once, under its same key. The
    orchestrator records it in the saga's history, or records why it could not apply (OperatorActionRefused)."""
    _operate(OperateSaga(saga_id=saga_id, action=Lever.RETRY_NOW, step=step, operator=operator, reason=reason))


def skip(
    saga_id: str = typer.Argument(..., help="A RUNNING saga with a skippable step that is stuck."),
    step: str = typer.Argument(..., help="That step (its definition must declare it skippable)."),
    reason: str = typer.Option(..., "--reason", help="Why the saga may go on without it; recorded."),
    operator: str | None = typer.Option(None, "--operator", help=OPERATOR_HELP),
) -> None:
    """Record a stuck step (in flight, timed out, waiting on a retry) as skipped: the saga goes on as if it had
    succeeded, without its output. The orchestrator records it, or why it could not apply."""
    _operate(OperateSaga(saga_id=saga_id, action=Lever.SKIP, step=step, operator=operator, reason=reason))


def force_compensate(
    saga_id: str = typer.Argument(..., help="A RUNNING saga, or one that ended FAILED."),
    reason: str = typer.Option(..., "--reason", help="Why what it did must be undone; recorded."),
    operator: str | None = typer.Option(None, "--operator", help=OPERATOR_HELP),
) -> None:
    """Undo what the saga did, also after its pivot (the pivot by its undo): recorded as forced. The orchestrator
    records it, or why it could not apply."""
    _operate(OperateSaga(saga_id=saga_id, action=Lever.FORCE_COMPENSATE, step=None, operator=operator, reason=reason))


def terminate(
    saga_id: str = typer.Argument(..., help="A saga that has not ended (or waits after a failed compensation)."),
    reason: str = typer.Option(..., "--reason", help="What settled the saga by hand; recorded."),
    operator: str | None = typer.Option(None, "--operator", help=OPERATOR_HELP),
) -> None:
    """End a saga TERMINATED as it stands, compensating nothing: for a saga settled by hand. The orchestrator
    records it, or records why it could not apply (OperatorActionRefused)."""
    _operate(OperateSaga(saga_id=saga_id, action=Lever.TERMINATE, step=None, operator=operator, reason=reason))


def pause(
    saga_id: str = typer.Argument(..., help="A RUNNING or COMPENSATING saga."),
    reason: str | None = typer.Option(None, "--reason", help="Why; recorded."),
    operator: str | None = typer.Option(None, "--operator", help=OPERATOR_HELP),
) -> None:
    """Pause a saga: nothing more is sent for it and none of its timers acts until `saga unpause` (replies that
    come meanwhile are recorded)."""
    _operate(OperateSaga(saga_id=saga_id, action=Lever.PAUSE, step=None, operator=operator, reason=reason))


def unpause(
    saga_id: str = typer.Argument(..., help="A paused saga."),
    reason: str | None = typer.Option(None, "--reason", help="Why; recorded."),
    operator: str | None = typer.Option(None, "--operator", help=OPERATOR_HELP),
) -> None:
    """Let a paused saga go on: what is open is sent again (under the same keys) and its timers are armed."""
    _operate(OperateSaga(saga_id=saga_id, action=Lever.UNPAUSE, step=None, operator=operator, reason=reason))


def redrive(
    saga_id: str = typer.Argument(..., help="A saga that ended FAILED (a step failed for good, after its pivot)."),
    reason: str = typer.Option(..., "--reason", help="What was fixed so that its failed steps can succeed; "
                                                    "recorded."),
    operator: str | None = typer.Option(None, "--operator", help=OPERATOR_HELP),
    force: bool = typer.Option(False, "--force", help=FORCE_HELP),
) -> None:
    """Run a FAILED saga again: RUNNING once more, each step that failed for good is sent again (its next attempt,
    under its same key, with a fresh attempt budget) and the saga goes on. The orchestrator records it, or why it
    could not apply."""
    if not force and (status := _status_of(saga_id)) is not SagaStatus.FAILED:
        fail(f"saga {saga_id!r} is {status.value}: only a FAILED saga can be re-driven")
    _operate(OperateSaga(saga_id=saga_id, action=Lever.REDRIVE, step=None, operator=operator, reason=reason))


def _operate(message: OperateSaga) -> None:
    """Publish ``message``, its operator the login name when none was given."""
    message = dataclasses.replace(message, operator=operator_or_login(message.operator))
    current = settings()
    run(_publish(current, topics(current).control, message.saga_id, wire.encode_operate(message), None))
    console.print(f"published OperateSaga {message.action}{' ' + message.step if message.step else ''} for "
                  f"[bold]{message.saga_id}[/]: `saga history {message.saga_id}` shows whether it applied")


def _check_quarantined(saga_id: str) -> None:
    """Exits with what to do unless the saga's last quarantine has no release after it."""
    events = run(load_events_of(saga_id))
    if not events:
        fail(f"no saga {saga_id!r} in the event store (check the id, or `saga list`); --force publishes anyway")
    marks = [event for event in events if isinstance(event, SagaQuarantined | SagaReleased)]
    if not marks or not isinstance(marks[-1], SagaQuarantined):
        fail(f"saga {saga_id!r} is not quarantined: there is nothing to release")
    try:
        fold(deployed_definitions().for_history(events), events)
    except DomainError as error:  # releasing now would only quarantine it again
        fail(f"saga {saga_id!r} still cannot go on ({type(error).__name__}: {error}); fix that first (for a "
             "missing definition version, deploy it in SAGA_DEFINITIONS), or --force to publish anyway")


async def _publish(current: Any, topic: str, saga_id: str, value: bytes, saga_type: str | None) -> None:
    async with producer(current) as kafka:
        await kafka.send_and_wait(topic, value=value, key=saga_id.encode(), headers=client_headers(saga_id, saga_type))
