"""``saga reproject``: rebuild the saga_summary read model from the event store.

The read model is a projection: every row follows from its saga's events. When it is lost, damaged or its
projection changed, this folds every saga again and repairs the rows that disagree (missing ones included),
batch by batch, while the services run: a row the orchestrator moved past meanwhile (a higher ``last_seq``)
is left as it is, because the upsert never lowers ``last_seq``. Rows of sagas without events are removed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import typer
from rich.table import Table

from ..orchestrator.bootstrap import definitions
from ..orchestrator.domain.definition import DefinitionRegistry
from ..orchestrator.domain.state import SagaState, fold
from ..orchestrator.invariants import summary_problems
from ..orchestrator.outbound import summary_of
from ..orchestrator.ports import Writes
from ..orchestrator.store.postgres import PostgresStore
from ..schemas import wire
from ..schemas.event_types import Event
from .context import console, database, run, settings

BATCH_SIZE = 1_000


@dataclass
class Reprojection:
    """What a reprojection found and did."""

    sagas: int = 0
    repaired: int = 0  # rows that were missing or disagreed with the fold
    removed: int = 0  # rows of sagas without events
    unfoldable: list[tuple[str, str]] = field(default_factory=list)  # (saga id, why), left untouched


async def histories(store: PostgresStore) -> AsyncIterator[tuple[str, list[Event]]]:
    """Every saga's decoded events, one saga at a time, in saga id order."""
    saga_id: str | None = None
    events: list[Event] = []
    async for row in store.iter_events():
        if row.saga_id != saga_id:
            if saga_id is not None:
                yield saga_id, events
            saga_id, events = row.saga_id, []
        events.append(wire.decode_event(row.body))
    if saga_id is not None:
        yield saga_id, events


async def reproject(store: PostgresStore, registry: DefinitionRegistry, dry_run: bool = False) -> Reprojection:
    """Fold every saga and repair its read-model row where it disagrees; remove rows without events."""
    result = Reprojection()
    folded: list[SagaState] = []
    async for saga_id, events in histories(store):
        result.sagas += 1
        try:
            folded.append(fold(registry.for_history(events), events))
        except Exception as error:  # an unknown definition or a broken history: report, never guess
            result.unfoldable.append((saga_id, f"{type(error).__name__}: {error}"))
        if len(folded) >= BATCH_SIZE:
            result.repaired += await _repair(store, folded, dry_run)
            folded = []
    result.repaired += await _repair(store, folded, dry_run)
    result.removed = await store.remove_orphan_summaries(dry_run)
    return result


async def _repair(store: PostgresStore, states: list[SagaState], dry_run: bool) -> int:
    if not states:
        return 0
    current = await store.summaries_of([state.saga_id for state in states])
    # A row ahead of the fold (the orchestrator recorded more since) is newer, not wrong: the upsert keeps it.
    wrong = [summary_of(state) for state in states if summary_problems(state, row := current.get(state.saga_id))
             and (row is None or row.last_seq <= state.last_seq)]
    if wrong and not dry_run:
        async with store.begin() as uow:
            await uow.write(Writes(summaries=wrong))
    return len(wrong)


def reproject_command(
    dry_run: bool = typer.Option(False, "--dry-run", help="Count what would change; change nothing."),
) -> None:
    """Rebuild the saga_summary read model from the event store (safe while the services run)."""

    async def body() -> Reprojection:
        current = settings()
        async with database(current) as pool:
            return await reproject(PostgresStore(pool), definitions(current), dry_run)

    result = run(body())
    verb = "would be" if dry_run else "were"
    table = Table("figure", "value", title="saga_summary from the events")
    table.add_row("sagas folded", str(result.sagas))
    table.add_row(f"rows that {verb} repaired (missing or wrong)", str(result.repaired))
    table.add_row(f"rows that {verb} removed (no events)", str(result.removed))
    table.add_row("sagas that cannot be folded (left as they are)", str(len(result.unfoldable)))
    console.print(table)
    for saga_id, why in result.unfoldable[:20]:
        console.print(f"[red]{saga_id}[/]: {why}")
    if result.unfoldable:
        raise typer.Exit(1)
