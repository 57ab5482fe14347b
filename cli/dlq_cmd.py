"""``saga dlq list``, ``saga dlq replay`` and ``saga dlq dismiss``: what the services dead-lettered, sending it
again, and marking it handled without sending it.

What a replay publishes and records, and when it is held back, and what a dismissal marks and audits, is
``operations.dead_letters``' (the console's dead-letter page works through it too); this module reads the command
line and prints. ``list`` shows, beside
each letter, the replays its saga's history records. Both answer from the dead-letter index the orchestrator keeps
in Postgres; ``list --live`` reads saga.dlq itself (every record on it: slower, and needs no orchestrator).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Annotated

import typer
from rich.table import Table

from ..infra.db import create_pool
from ..infra.settings import Settings
from ..operations import dead_letters
from ..operations.audit import OperatorAudit
from ..operations.dead_letters import DeadLetterError, Dismissed, Parked, Replay
from ..operations.postgres import dead_letter_index, lever_store, reads_store
from ..orchestrator import recorded_replays as histories
from ..orchestrator.ports import LetterFilter
from ..orchestrator.recorded_replays import Replayed
from .context import (
    OPERATOR_HELP,
    console,
    database,
    fail,
    kafka_clients,
    operator_or_login,
    print_json,
    producer,
    run,
    settings,
    topics,
)
from .inspect_cmd import parse_duration, when

dlq_app = typer.Typer(no_args_is_help=True, help="Dead letters on saga.dlq: list them, replay them, dismiss them.")

FORCE_HINT = "--force replays it anyway"
RESUME_HINT = "`saga resume` retries its compensation"


async def read_parked(current: Settings) -> list[Parked]:
    """Every record on saga.dlq up to its end when called, in partition then offset order; stops the command
    with what to do when saga.dlq cannot be read."""
    kafka = await kafka_clients(current)
    try:
        return await dead_letters.read_parked(kafka, topics(current).dlq)
    except DeadLetterError as error:
        fail(str(error))


@dlq_app.command("list")
def list_letters(
    saga_id: str | None = typer.Option(None, "--saga", help="Only letters of this saga id."),
    source: str | None = typer.Option(None, "--source", help="Only letters from this topic, e.g. saga.start."),
    reason: str | None = typer.Option(None, "--reason", help="Only letters whose reason contains this text."),
    since: str | None = typer.Option(None, "--since", help="Only letters of the last 90s, 15m, 2h, 7d."),
    limit: int = typer.Option(100, "--limit", min=1, help="At most this many, the newest of those that match."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per letter, with the original bytes."),
    live: bool = typer.Option(False, "--live", help="Read saga.dlq itself, not the orchestrator's index of it."),
) -> None:
    """List dead letters: where each came from, why, and its position for `saga dlq replay`."""
    since_ms = int(time.time() * 1000) - parse_duration(since, "--since") if since else None
    current = settings()
    dismissals: dict[str, Dismissed] = {}  # the index keeps them: none with --live
    if live:
        parked = run(read_parked(current))
        chosen = [p for p in parked if dead_letters.matches(p, saga_id, source, reason, since_ms)]
        shown = dead_letters.newest(chosen, limit)
        counted = f"{len(chosen)} match, {len(parked)} on {topics(current).dlq}"
    else:
        found, held = run(indexed(current, LetterFilter(saga_id, source, reason, since_ms), limit))
        shown = [item for item, _ in found[::-1]]  # oldest first, as the table reads
        dismissals = {item.position: dismissed for item, dismissed in found if dismissed is not None}
        counted = f"{held} indexed from {topics(current).dlq}"
    replays, unknown = run(recorded_replays(current, {p.letter.saga_id for p in shown
                                                      if p.letter and p.letter.saga_id}))
    if as_json:
        for item in shown:
            print_json({**dead_letters.letter_record(item, replays.get(item.position, [])),
                        "dismissed": dead_letters.dismissal_record(dismissals.get(item.position))})
        return
    table = Table("position", "failed at (UTC)", "consumer", "from", "saga", "reason", "bytes", "replayed",
                  title=f"dead letters on {topics(current).dlq}")
    for item in shown:
        table.add_row(*_columns(item), _replays_cell(replays.get(item.position, []), dismissals.get(item.position)))
    console.print(table)
    console.print(f"{len(shown)} shown, {counted}")
    if unknown:
        console.print(f"replays not shown: {unknown}")


async def indexed(current: Settings, where: LetterFilter,
                  limit: int) -> tuple[list[tuple[Parked, Dismissed | None]], int]:
    """The ``limit`` letters of the index that pass ``where``, newest first, each with its dismissal, and how many
    the index holds."""
    async with database(current) as pool:
        index = dead_letter_index(pool)
        return await dead_letters.listed(index, where, limit), await index.count()


async def chosen_letters(current: Settings, wanted: Sequence[tuple[int, int]], saga_id: str | None) -> list[Parked]:
    """The indexed letters a replay names (``dead_letters.chosen``); stops the command with why when one is not
    there."""
    async with database(current) as pool:
        try:
            return await dead_letters.chosen(dead_letter_index(pool), wanted, saga_id, topics(current).dlq)
        except DeadLetterError as error:
            fail(str(error))


async def mark_replayed(current: Settings, positions: Sequence[tuple[int, int]]) -> None:
    async with database(current) as pool:
        await dead_letter_index(pool).mark_replayed(positions, int(time.time() * 1000))


async def recorded_replays(current: Settings, saga_ids: set[str]) -> tuple[dict[str, list[Replayed]], str | None]:
    """The replays the histories of ``saga_ids`` record, by letter position; and, when the event store cannot be
    read, why not (listing letters needs Kafka only, so that is no error)."""
    if not saga_ids:
        return {}, None
    try:
        pool = await asyncio.wait_for(create_pool(current.dsn(), 2), timeout=15)
    except Exception as error:  # whatever keeps the store out of reach is only reported
        return {}, f"the event store at {current.dsn()} is out of reach ({type(error).__name__}: {error})"
    try:
        return await histories.recorded_replays(reads_store(pool), saga_ids), None
    finally:
        await pool.close()


def _replays_cell(replays: Sequence[Replayed], dismissed: Dismissed | None = None) -> str:
    said = []
    if replays:
        last = replays[-1]
        said.append(f"{len(replays)}x, last by {last.operator or '?'} at {when(last.at_ms)}")
    if dismissed is not None:
        said.append(f"dismissed by {dismissed.operator}: {dismissed.reason}")
    return "; ".join(said)


def _columns(parked: Parked) -> list[str]:
    letter = parked.letter
    if letter is None:
        return [parked.position, when(parked.timestamp_ms), "", "", "", "[red]not a readable dead letter", ""]
    size = "not kept" if letter.original_value is None else f"{len(letter.original_value):,}"
    return [parked.position, when(letter.failed_at), letter.consumer,
            f"{letter.source_topic} {letter.source_partition}:{letter.source_offset}", letter.saga_id or "",
            letter.reason[:100], size]


@dlq_app.command("replay")
def replay(
    positions: Annotated[list[str] | None, typer.Argument(
        help="Letters to replay, as PARTITION:OFFSET (`saga dlq list`).")] = None,
    saga_id: str | None = typer.Option(None, "--saga", help="Replay every letter of this saga id, oldest first."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show what would be published; publish nothing."),
    force: bool = typer.Option(False, "--force", help="Replay commands and replies of sagas that ended too."),
    operator: str | None = typer.Option(None, "--operator", help=OPERATOR_HELP),
    because: str | None = typer.Option(None, "--reason", help="Why (what was fixed); recorded with each replay."),
) -> None:
    """Publish dead-lettered records again to their source topics, once their cause is fixed.

    A step command or reply of a saga that has ended is not replayed (without --force): the saga may have
    undone that step since, and a late command would do it again. Each replay names its operator (header
    ``replayed_by``) and is recorded in the history of the letter's saga, when it has one."""
    try:
        wanted = [dead_letters.parse_position(text) for text in positions or []]
    except DeadLetterError as error:
        fail(str(error))
    if not wanted and saga_id is None:
        fail("name the letters to replay: positions as PARTITION:OFFSET, or --saga ID (see `saga dlq list`)")
    who = operator_or_login(operator)
    current = settings()
    dlq_topic = topics(current).dlq
    chosen = run(chosen_letters(current, wanted, saga_id))
    plan = run(dead_letters.plan_replays(chosen, dlq_topic, who, lambda ids: saga_statuses(current, ids),
                                         force=force, force_hint=FORCE_HINT, resume_hint=RESUME_HINT))
    for item, why in plan.refused:
        console.print(f"[red]{item.position} not replayed:[/] {why}")
    if not dry_run and plan.replays:
        run(_publish([record for _, record in plan.replays], current))
        run(_publish([dead_letters.note_record(note, topics(current).control) for note in plan.notes(who, because)],
                     current))
        run(mark_replayed(current, [(item.partition, item.offset) for item, _ in plan.replays]))
    verb = "would publish" if dry_run else "published"
    for item, record in plan.replays:
        saga = item.letter.saga_id if item.letter else None
        noted = "recorded in its history" if plan.recorded(item) else "no history to record it in"
        console.print(f"{item.position} {verb} to {record.topic}" + (f" (saga {saga}); {noted}" if saga else ""))
    console.print(f"{len(plan.replays)} {verb} by {who}, {len(plan.refused)} not replayable")
    if plan.refused:
        raise typer.Exit(1)


