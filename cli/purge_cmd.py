"""``saga purge``: retention. Sagas that ended before a cutoff give up their events for one SagaPurged each."""

from __future__ import annotations

import time

import typer
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from ..operations.postgres import event_store
from ..orchestrator.retention import PURGE_BATCH, count_purgeable, purge_ended
from .context import console, database, deployed_definitions, fail, run, settings, topics
from .inspect_cmd import parse_duration


def purge(
    ended_before: str = typer.Option(..., "--ended-before", help="Purge sagas that ended this long ago or more: "
                                                                 "90s, 15m, 2h, 30d."),
    operator: str | None = typer.Option(None, "--operator", help="Who is purging; recorded in SagaPurged."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Count the sagas a purge would take; change nothing."),
    batch: int = typer.Option(PURGE_BATCH, "--batch", min=1, help="Sagas per transaction."),
) -> None:
    """Delete the events of sagas that ended before a cutoff, leaving one SagaPurged each (retention)."""
    now_ms = int(time.time() * 1000)
    cutoff_ms = now_ms - parse_duration(ended_before, "--ended-before")
    current = settings()

    async def body() -> tuple[int, int]:
        async with database(current) as pool:
            store = event_store(pool)
            eligible = await count_purgeable(store, cutoff_ms)
            if dry_run:
                return eligible, 0
            with Progress(SpinnerColumn(), TextColumn("purging: {task.completed} of about {task.total} sagas"),
                          TimeElapsedColumn(), console=console, transient=True) as progress:
                task = progress.add_task("purge", total=eligible)
                purged = await purge_ended(store, deployed_definitions(), topics(current), ended_before_ms=cutoff_ms,
                                           now_ms=now_ms, operator=operator, batch=batch,
                                           progress=lambda done: progress.update(task, completed=done))
                return eligible, purged

    eligible, purged = run(body())
    if dry_run:
        console.print(f"{eligible} sagas ended before the cutoff; `saga purge` without --dry-run purges them")
        return
    console.print(f"purged {purged} sagas (events deleted, one SagaPurged each); {eligible - purged} not purged")
    if purged < eligible:
        fail("some sagas could not be purged: the log lines `saga not purged` say why", code=1)
