"""``saga reproject``: rebuild the saga_summary read model from the event store.

The read model is a projection: every row follows from its saga's events. When it is lost, damaged or its
projection changed, this folds every saga again and repairs the rows that disagree (missing ones included),
batch by batch, while the services run: a row the orchestrator moved past meanwhile (a higher ``last_seq``)
is left as it is, because the upsert never lowers ``last_seq``. Rows of sagas without events are removed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from ..orchestrator.domain.definition import DefinitionRegistry
from ..orchestrator.domain.state import SagaState, fold
from ..orchestrator.invariants import summary_problems
from ..orchestrator.outbound import summary_of
from ..orchestrator.ports import Writes
from ..schemas import wire
from ..schemas.event_types import Event
from .ports import ReprojectionStore

BATCH_SIZE = 1_000


@dataclass
class Reprojection:
    """What a reprojection found and did."""

    sagas: int = 0
    repaired: int = 0  # rows that were missing or disagreed with the fold
    removed: int = 0  # rows of sagas without events
    unfoldable: list[tuple[str, str]] = field(default_factory=list)  # (saga id, why), left untouched


async def histories(store: ReprojectionStore) -> AsyncIterator[tuple[str, list[Event]]]:
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


async def reproject(store: ReprojectionStore, registry: DefinitionRegistry, dry_run: bool = False) -> Reprojection:
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


async def _repair(store: ReprojectionStore, states: list[SagaState], dry_run: bool) -> int:
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
