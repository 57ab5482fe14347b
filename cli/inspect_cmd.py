"""``saga status``, ``history``, ``list`` and ``effects``: read a saga from the event store."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import asyncpg
import typer
from rich.table import Table

from ..client.api import ApiError, SagaApi, SagaNotFound
from ..client.saga_client import api_of
from ..operations import bulk_jobs
from ..operations.postgres import postgres_reads, reads_store
from ..orchestrator.domain.definition import SagaDefinition
from ..orchestrator.domain.errors import DomainError
from ..orchestrator.domain.state import SagaState, SagaStatus, fold
from ..orchestrator.domain.waits import PersonWait, waits
from ..orchestrator.ports import SagaSummaryRow
from ..participants.kit.ledger import awaiting
from ..participants.registry import get_participant
from ..schemas import wire
from ..schemas.event_types import (
    TERMINAL_EVENTS,
    Event,
    OperatorActionRefused,
    SagaCancelRefused,
    SagaPurged,
    SagaQuarantined,
    SagaRejected,
    SagaStarted,
)
from ..schemas.registry import default_registry
from .context import (
    JSON_HELP,
    console,
    database,
    deployed_definitions,
    deployment,
    fail,
    print_json,
    run,
    settings,
)

_DURATION = re.compile(r"^(\d+)([smhd])$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
FOLLOW_POLL_S = 0.25


def parse_duration(text: str, option: str = "--older-than") -> int:
    """``90s``, ``15m``, ``2h``, ``7d`` → milliseconds; a clear error naming ``option`` otherwise."""
    match = _DURATION.match(text.strip())
    if not match:
        fail(f"{option} {text!r} is not a duration; use a number and a unit: 90s, 15m, 2h or 7d")
    return int(match.group(1)) * _SECONDS[match.group(2)] * 1000


def when(epoch_ms: int) -> str:
    """Epoch milliseconds as a UTC time to the millisecond."""
    return datetime.fromtimestamp(epoch_ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def console_api() -> SagaApi | None:
    """The console's HTTP API, where the command line reads through it: SAGA_API_URL set and DATABASE_URL not."""
    current = settings()
    return api_of(current) if current.database_url is None else None


async def load_events_of(saga_id: str) -> list[Event]:
    """The saga's events from the store, or through the console's API (``console_api``), decoded (none for an
    unknown saga)."""
    api = console_api()
    if api is not None:
        try:
            return [wire.decode_event(body) for body in await api.encoded_events(saga_id)]
        except SagaNotFound:
            return []
        except ApiError as error:
            fail(str(error))
    async with database(settings()) as pool:
        stored = await reads_store(pool).events_after(saga_id, 0)
    return [wire.decode_event(row.body) for row in stored]


async def load_history(saga_id: str) -> list[Event]:
    """The saga's events from the store, decoded; exits with a message when there are none."""
    events = await load_events_of(saga_id)
    if not events:
        fail(f"no saga {saga_id!r} in the event store (check the id, or `saga list`)")
    return events


def folded(saga_id: str, events: list[Event]) -> SagaState:
    """The saga's state from ``events``; exits with what to do when they do not fold (a quarantined saga whose
    definition version is not deployed, say)."""
    try:
        return fold(deployed_definitions().for_history(events), events)
    except DomainError as error:
        quarantined = any(isinstance(event, SagaQuarantined) for event in events)
        fail(f"saga {saga_id!r} cannot be folded here: {type(error).__name__}: {error}"
             + ("; it is quarantined: deploy what it needs (SAGA_DEFINITIONS), then `saga release "
                f"{saga_id}`" if quarantined else "") + f"; `saga history {saga_id}` shows its events")


