"""Retention, the pure part: which sagas may give up their events, and the SagaPurged that replaces them."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from ...schemas import event_types as ev
from .model import PURGEABLE_STATUSES, SagaState


def purged_digest(bodies: Iterable[bytes]) -> str:
    """Hex SHA-256 over event bodies in seq order, each preceded by its length (8 bytes, big-endian), so
    that copies of the purged events (on saga.events) can still be checked against the stream."""
    digest = hashlib.sha256()
    for body in bodies:
        digest.update(len(body).to_bytes(8, "big"))
        digest.update(body)
    return digest.hexdigest()


def may_purge(state: SagaState, ended_before_ms: int) -> bool:
    """True for a saga that ended (not one waiting for an operator) with its last event before the cutoff."""
    return state.status in PURGEABLE_STATUSES and state.updated_at < ended_before_ms


def purged_event(state: SagaState, bodies: Iterable[bytes], now_ms: int, operator: str | None) -> ev.SagaPurged:
    """The event that replaces a saga's events 1..last_seq (their stored bodies, in seq order)."""
    return ev.SagaPurged(saga_id=state.saga_id, seq=state.last_seq + 1, definition_version=state.definition_version,
                         occurred_at=now_ms, saga_type=state.saga_type, final_status=state.status.value,
                         ended_at=state.updated_at, purged_through_seq=state.last_seq,
                         purged_digest=purged_digest(bodies), operator=operator)
