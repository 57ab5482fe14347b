"""The console's dead letters: the newest on saga.dlq with the replays their sagas' histories record and their
dismissals, and a replay or a dismissal for the signed-in operator, audited letter by letter.

What a replay publishes, records and holds back, and what a dismissal marks, is ``operations.dead_letters``'
(``saga dlq`` works through it too). A page answers from the dead-letter index the orchestrator keeps (one indexed
query), bounded to the newest letters that pass its filters; a replay takes its letters' records from the index and
marks them replayed, a dismissal marks them dismissed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from aiokafka import AIOKafkaProducer
from fastapi import HTTPException

from ..operations import dead_letters as dlq
from ..operations.dead_letters import DeadLetterError, Dismissed, Parked
from ..orchestrator.domain.model import SagaStatus
from ..orchestrator.ports import LetterFilter
from ..orchestrator.recorded_replays import Replayed
from .context import Console

SHOWN = 100  # the newest letters a page shows
MOST_SHOWN = 1000
REPLAY = "DlqReplay"  # the audit's name for a replay
FORCE_HINT = "tick force to replay it anyway"
RESUME_HINT = "Resume on the saga's page retries its compensation"
CONNECT_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class LetterView:
    """One letter as the console shows it: the letter, the replays its saga's history records, the saga's status
    (None: no history), and its dismissal (None: never dismissed)."""

    parked: Parked
    replays: list[Replayed] = field(default_factory=list)
    saga_status: str | None = None
    dismissed: Dismissed | None = None

    @property
    def held_unless_forced(self) -> bool:
        """A step's command or reply of a saga that ended: replayed only when forced."""
        letter = self.parked.letter
        return (letter is not None and self.saga_status is not None and dlq.is_step_topic(letter.source_topic)
                and SagaStatus(self.saga_status).is_terminal)

    def to_json(self) -> dict[str, object]:
        return {**dlq.letter_record(self.parked, self.replays), "saga_status": self.saga_status,
                "held_unless_forced": self.held_unless_forced, "dismissed": dlq.dismissal_record(self.dismissed)}


@dataclass(frozen=True)
class ReplayOutcome:
    """What one replay request did: the letters published (position, topic, saga id, recorded in its history),
    and those refused with why."""

    operator: str
    replayed: list[dict[str, object]]
    refused: list[dict[str, str]]


async def letters(console: Console, shown: int = SHOWN, where: LetterFilter | None = None,
                  position: str | None = None) -> list[LetterView]:
    """The ``shown`` letters that pass ``where`` and failed last, newest first, from the dead-letter index; only the
    one at ``position`` (PARTITION:OFFSET) when given. HTTPException 400 for a position that is none."""
    if position:
        try:
            at = dlq.parse_position(position)
        except DeadLetterError as error:
            raise HTTPException(400, str(error)) from None
        newest = [(dlq.parked_of(row), dlq.dismissal_of(row)) for row in await console.dead_letters.at([at])]
    else:
        newest = await dlq.listed(console.dead_letters, where or LetterFilter(), shown)
    saga_ids = {p.letter.saga_id for p, _ in newest if p.letter and p.letter.saga_id}
    replays = await console.reads.recorded_replays(saga_ids)
    statuses = await console.reads.saga_statuses(saga_ids)
    return [LetterView(p, replays.get(p.position, []),
                       statuses.get(p.letter.saga_id) if p.letter and p.letter.saga_id else None, dismissed)
            for p, dismissed in newest]


async def replay(console: Console, operator: str, positions: Sequence[str], reason: str | None,
                 force: bool) -> ReplayOutcome:
    """Replay the letters at ``positions`` for ``operator`` and audit each (a refused one too); HTTPException 400
    when the request names no letter that is there (audited), 503 when Kafka is out of reach."""
    topic = console.topics.dlq
    asked = {"positions": list(positions), "reason": reason, "force": force}
    try:
        if not positions:
            raise DeadLetterError("name the letters to replay: positions as PARTITION:OFFSET")
        wanted = [dlq.parse_position(text) for text in positions]
        chosen = await dlq.chosen(console.dead_letters, wanted, None, topic)
    except DeadLetterError as error:
        await console.audit.record(operator, REPLAY, f"dead letters {', '.join(positions)}", asked,
                                   f"refused: {error}")
        raise HTTPException(400, str(error)) from None
    plan = await dlq.plan_replays(chosen, topic, operator, console.reads.saga_statuses,
                                  force=force, force_hint=FORCE_HINT, resume_hint=RESUME_HINT)
    if plan.replays:
        try:
            async with _producer(console) as producer:
                await dlq.publish(producer, [record for _, record in plan.replays])
                await dlq.publish(producer, [dlq.note_record(note, console.topics.control)
                                             for note in plan.notes(operator, reason)])
        except DeadLetterError as error:
            await console.audit.record(operator, REPLAY, f"dead letters {', '.join(positions)}", asked,
                                       f"failed: {error}")
            raise HTTPException(503, str(error)) from None
        await console.dead_letters.mark_replayed([(item.partition, item.offset) for item, _ in plan.replays],
                                                 console.now_ms())
    for item, why in plan.refused:
        await console.audit.record(operator, REPLAY, f"dead letter {item.position}", _detail(item, reason, force),
                                   f"refused: {why}")
    replayed: list[dict[str, object]] = []
    for item, record in plan.replays:
        saga_id = item.letter.saga_id if item.letter else None
        recorded = plan.recorded(item)
        await console.audit.record(operator, REPLAY, f"dead letter {item.position}", _detail(item, reason, force),
                                   f"published to {record.topic}; " + (f"recorded in saga {saga_id}'s history"
                                                                       if recorded else "no history to record it in"))
        replayed.append({"position": item.position, "topic": record.topic, "saga_id": saga_id, "recorded": recorded})
    return ReplayOutcome(operator, replayed, [{"position": item.position, "why": why} for item, why in plan.refused])


async def dismiss(console: Console, operator: str, positions: Sequence[str], reason: str | None) -> list[str]:
    """Dismiss the letters at ``positions`` for ``operator`` because of ``reason`` (``dead_letters.dismiss``:
    marked handled, nothing published, each audited); their positions. HTTPException 400 when there is no reason,
    no position, or a position names no letter (audited)."""
    try:
        done = await dlq.dismiss(console.dead_letters, console.audit, positions, operator, reason, console.now_ms(),
                                 console.topics.dlq)
    except DeadLetterError as error:
        raise HTTPException(400, str(error)) from None
    return [item.position for item in done]


def _detail(parked: Parked, reason: str | None, force: bool) -> dict[str, object]:
    letter = parked.letter
    return {"saga": letter.saga_id if letter else None,
            "from": f"{letter.source_topic} {letter.source_partition}:{letter.source_offset}" if letter else None,
            "reason": reason, "force": force}


@asynccontextmanager
async def _producer(console: Console) -> AsyncIterator[AIOKafkaProducer]:
    """An idempotent producer for one replay (replays are rare: no connection is held between them)."""
    producer = console.kafka.producer(acks="all", enable_idempotence=True)
    try:
        await asyncio.wait_for(producer.start(), timeout=CONNECT_TIMEOUT_S)
    except Exception as error:
        await producer.stop()
        raise DeadLetterError(f"cannot reach Kafka at {console.kafka.bootstrap_servers} ({error!r})") from None
    try:
        yield producer
    finally:
        await producer.stop()
