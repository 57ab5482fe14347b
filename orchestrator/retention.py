"""What the orchestrator forgets, and when: ended sagas give up their events (retention), and the inbox its
oldest message ids.

Retention: sagas that ended before a cutoff give up their events for one SagaPurged each, on demand
(``saga purge``) or as a policy (SAGA_RETENTION_DAYS). A batch is one unit of work: it locks the read-model
rows of up to ``limit`` ended sagas (skipping rows another transaction holds), folds each saga from its events,
appends its SagaPurged (published on saga.events through the outbox like every event), deletes the events it
replaces and their timers, and moves the read model to PURGED. The orchestrator can be running: if it records
an event for one of these sagas meanwhile, the two appends of the same seq conflict, and the batch is retried
without that saga (it no longer qualifies).

The inbox holds one row per handled message (its id) so that a redelivered message is skipped; it would
otherwise grow by about five rows per saga, forever. A message comes again after a consumer crash or a
rebalance (seconds later), after a relay crash (its rows are published again, minutes later at most), or when
a consumer group whose committed offsets expired reads its topics from the beginning: never once the topic has
dropped it. So rows older than the retention of the topics the orchestrator reads are of no further use. The
domain stays safe even then: a late reply changes nothing, a second start of a known saga is refused.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ..infra.chores import CHORE_EVERY_S, Chore
from ..infra.failures import Fault, classify
from ..schemas import wire
from ..schemas.ids import purge_causation_id
from ..schemas.topics import Topics
from .domain.decide import Decision
from .domain.definition import DefinitionRegistry
from .domain.model import PURGEABLE_STATUSES
from .domain.retention import may_purge, purged_event
from .domain.state import apply_event, fold
from .outbound import PendingWrites
from .ports import ConcurrencyConflict, PurgeStore
from .store.postgres import PostgresStore

log = logging.getLogger("saga.orchestrator.purge")

RETENTION_OPERATOR = "retention policy"
PURGE_BATCH = 200
_PURGEABLE = sorted(status.value for status in PURGEABLE_STATUSES)
_RETRIES = 5


async def count_purgeable(store: PurgeStore, ended_before_ms: int) -> int:
    """Sagas whose read-model row says they ended before the cutoff (what a purge would take)."""
    return await store.count_ended(_PURGEABLE, ended_before_ms)


async def purge_batch(store: PurgeStore, registry: DefinitionRegistry, topics: Topics, *, ended_before_ms: int,
                      now_ms: int, operator: str | None = None, limit: int = PURGE_BATCH,
                      skip: set[str] | None = None) -> tuple[list[str], int]:
    """Purge up to ``limit`` sagas that ended before ``ended_before_ms``; (their ids, how many candidates were
    looked at). Fewer candidates than ``limit``: nothing is left to purge. Sagas found not to qualify (their
    read-model row was behind, or they cannot be folded) are added to ``skip`` and passed over from then on."""
    skip = set() if skip is None else skip
    for _ in range(_RETRIES):
        try:
            return await _purge_once(store, registry, topics, ended_before_ms, now_ms, operator, limit, skip)
        except Exception as error:
            if classify(error) is not Fault.CONFLICT:
                raise
            log.info("purge batch met a concurrent write, retrying", extra={"error": repr(error)})
    raise ConcurrencyConflict(f"purge: gave up after {_RETRIES} conflicts")


async def purge_ended(store: PurgeStore, registry: DefinitionRegistry, topics: Topics, *, ended_before_ms: int,
                      now_ms: int, operator: str | None = None, batch: int = PURGE_BATCH,
                      progress: Callable[[int], None] | None = None) -> int:
    """Purge every saga that ended before ``ended_before_ms``, ``batch`` per transaction; how many were purged.
    ``progress`` is told the running total after each batch."""
    skip: set[str] = set()
    purged = 0
    while True:
        done, looked_at = await purge_batch(store, registry, topics, ended_before_ms=ended_before_ms, now_ms=now_ms,
                                            operator=operator, limit=batch, skip=skip)
        purged += len(done)
        if progress is not None:
            progress(purged)
        if looked_at < batch:
            return purged


async def _purge_once(store: PurgeStore, registry: DefinitionRegistry, topics: Topics, ended_before_ms: int,
                      now_ms: int, operator: str | None, limit: int, skip: set[str]) -> tuple[list[str], int]:
    async with store.begin() as uow:
        candidates = await uow.claim_ended(_PURGEABLE, ended_before_ms, limit, sorted(skip))
        stored = await uow.load_events_after({saga_id: 0 for saga_id in candidates})
        writes = PendingWrites(topics)
        through: dict[str, int] = {}
        for saga_id in candidates:
            rows = stored.get(saga_id, [])
            try:
                events = [wire.decode_event(row.body) for row in rows]
                state = fold(registry.for_history(events), events)
            except Exception as error:  # an unknown definition or a broken history: never purged blind
                log.warning("saga not purged: cannot fold it", extra={"saga_id": saga_id, "error": repr(error)})
                skip.add(saga_id)
                continue
            if not may_purge(state, ended_before_ms):
                skip.add(saga_id)  # the read model was behind its events
                continue
            event = purged_event(state, [row.body for row in rows], now_ms, operator)
            writes.record(Decision(events=(event,), state=apply_event(None, state, event)),
                          purge_causation_id(saga_id, event.seq))
            through[saga_id] = state.last_seq
        await uow.delete_events_through(through)
        await writes.flush(uow)
    for saga_id in through:
        log.info("saga purged", extra={"saga_id": saga_id, "through_seq": through[saga_id]})
    return list(through), len(candidates)


def retention_policy(store: PurgeStore, registry: DefinitionRegistry, topics: Topics, retention_s: float,
                     every_s: float = CHORE_EVERY_S) -> Chore:
    """The chore purging, every ``every_s``, the sagas that ended more than ``retention_s`` ago (as ``saga purge
    --ended-before`` would, recorded with the operator ``retention policy``)."""

    async def purge() -> int:
        now_ms = int(time.time() * 1000)
        return await purge_ended(store, registry, topics, ended_before_ms=now_ms - int(retention_s * 1000),
                                 now_ms=now_ms, operator=RETENTION_OPERATOR)

    return Chore("retention policy", purge, every_s, retention_s=retention_s)


def inbox_pruner(store: PostgresStore, retention_s: float, every_s: float = CHORE_EVERY_S) -> Chore:
    """The chore deleting, every ``every_s``, the inbox rows received more than ``retention_s`` ago."""
    return Chore("inbox pruning", lambda: store.prune_inbox(retention_s), every_s, retention_s=retention_s)
