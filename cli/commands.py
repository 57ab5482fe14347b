"""``saga start`` and ``saga signal``: publish commands onto the saga topics (the operator's actions on one saga
are ``cli.levers``'), and what the command line looks up before publishing."""

from __future__ import annotations

import json
from typing import Any

import typer

from ..client.saga_client import SagaInputError, client_headers
from ..orchestrator.domain.errors import DomainError
from ..orchestrator.domain.state import SagaStatus, fold
from ..schemas import wire
from ..schemas.event_types import SagaCompleted, SagaQuarantined, SagaReleased, SagaStarted
from .context import (
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


_OPTION_OF = {"saga_id": "--id", "saga_input": "--input", "version": "--version"}
_SIGNAL_OPTION_OF = {"saga_id": "SAGA_ID", "signal": "SIGNAL", "signal_id": "--signal-id", "payload": "--payload",
                     "saga_type": "--type", "saga_input": "--start-input"}


def start(
    saga_type: str = typer.Argument(..., help="Saga type, e.g. trip."),
    saga_id: str = typer.Option(..., "--id", help="The saga id (business key); also the Kafka key."),
    input_json: str = typer.Option(..., "--input", help="The saga input as a JSON object."),
    tenant: str | None = typer.Option(None, "--tenant", help="Optional tenant id."),
    version: int | None = typer.Option(None, "--version", min=1, help="The definition version to start on; by "
                                       "default the latest one that takes starts (not draining)."),
    wait: bool = typer.Option(False, "--wait", help="Print the saga's events until it ends; exit 0 when it "
                                                    "COMPLETED, 1 when it ended otherwise."),
    force: bool = typer.Option(False, "--force", help="Publish without first checking the event store for the id "
                                                      "(the orchestrator still refuses an id already started)."),
) -> None:
    """Validate, encode and publish a StartSaga on saga.start; an id already started is refused here first."""
    current = settings()
    client = deployed_client(current)
    try:
        value = client.encode_start(saga_type, saga_id, _parse_json_object(input_json), tenant, version)
    except SagaInputError as error:
        fail(f"{_OPTION_OF[error.field]} {error.problem}" if error.field in _OPTION_OF else error.problem)
    if not force and any(isinstance(event, SagaStarted) for event in run(load_events_of(saga_id))):
        fail(f"saga {saga_id!r} already exists, so this start would be refused; choose another --id, or "
             f"follow that saga with `saga history {saga_id} --follow`")
    run(publish(current, topics(current).start, saga_id, value, saga_type))
    on = "" if version is None else f" v{version}"
    console.print(f"published StartSaga [bold]{saga_id}[/] ({saga_type}{on}) on {topics(current).start}")
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
    run(publish(current, topics(current).control, saga_id, wire.encode_signal(message), saga_type))
    console.print(f"published SignalSaga {name} for [bold]{saga_id}[/] (signal id {message.signal_id})")


FORCE_HELP = "Publish without first checking the saga's state in the event store."


def status_of(saga_id: str) -> SagaStatus:
    """The saga's status folded from the store; exits with what to do when there is no such saga."""
    events = run(load_events_of(saga_id))
    if not events:
        fail(f"no saga {saga_id!r} in the event store (check the id, or `saga list`); --force publishes anyway")
    return folded(saga_id, events).status


def check_quarantined(saga_id: str) -> None:
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


async def publish(current: Any, topic: str, saga_id: str, value: bytes, saga_type: str | None) -> None:
    async with producer(current) as kafka:
        await kafka.send_and_wait(topic, value=value, key=saga_id.encode(), headers=client_headers(saga_id, saga_type))