@dlq_app.command("dismiss")
def dismiss(
    positions: Annotated[list[str], typer.Argument(help="Letters to dismiss, as PARTITION:OFFSET (`saga dlq list`).")],
    because: str = typer.Option(..., "--reason", help="Why the letters must never be sent again (required)."),
    operator: str | None = typer.Option(None, "--operator", help=OPERATOR_HELP),
) -> None:
    """Mark dead letters handled without replaying them: nothing is re-sent, and they leave the inbox.

    For a letter that must never be sent again: a record nobody can read, a lever the orchestrator refused that
    would be stale now, a start made by mistake. Each dismissal names its operator and reason and is in the
    operator audit (`saga operator-log`); a dismissed letter can still be replayed later on purpose."""
    who = operator_or_login(operator)
    current = settings()
    done = run(_dismiss(current, positions, who, because))
    for item in done:
        console.print(f"{item.position} dismissed by {who}: {because.strip()}")
    console.print(f"{len(done)} dismissed by {who}; nothing re-sent")


async def _dismiss(current: Settings, positions: Sequence[str], operator: str, reason: str) -> list[Parked]:
    """``dead_letters.dismiss`` on the index and the operator audit; stops the command with why when refused."""
    async with database(current) as pool:
        try:
            return await dead_letters.dismiss(dead_letter_index(pool), OperatorAudit(lever_store(pool)), positions,
                                              operator, reason, int(time.time() * 1000), topics(current).dlq)
        except DeadLetterError as error:
            fail(str(error))


async def saga_statuses(current: Settings, saga_ids: set[str]) -> dict[str, str]:
    """The read model's state of each of ``saga_ids`` that has one, through a pool of its own (none when there are
    no sagas to look up)."""
    if not saga_ids:
        return {}
    async with database(current) as pool:
        return await reads_store(pool).saga_statuses(saga_ids)


async def _publish(records: Sequence[Replay], current: Settings) -> None:
    async with producer(current) as kafka:
        await dead_letters.publish(kafka, records)
