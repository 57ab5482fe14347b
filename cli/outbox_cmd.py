"""``saga outbox``: the rows an outbox relay parked because the broker refused them for good.

While a saga has a parked row, its later rows wait in the outbox behind it (in order) and everything else is
published. Fix the cause (raise the topic's ``max.message.bytes``, create the topic), then ``requeue`` the row;
or ``discard`` it, and the rows behind it go on.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated

import typer
from rich.table import Table

from ..infra.db import check_identifier
from ..outbox.parked import discard_parked, list_parked, requeue_parked
from .context import console, database, fail, print_json, run, settings

outbox_app = typer.Typer(no_args_is_help=True, help="Outbox rows the broker refused: list, requeue, discard.")

IDS_HELP = "Parked row ids, as `saga outbox list` shows them."
SCHEMA_HELP = "Schema of the outbox: saga (the orchestrator's, default) or a participant's (e.g. flight)."


def _table(schema: str) -> str:
    try:
        return f"{check_identifier(schema)}.outbox"
    except ValueError:
        fail(f"--schema {schema!r} is not a schema name; use saga or a participant's schema, e.g. flight")


@outbox_app.command("list")
def list_command(schema: str = typer.Option("saga", "--schema", help=SCHEMA_HELP),
                 saga_id: str | None = typer.Option(None, "--saga", help="Only this saga's rows."),
                 as_json: bool = typer.Option(False, "--json", help="One JSON object per row (parked_at as ISO "
                                                                    "8601 with its offset).")) -> None:
    """List the parked rows, oldest first, with why the broker refused each."""
    table = _table(schema)

    async def body() -> None:
        async with database(settings()) as pool:
            rows = await list_parked(pool, table, saga_id)
        if as_json:
            for row in rows:
                print_json({**dataclasses.asdict(row), "parked_at": row.parked_at.isoformat()})
            return
        if not rows:
            console.print(f"no parked rows in {table}")
            return
        view = Table("id", "topic", "key", "message id", "bytes", "parked at", "reason")
        for row in rows:
            view.add_row(str(row.id), row.topic, row.key, row.message_id, str(row.size),
                         row.parked_at.isoformat(timespec="seconds"), row.reason)
        console.print(view)

    run(body())


def _act(ids: list[int], schema: str, requeue: bool) -> None:
    table = _table(schema)

    async def body() -> int:
        async with database(settings()) as pool:
            return await (requeue_parked if requeue else discard_parked)(pool, table, ids)

    done = run(body())
    missing = len(set(ids)) - done
    console.print(f"{'requeued' if requeue else 'discarded'} {done} row(s) of {table}")
    if missing:
        fail(f"{missing} of the ids given are not parked in {table}; `saga outbox list --schema {schema}` shows "
             "them", code=1)


@outbox_app.command("requeue")
def requeue_command(ids: Annotated[list[int], typer.Argument(help=IDS_HELP)],
                    schema: str = typer.Option("saga", "--schema", help=SCHEMA_HELP)) -> None:
    """Put parked rows back into the outbox, ahead of the rows of their saga that waited behind them."""
    _act(ids, schema, requeue=True)


@outbox_app.command("discard")
def discard_command(ids: Annotated[list[int], typer.Argument(help=IDS_HELP)],
                    schema: str = typer.Option("saga", "--schema", help=SCHEMA_HELP)) -> None:
    """Delete parked rows for good; the rows of their saga that waited behind them are published."""
    _act(ids, schema, requeue=False)