def status(saga_id: str = typer.Argument(..., help="The saga id."),
           as_json: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """Show the saga's state, folded from its events, and each step's state."""
    events = run(load_history(saga_id))
    state = folded(saga_id, events)
    if as_json:
        print_json(status_record(state, events, _waits(saga_id, state, events)))
        return
    console.print(f"saga [bold]{saga_id}[/] ({state.saga_type} v{state.definition_version}): "
                  f"[bold]{state.status.value}[/]" + (f" — {state.reason}" if state.reason else ""))
    if state.status is SagaStatus.PURGED:
        purged = next(event for event in events if isinstance(event, SagaPurged))
        console.print(f"ended {purged.final_status} at {when(purged.ended_at)}; events 1-{purged.purged_through_seq}"
                      f" purged at {when(purged.occurred_at)}" + (f" by {purged.operator}" if purged.operator else "")
                      + f" (SHA-256 {purged.purged_digest})")
        return
    if state.status is SagaStatus.QUARANTINED:
        console.print(f"[red]quarantined:[/] its messages are dead-lettered and its timers stopped; fix the cause, "
                      f"then `saga release {saga_id}`")
    if state.status is SagaStatus.COMPENSATION_FAILED:
        console.print(f"[red]needs a human:[/] step {state.compensation_failed_step}; fix the cause, then "
                      f"`saga resume {saga_id}`")
    if state.status is SagaStatus.REJECTED:
        console.print(f"nothing started; `saga dlq list --saga {saga_id}` shows the rejected message, "
                      f"`saga dlq replay --saga {saga_id}` sends it again once its cause is fixed")
        return
    table = Table("step", "status", "attempt", "compensation attempt", "last error")
    for step in state.steps.values():
        error = f"{step.last_error_type}: {step.last_error_message or ''}" if step.last_error_type else ""
        table.add_row(step.name, step.status.value, str(step.attempt), str(step.compensation_attempt), error)
    console.print(table)
    for waiting, why in _waits(saga_id, state, events):
        console.print(f"{waiting}: {why}", highlight=False)


def _waits(saga_id: str, state: SagaState, events: list[Event]) -> list[tuple[str, str]]:
    """What each open step of an unfinished saga waits on: (step, description)."""
    definition = deployed_definitions().for_history(events)
    if definition is None or state.is_terminal:
        return []
    persons = run(_persons(saga_id, definition))
    return [(wait.step, wait.describe()) for wait in waits(definition, state, events, persons)]


def status_record(state: SagaState, events: list[Event], open_waits: list[tuple[str, str]]) -> dict[str, Any]:
    """What ``saga status`` shows, as plain data (its ``--json``): the saga, each step, what open steps wait on
    and, for a purged saga, its purge; times as epoch milliseconds."""
    purged = next((event for event in events if isinstance(event, SagaPurged)), None)
    return {
        "saga_id": state.saga_id, "saga_type": state.saga_type, "definition_version": state.definition_version,
        "tenant_id": state.tenant_id, "status": state.status.value, "reason": state.reason, "paused": state.paused,
        "failed_step": state.failed_step, "compensation_failed_step": state.compensation_failed_step,
        "started_at_ms": state.started_at, "updated_at_ms": state.updated_at, "last_seq": state.last_seq,
        "steps": [{"name": step.name, "status": step.status.value, "attempt": step.attempt,
                   "compensation_attempt": step.compensation_attempt, "last_error_type": step.last_error_type,
                   "last_error_message": step.last_error_message} for step in state.steps.values()]
        if state.status is not SagaStatus.PURGED else [],
        "waits": [{"step": step, "waits_on": why} for step, why in open_waits],
        "purge": None if purged is None else {
            "final_status": purged.final_status, "ended_at_ms": purged.ended_at, "purged_at_ms": purged.occurred_at,
            "purged_through_seq": purged.purged_through_seq, "operator": purged.operator,
            "digest": purged.purged_digest},
    }


async def _persons(saga_id: str, definition: SagaDefinition) -> dict[str, PersonWait]:
    """The saga's commands whose participants deferred them to a person, by step (none where a participant's
    tables are not here, or it cannot be loaded)."""
    found: dict[str, PersonWait] = {}
    loaded = deployment(saga_types=False)
    async with database(settings()) as pool:
        for name in sorted({step.participant for step in definition.steps if not step.waits}):
            try:
                participant = get_participant(name, loaded)
                rows = await awaiting(pool, participant, saga_id)
            except (ValueError, asyncpg.UndefinedTableError):
                continue
            found |= {row.step: PersonWait(name, row.idempotency_key, row.deferred_at_ms, row.answer_by_ms)
                      for row in rows}
    return found


# Fields the timeline leaves out: they are in the columns, or ids and payloads `--json` shows.
_NOT_SHOWN = frozenset({"saga_id", "seq", "definition_version", "occurred_at", "step", "attempt", "input",
                        "output", "idempotency_key", "message_id", "timeout_at"})


def _row(event: Event) -> list[str]:
    fields = {k: v for k, v in vars(event).items() if k not in _NOT_SHOWN}
    if "due_at" in fields:
        fields["due_in"] = f"{(fields.pop('due_at') - event.occurred_at) / 1000:.1f}s"
    error = fields.pop("error_type", None)
    detail = ", ".join(f"{k}={v}" for k, v in fields.items() if v not in (None, b"", ()))
    return [str(event.seq), when(event.occurred_at), type(event).__name__, str(getattr(event, "step", "")),
            str(getattr(event, "attempt", "")), str(error or ""), detail]


def _line(event: Event) -> str:
    """One event on one line, for following: the timeline's columns, named where they may be empty."""
    seq, at, name, step, attempt, error, detail = _row(event)
    named = [f"{label}={value}" for label, value in (("step", step), ("attempt", attempt), ("error", error)) if value]
    return "  ".join([f"{seq:>3}", at, name, *named, *([detail] if detail else [])])


def _json(event: Event) -> str:
    record = {k: (v.hex() if isinstance(v, bytes) else v) for k, v in vars(event).items()}
    return json.dumps({"event": type(event).__name__, **record}, default=list)


async def follow_events(load_after: Callable[[int], Awaitable[list[Event]]], show: Callable[[Event], None],
                        poll_s: float = FOLLOW_POLL_S, waiting: Callable[[], None] | None = None,
                        after_seq: int = 0, lever: str | None = None) -> Event:
    """Show a saga's events as they are recorded, from the one after ``after_seq``, until it ends (the terminal
    event is returned), or a refusal of its start while nothing started (returned: the saga is REJECTED), or, with
    ``lever`` (an action's name), the refusal of that lever (returned).

    A terminal event after which the saga moved on (an ended saga a lever re-opened: resumed, re-driven,
    force-compensated) ends nothing: the follow goes on to the saga's latest end; refusals recorded after an end
    leave it ended. ``load_after(seq)`` returns the events after ``seq``; a saga not started yet is waited for
    (``waiting`` is called once when the first read finds nothing).
    """
    last_seq = after_seq
    started = after_seq > 0
    while True:
        events = await load_after(last_seq)
        if not events and last_seq == 0 and waiting is not None:
            waiting()
            waiting = None
        ended: Event | None = None
        for event in events:
            show(event)
            last_seq = event.seq
            started = started or isinstance(event, SagaStarted)
            if isinstance(event, SagaPurged) or (isinstance(event, SagaRejected) and not started):
                return event
            if lever is not None and isinstance(event, OperatorActionRefused) and event.action == lever:
                return event
            if isinstance(event, TERMINAL_EVENTS):
                ended = event
            elif not isinstance(event, _BYSTANDERS):
                ended = None
        if ended is not None:
            return ended
        await asyncio.sleep(poll_s)


# Recorded after a saga ended without moving it: a refused second start, a refused lever or cancel.
_BYSTANDERS = (SagaRejected, OperatorActionRefused, SagaCancelRefused)


async def follow(saga_id: str, as_json: bool = False, after_seq: int = 0, lever: str | None = None) -> Event:
    """Print the saga's events as they are recorded until it ends (``follow_events`` on the store)."""
    async with database(settings()) as pool:
        store = reads_store(pool)

        async def load_after(seq: int) -> list[Event]:
            return [wire.decode_event(row.body) for row in await store.events_after(saga_id, seq)]

        def show(event: Event) -> None:
            if as_json:
                console.print(_json(event), highlight=False, soft_wrap=True)
            else:
                console.print(_line(event), highlight=False, soft_wrap=True)

        def waiting() -> None:
            console.print(f"waiting for saga {saga_id} to start (Ctrl-C to stop)", style="dim")

        return await follow_events(load_after, show, waiting=waiting, after_seq=after_seq, lever=lever)


def history(saga_id: str = typer.Argument(..., help="The saga id."),
            as_json: bool = typer.Option(False, "--json", help="One JSON object per event."),
            live: bool = typer.Option(False, "--follow", "-f",
                                      help="Keep printing events as they are recorded, until the saga ends.")
            ) -> None:
    """The saga's timeline: time, event, step, attempt, error."""
    if live:
        try:
            run(follow(saga_id, as_json))
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        return
    events = run(load_history(saga_id))
    if as_json:
        for event in events:
            typer.echo(_json(event))  # one line each, as --follow prints them
        return
    table = Table("seq", "time (UTC)", "event", "step", "attempt", "error", "detail")
    for event in events:
        table.add_row(*_row(event))
    console.print(table)


def list_sagas(
    state: str | None = typer.Option(None, "--state", help="Only sagas in this state, e.g. RUNNING."),
    older_than: str | None = typer.Option(None, "--older-than", help="Not updated for this long: 90s, 15m, 2h."),
    saga_type: str | None = typer.Option(None, "--type", help="Only this saga type."),
    tenant: str | None = typer.Option(None, "--tenant", help="Only this tenant's sagas."),
    limit: int = typer.Option(100, "--limit", min=1, help="At most this many rows."),
    as_json: bool = typer.Option(False, "--json", help="As one JSON object: the rows (each the read model's row) "
                                                       "and the counts by state; times as epoch milliseconds."),
) -> None:
    """List sagas from the read model, the oldest started first: through the console's API when only
    SAGA_API_URL is set, else from the database (the same read either way)."""
    wanted = None
    if state is not None:
        wanted = state.strip().upper()
        allowed = {s.value for s in SagaStatus}
        if wanted not in allowed:
            fail(f"--state {state!r} is not a saga state; use one of {', '.join(sorted(allowed))}")
    older_than_s = parse_duration(older_than) / 1000 if older_than else None
    try:
        selection = (bulk_jobs.Selection(saga_type=saga_type, statuses=(wanted,) if wanted else (), tenant=tenant,
                                         older_than_s=older_than_s)
                     if wanted or saga_type or tenant or older_than_s else None)
    except bulk_jobs.BulkJobError as error:
        fail(str(error))

    async def query() -> tuple[list[SagaSummaryRow], dict[str, int]]:
        api = console_api()
        if api is not None:
            try:
                found = await api.sagas(status=wanted, saga_type=saga_type, tenant=tenant, limit=limit,
                                        older_than_s=older_than_s)
                return [SagaSummaryRow(**row) for row in found], (await api.fleet())["by_status"]
            except ApiError as error:
                fail(str(error))
        current = settings()
        async with database(current) as pool:
            reads = postgres_reads(pool, deployed_definitions(), default_registry())
            try:
                return await reads.sagas(selection, limit), await reads.counts()
            except bulk_jobs.BulkJobError as error:
                fail(str(error))

    rows, counts = run(query())
    if as_json:
        print_json({"sagas": [dataclasses.asdict(row) for row in rows], "counts": counts})
        return
    # The columns of the console's saga table (current step, its failures, its last error), then what ended or
    # unwound the saga: the failed step and the reason.
    table = Table("saga", "type", "state", "started (UTC)", "updated (UTC)", "events", "current step", "failures",
                  "last error", "failed step", "reason")
    for row in rows:
        table.add_row(row.saga_id, row.saga_type, row.status, when(row.started_at_ms), when(row.updated_at_ms),
                      str(row.last_seq), row.current_step or "", str(row.step_failures or ""), row.last_error or "",
                      row.failed_step or "", (row.reason or "")[:60])
    console.print(table)
    console.print("  ".join(f"{name}: {count}" for name, count in sorted(counts.items())) or "no sagas")


def effects(saga_id: str = typer.Argument(..., help="The saga id."),
            as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Each participant's business records for the saga, counted as the participant declares them (its
    ``EffectTable``: e.g. booked, cancelled)."""
    from ..participants.kit.effects import read_effects
    from ..participants.registry import deployment_participants

    current = settings()
    declaring = [p for p in deployment_participants(current) if p.effects is not None]
    if not declaring:
        console.print("no participant of this deployment declares its effects (Participant.effects)")
        raise typer.Exit(1)

    async def query() -> Any:
        async with database(current) as pool:
            return await read_effects(pool, declaring, saga_id)

    found = run(query())
    if as_json:
        console.print_json(json.dumps(found.to_dict()))
        return
    table = Table("participant", "record", "count")
    for participant, counts in found.counts().items():
        for record, count in counts.items():
            table.add_row(participant, record, str(count))
    console.print(table)
