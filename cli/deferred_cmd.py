"""``saga awaiting`` and ``saga answer``: the commands whose participant deferred its answer, and answering one."""

from __future__ import annotations

import datetime as dt
import json
from typing import NoReturn

import asyncpg
import typer
from rich.table import Table

from ..participants.kit.deferred import complete, why_not_awaiting
from ..participants.kit.ledger import awaiting
from ..participants.kit.outcome import Failed, Succeeded
from ..participants.kit.participant import Participant
from ..participants.registry import get_participant
from .context import OPERATOR_HELP, console, database, deployment, fail, operator_or_login, run, settings, topics

PARTICIPANT_HELP = "A participant: flight, hotel, payment, notification, or module:attribute."


def _participant(name: str) -> Participant:
    try:
        return get_participant(name, deployment(saga_types=False))
    except ValueError as error:
        fail(str(error))


def _no_tables(participant: Participant) -> NoReturn:
    fail(f"participant {participant.name} has no tables in this database yet: start it once "
         f"(`saga run participant ...`), or check DATABASE_URL")


def awaiting_command(
    name: str = typer.Argument(..., help=PARTICIPANT_HELP),
    saga_id: str | None = typer.Option(None, "--saga", help="Only this saga's commands."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per line."),
) -> None:
    """List the commands whose handler deferred its answer (oldest first); `saga answer` answers one."""
    participant = _participant(name)

    async def body() -> list[dict[str, object]]:
        async with database(settings()) as pool:
            try:
                return [vars(row) for row in await awaiting(pool, participant, saga_id)]
            except asyncpg.UndefinedTableError:
                _no_tables(participant)

    rows = run(body())
    if as_json:
        for row in rows:
            typer.echo(json.dumps(row))
        return
    table = Table("since", "idempotency key", "saga", "step", "action", "attempt", title=f"{participant.name}: "
                  f"{len(rows)} awaiting an answer")
    for row in rows:
        since = dt.datetime.fromtimestamp(int(str(row["deferred_at_ms"])) / 1000, dt.UTC)
        table.add_row(since.strftime("%Y-%m-%d %H:%M:%S"), *(str(row[key]) for key in
                                                               ("idempotency_key", "saga_id", "step", "action",
                                                                "attempt")))
    console.print(table)


def answer_command(
    name: str = typer.Argument(..., help=PARTICIPANT_HELP),
    key: str = typer.Argument(..., help="The idempotency key of the awaiting command (see `saga awaiting`)."),
    output: str | None = typer.Option(None, "--output", help="Succeeded, with this output: for a typed action, JSON "
                                                             "of its output model (checked, then encoded as its "
                                                             "record); else UTF-8 text."),
    fail_as: str | None = typer.Option(None, "--fail", help="Failed definitively, with this error type."),
    message: str = typer.Option("", "--message", help="With --fail: what went wrong."),
    operator: str | None = typer.Option(None, "--operator", help=OPERATOR_HELP),
    detail: str | None = typer.Option(None, "--detail", help="Why this answer; recorded with the operator."),
) -> None:
    """Answer a command whose handler deferred its answer: the step succeeds (--output) or fails (--fail). The
    saga's history records who answered, and why (OperatorAction Answer)."""
    if (output is None) == (fail_as is None):
        fail("give exactly one of --output (the step succeeded) or --fail ERROR_TYPE (it failed)")
    if fail_as is not None and not fail_as.strip():
        fail("--fail needs an error type, e.g. --fail Rejected")
    participant = _participant(name)
    outcome = Succeeded(output.encode()) if output is not None else Failed(str(fail_as), message)
    who = operator_or_login(operator)
    current = settings()

    async def body() -> str | None:
        async with database(current) as pool, pool.acquire() as conn, conn.transaction():
            try:
                if await complete(conn, participant, topics(current), key, outcome, operator=who, detail=detail):
                    return None
                return await why_not_awaiting(conn, participant, key)
            except asyncpg.UndefinedTableError:
                _no_tables(participant)
            except ValueError as error:  # an answer its action's output model refuses: nothing was recorded
                return str(error)

    refused = run(body())
    if refused is not None:
        fail(f"answer refused: {refused} (`saga awaiting {name}` lists what awaits an answer)")
    verdict = "succeeded" if output is not None else f"failed ({fail_as})"
    console.print(f"answered {key} as {who}: {verdict}; {participant.name}'s relay publishes the reply")
