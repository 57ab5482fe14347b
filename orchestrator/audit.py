"""``saga audit``: every saga rebuilt from ``saga.events`` alone, compared with the event store.

The topic must hold every stored event with the same bytes (a purged saga's earlier events match its
SagaPurged digest), and each saga folds to the same state from either source.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from ..client.event_feed import EventFeed
from ..infra.db import create_pool
from ..infra.settings import Settings
from ..schemas import wire
from ..schemas.event_types import Event, SagaPurged
from ..schemas.topics import Topics
from .bootstrap import definitions
from .domain.definition import DefinitionRegistry
from .domain.errors import UnknownDefinition
from .domain.retention import purged_digest
from .domain.state import fold
from .store.postgres import PostgresStore

EventKey = tuple[str, int]


@dataclass(frozen=True)
class Difference:
    """One way the topic and the store disagree."""

    saga_id: str
    seq: int | None
    problem: str


def compare_streams(stored: Mapping[EventKey, bytes], published: Mapping[EventKey, set[bytes]]) -> list[Difference]:
    """Every event missing on one side, or published with bytes other than the stored ones."""
    differences = []
    for key, body in stored.items():
        copies = published.get(key)
        if copies is None:
            differences.append(Difference(key[0], key[1], "in the store, not on the topic"))
        elif copies != {body}:
            differences.append(Difference(key[0], key[1], "the topic's bytes differ from the store's"))
    for key in published.keys() - stored.keys():
        differences.append(Difference(key[0], key[1], "on the topic, not in the store"))
    return sorted(differences, key=lambda d: (d.saga_id, d.seq or 0))


def compare_states(registry: DefinitionRegistry, from_store: Mapping[str, list[Event]],
                   from_topic: Mapping[str, list[Event]]) -> tuple[list[Difference], Counter[str]]:
    """Fold each saga from both sources; a different status is a difference. Returns statuses too."""
    differences = []
    statuses: Counter[str] = Counter()
    for saga_id, events in from_topic.items():
        try:
            topic_state = fold(registry.for_history(events), events)
        except UnknownDefinition as error:  # its version is gone, or deployed with another shape (ShapeChanged)
            differences.append(Difference(saga_id, None, f"no registered definition runs it: {error}"))
            continue
        except Exception as error:  # a gap or a forged event makes the history unfoldable
            differences.append(Difference(saga_id, None, f"cannot rebuild from the topic: {error}"))
            continue
        statuses[topic_state.status.value] += 1
        stored = from_store.get(saga_id)
        if stored:
            store_state = fold(registry.for_history(stored), stored)
            if store_state.status != topic_state.status:
                differences.append(Difference(saga_id, None, f"state {topic_state.status.value} from the topic, "
                                                             f"{store_state.status.value} from the store"))
    return differences, statuses


async def audit_all(current: Settings) -> tuple[list[Difference], Counter[str], dict[str, int]]:
    """Read both sources in full and compare them."""
    feed = EventFeed(current.kafka(), Topics(current.saga_topic_prefix).events)
    await feed.start()
    try:
        await feed.read_to_end()
    finally:
        await feed.stop()
    stored: dict[EventKey, bytes] = {}
    store_events: dict[str, list[Event]] = {}
    pool = await create_pool(current.dsn(), 2, connect_timeout_s=15)
    try:
        store = PostgresStore(pool)
        async for row in store.iter_events():
            stored[(row.saga_id, row.seq)] = row.body
            store_events.setdefault(row.saga_id, []).append(wire.decode_event(row.body))
        backlog = await store.outbox_backlog()
    finally:
        await pool.close()
    topic_events = {saga_id: feed.history(saga_id) for saga_id in feed.events}
    purged = {saga_id: events[0] for saga_id, events in store_events.items() if isinstance(events[0], SagaPurged)}
    published, purge_differences, unverifiable = set_purged_aside(purged, feed.bodies)
    for saga_id, event in purged.items():  # from the topic too, only what the store still has is compared
        topic_events[saga_id] = [e for e in topic_events.get(saga_id, []) if e.seq >= event.seq]
    differences = compare_streams(stored, published)
    state_differences, statuses = compare_states(definitions(current), store_events, topic_events)
    figures = {"sagas in the store": len(store_events), "sagas on the topic": len(topic_events),
               "events in the store": len(stored), "events on the topic": sum(map(len, feed.events.values())),
               "duplicate publications": feed.duplicates, "undecodable on the topic": feed.undecodable,
               "rows waiting in the outbox": int(backlog), "purged sagas": len(purged),
               "purged sagas whose earlier events the topic no longer holds": unverifiable}
    return purge_differences + differences + state_differences, statuses, figures


def set_purged_aside(purged: Mapping[str, SagaPurged], published: Mapping[EventKey, set[bytes]]
                     ) -> tuple[dict[EventKey, set[bytes]], list[Difference], int]:
    """The topic's events without those a purge deleted from the store; a difference for each purged saga
    whose earlier events on the topic do not match its SagaPurged digest; how many purged sagas the topic
    no longer holds every earlier event of (retention: nothing to check)."""
    kept = {key: bodies for key, bodies in published.items()
            if key[0] not in purged or key[1] >= purged[key[0]].seq}
    differences: list[Difference] = []
    unverifiable = 0
    for saga_id, event in purged.items():
        copies = [published.get((saga_id, seq), set()) for seq in range(1, event.seq)]
        if not all(copies):
            unverifiable += 1
        elif any(len(bodies) > 1 for bodies in copies) or purged_digest(
                next(iter(bodies)) for bodies in copies) != event.purged_digest:
            differences.append(Difference(saga_id, event.seq, "the topic's events before the purge do not "
                                                              "match SagaPurged.purged_digest"))
    return kept, differences, unverifiable
