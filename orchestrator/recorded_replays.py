"""The dead-letter replays a saga's history records: an OperatorAction ``DlqReplay`` whose detail starts with
``letter P:O from `` (the letter's position on saga.dlq; ``operations.dead_letters.replay_detail`` writes it).

Read here once for every reader: the faces list a letter's replays, and the dead-letter indexer marks replayed a
letter it indexes for the first time whose replay its saga's history already records (a replay made before the
index existed)."""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from ..schemas import wire
from ..schemas.event_types import Event, OperatorAction
from ..schemas.message_types import Lever
from .ports import EventsOfSagas

# Frozen: histories written since 0.2.0 hold this detail; ``replay_detail`` writes it.
_REPLAY_DETAIL = re.compile(r"^letter (\d+:\d+) from ")


@dataclass(frozen=True)
class Replayed:
    """One recorded replay of a letter: who, and when (epoch ms)."""

    operator: str | None
    at_ms: int


def replays_by_letter(events: Iterable[Event]) -> dict[str, list[Replayed]]:
    """The replays the given saga events record (OperatorAction DlqReplay), by letter position (``P:O``)."""
    found: dict[str, list[Replayed]] = {}
    for event in events:
        if isinstance(event, OperatorAction) and event.action == Lever.DLQ_REPLAY and event.detail:
            match = _REPLAY_DETAIL.match(event.detail)
            if match:
                found.setdefault(match.group(1), []).append(Replayed(event.operator, event.occurred_at))
    return found


async def recorded_replays(histories: EventsOfSagas, saga_ids: Collection[str]) -> dict[str, list[Replayed]]:
    """The dead-letter replays the histories of ``saga_ids`` record, by letter position (one read, of the
    operators' actions only; no saga, no read)."""
    if not saga_ids:
        return {}
    actions = await histories.events_of(saga_ids, [OperatorAction.__name__])
    return replays_by_letter(wire.decode_event(row.body) for row in actions)
