"""Dead letters on saga.dlq: reading them, and sending one again once its cause is fixed.

A dead letter keeps the original record (key, value, headers) and where it came from. Once its cause is
fixed (the saga type deployed, the participant upgraded), a replay publishes that record again to its
source topic. The replay carries a message id derived from the letter's position on ``saga.dlq``
(``dlq-replay:<topic>:<partition>:<offset>``), so replaying one letter twice delivers it once: the
orchestrator's inbox drops the second copy, a participant answers it from its idempotency record. A replay
that fails again is dead-lettered again, as a new letter at a new position, which can be replayed in turn.

A step command or reply of a saga that has ended is held back unless the operator forces it: the saga may
have undone that step since, and a late command would do it again.

Who replayed what is kept twice: the replayed record carries headers ``replayed_from`` (the letter) and
``replayed_by`` (the operator), and a letter of a saga that has a history is recorded in it, once the records
are published: an OperateSaga ``DlqReplay`` the orchestrator records as OperatorAction with the operator and,
as detail, ``letter P:O from <topic> P:O to <topic>`` and the reason (``replay_detail``). A letter of no saga
(an unreadable record) has the headers only.

The letters are listed from the dead-letter index the orchestrator keeps in Postgres
(``orchestrator.dead_letter_index``, a ``DeadLetterIndex``): ``listed`` is one indexed query, and a replay takes
the letter's record from its row. ``read_parked`` reads saga.dlq itself (``saga dlq list --live``), for when the
index is not kept (no orchestrator runs).
A replay marks its letters replayed in the index. A letter that must never be sent again (a record nobody can
read, a lever the orchestrator refused and that would be stale now, a start made by mistake) is dismissed instead
(``dismiss``): marked handled, with who and why, audited, nothing published. The inbox lists the letters neither
replayed nor dismissed; a dismissed letter can still be replayed on purpose.

``saga dlq`` and the console's dead-letter page both work through this module; a request that cannot be served
raises DeadLetterError with one line saying what to do.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from ..client.saga_client import client_headers, topic_partitions
from ..infra.kafka_clients import KafkaClients
from ..orchestrator.domain.model import SagaStatus
from ..orchestrator.ports import DeadLetterIndex, IndexedLetter, LetterFilter
from ..orchestrator.recorded_replays import Replayed
from ..schemas import wire
from ..schemas.codec import WireError
from ..schemas.message_types import DeadLetter, Lever, OperateSaga
from .audit import OperatorAudit

REPLAYED_FROM = "replayed_from"  # header naming the dead letter a replayed record came from
REPLAYED_BY = "replayed_by"  # header naming the operator who replayed it
DISMISS = "DlqDismiss"  # the audit's name for a dismissal
_POSITION = re.compile(r"^(\d+):(\d+)$")


class DeadLetterError(Exception):
    """A request about dead letters that cannot be served (saga.dlq unreadable, no letter where one is named);
    the message is one line: what is wrong and what to do."""


class NotReplayable(Exception):
    """The letter cannot be sent again; the message says why."""


@dataclass(frozen=True)
class Parked:
    """A record on saga.dlq: its position there and the dead letter it holds (None: not a readable letter)."""

    partition: int
    offset: int
    timestamp_ms: int
    letter: DeadLetter | None

    @property
    def position(self) -> str:
        """``PARTITION:OFFSET`` on saga.dlq, the handle a replay takes."""
        return f"{self.partition}:{self.offset}"


@dataclass(frozen=True)
class Replay:
    """The record a replay publishes."""

    topic: str
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]


@dataclass(frozen=True)
class Dismissed:
    """A letter's dismissal (handled without a replay): who, why, and when (epoch ms)."""

    operator: str
    reason: str
    at_ms: int


def dismissal_of(row: IndexedLetter) -> Dismissed | None:
    """The dismissal an index row keeps (None: never dismissed)."""
    if row.dismissed_at_ms is None:
        return None
    return Dismissed(row.dismissed_by or "?", row.dismiss_reason or "", row.dismissed_at_ms)


def dismissal_record(dismissed: Dismissed | None) -> dict[str, object] | None:
    """A dismissal as a JSON-ready object (None: never dismissed)."""
    if dismissed is None:
        return None
    return {"operator": dismissed.operator, "reason": dismissed.reason, "at": dismissed.at_ms}


def parse_position(text: str) -> tuple[int, int]:
    """``3:17`` → (3, 17); DeadLetterError otherwise."""
    match = _POSITION.match(text.strip())
    if not match:
        raise DeadLetterError(f"{text!r} is not a dead-letter position; use PARTITION:OFFSET as `saga dlq list` "
                              "shows it, e.g. 3:17")
    return int(match.group(1)), int(match.group(2))


def matches(parked: Parked, saga_id: str | None = None, source: str | None = None, reason: str | None = None,
            since_ms: int | None = None) -> bool:
    """Whether a letter passes the filters (a None filter passes everything)."""
    letter = parked.letter
    if letter is None:
        return saga_id is None and source is None and reason is None and (since_ms is None
                                                                           or parked.timestamp_ms >= since_ms)
    return ((saga_id is None or letter.saga_id == saga_id)
            and (source is None or letter.source_topic == source)
            and (reason is None or reason.lower() in letter.reason.lower())
            and (since_ms is None or letter.failed_at >= since_ms))


def time_of(parked: Parked) -> int:
    """When the letter's record failed (epoch ms); for an unreadable record, when it was written to saga.dlq."""
    return parked.letter.failed_at if parked.letter else parked.timestamp_ms


def newest(parked: Iterable[Parked], limit: int) -> list[Parked]:
    """The ``limit`` letters that failed last, oldest of them first."""
    return sorted(parked, key=time_of)[-limit:]


def replay_of(parked: Parked, dlq_topic: str, operator: str) -> Replay:
    """The original record of a letter, to be published again to its source topic.

    Its headers are the original ones with a new ``message_id`` (the original was claimed when the record
    was dead-lettered, so it would be dropped as a duplicate), ``replayed_from`` and ``replayed_by``
    (``operator``); headers without a value are left out.
    """
    letter = parked.letter
    if letter is None:
        raise NotReplayable("not a readable dead letter")
    if letter.original_value is None:
        raise NotReplayable("the letter does not hold the original value (too large to keep, or there was none); "
                            f"it is at {letter.source_topic} partition {letter.source_partition} offset "
                            f"{letter.source_offset} while that topic retains it")
    origin = f"{dlq_topic}:{parked.partition}:{parked.offset}"
    headers = [(name, value) for name, value in letter.original_headers
               if value is not None and name not in ("message_id", REPLAYED_FROM, REPLAYED_BY)]
    headers += [("message_id", f"dlq-replay:{origin}".encode()), (REPLAYED_FROM, origin.encode()),
                (REPLAYED_BY, operator.encode())]
    return Replay(topic=letter.source_topic, key=letter.original_key, value=letter.original_value, headers=headers)


def replay_detail(parked: Parked, record: Replay, reason: str | None) -> str:
    """What a saga's history records of one replay of its letter (OperatorAction DlqReplay's detail): the
    letter's position on saga.dlq, where it came from, where it went, and why. Its start is read back by
    ``orchestrator.recorded_replays``: keep it."""
    letter = parked.letter
    assert letter is not None
    detail = (f"letter {parked.position} from {letter.source_topic} {letter.source_partition}:"
              f"{letter.source_offset} to {record.topic}")
    return f"{detail}: {reason}" if reason else detail


def letter_record(parked: Parked, replays: Sequence[Replayed] = ()) -> dict[str, object]:
    """A letter as a JSON-ready object; byte fields in base64."""
    record: dict[str, object] = {"position": parked.position, "timestamp": parked.timestamp_ms,
                                 "replays": [{"operator": r.operator, "at": r.at_ms} for r in replays]}
    letter = parked.letter
    if letter is None:
        return {**record, "readable": False}

    def b64(data: bytes | None) -> str | None:
        return None if data is None else base64.b64encode(data).decode()

    return {**record, "readable": True, "failed_at": letter.failed_at, "consumer": letter.consumer,
            "source_topic": letter.source_topic, "source_partition": letter.source_partition,
            "source_offset": letter.source_offset, "saga_id": letter.saga_id, "reason": letter.reason,
            "original_key_base64": b64(letter.original_key), "original_value_base64": b64(letter.original_value),
            "original_headers": [{"key": k, "value_base64": b64(v)} for k, v in letter.original_headers]}


async def read_parked(kafka: KafkaClients, dlq_topic: str, *, newest_per_partition: int | None = None,
                      at: Iterable[tuple[int, int]] = ()) -> list[Parked]:
    """The records on ``dlq_topic`` up to its end when called, in partition then offset order: every one, or
    the newest ``newest_per_partition`` of each partition, or (``at``) those at these positions only (a position
    with no record is left out). DeadLetterError when the topic cannot be read."""
    consumer = kafka.consumer(enable_auto_commit=False, group_id=None, isolation_level="read_committed")
    wanted: dict[int, list[int]] = {}
    for partition, offset in at:
        wanted.setdefault(partition, []).append(offset)
    try:
        await consumer.start()
        partitions = [TopicPartition(dlq_topic, p) for p in sorted(await topic_partitions(consumer, dlq_topic))]
        if wanted:
            partitions = [tp for tp in partitions if tp.partition in wanted]
        consumer.assign(partitions)
        firsts = await consumer.beginning_offsets(partitions) if partitions else {}
        ends = await consumer.end_offsets(partitions) if partitions else {}
    except Exception as error:
        await consumer.stop()
        raise DeadLetterError(f"cannot read {dlq_topic} from Kafka at {kafka.bootstrap_servers} ({error}); run "
                              "`saga infra up`, or check KAFKA_BOOTSTRAP_SERVERS and SAGA_TOPIC_PREFIX") from None
    ranges: dict[TopicPartition, tuple[int, int]] = {}
    for tp in partitions:
        first, end = firsts[tp], ends[tp]
        if wanted:
            ranges[tp] = (max(first, min(wanted[tp.partition])), min(end, max(wanted[tp.partition]) + 1))
        elif newest_per_partition is not None:
            ranges[tp] = (max(first, end - newest_per_partition), end)
        else:
            ranges[tp] = (first, end)
    try:
        found = await _read_ranges(consumer, ranges)
    finally:
        await consumer.stop()
    if wanted:
        found = [p for p in found if p.offset in wanted[p.partition]]
    return sorted(found, key=lambda parked: (parked.partition, parked.offset))


async def _read_ranges(consumer: AIOKafkaConsumer, ranges: dict[TopicPartition, tuple[int, int]]) -> list[Parked]:
    """The records of each partition from its range's start up to (not including) its stop."""
    reading = {tp: stop for tp, (start, stop) in ranges.items() if start < stop}
    for tp in ranges:
        if tp in reading:
            consumer.seek(tp, ranges[tp][0])
        else:
            consumer.pause(tp)  # nothing to read there
    found: list[Parked] = []
    while reading:
        for tp, records in (await consumer.getmany(*reading, timeout_ms=500, max_records=5000)).items():
            found.extend(_parked(tp.partition, record.offset, record.timestamp, record.value)
                         for record in records if ranges[tp][0] <= record.offset < ranges[tp][1])
        for tp in [tp for tp, stop in reading.items() if await consumer.position(tp) >= stop]:
            consumer.pause(tp)
            del reading[tp]
    return found


def _parked(partition: int, offset: int, timestamp_ms: int, value: bytes | None) -> Parked:
    letter = None
    if value is not None:
        try:
            letter = wire.decode_dead_letter(value)
        except WireError:
            pass  # listed as unreadable: saga.dlq should hold letters only, but anyone may write to it
    return Parked(partition, offset, timestamp_ms, letter)


def parked_of(row: IndexedLetter) -> Parked:
    """The letter an index row keeps."""
    return _parked(row.partition, row.offset, row.written_at_ms, row.record)


async def listed(index: DeadLetterIndex, where: LetterFilter, limit: int) -> list[tuple[Parked, Dismissed | None]]:
    """The ``limit`` letters that pass ``where`` and failed last, newest first (one indexed query), each with its
    dismissal."""
    return [(parked_of(row), dismissal_of(row)) for row in await index.newest(where, limit)]


async def chosen(index: DeadLetterIndex, wanted: Sequence[tuple[int, int]], saga_id: str | None,
                 dlq_topic: str) -> list[Parked]:
    """``select`` over the index: the letters at ``wanted`` positions plus those of ``saga_id``."""
    found = await index.at(wanted)
    if saga_id is not None:
        found += await index.newest(LetterFilter(saga_id=saga_id), MOST_OF_A_SAGA)
    return select([parked_of(row) for row in found], wanted, saga_id, dlq_topic)


MOST_OF_A_SAGA = 10_000  # the letters of one saga a replay by saga id takes


def select(parked: Sequence[Parked], wanted: Iterable[tuple[int, int]], saga_id: str | None,
           dlq_topic: str) -> list[Parked]:
    """The letters at ``wanted`` positions plus those of ``saga_id``, oldest failure first, each once; a
    position with no letter (or a saga with none) is a DeadLetterError that names it."""
    by_position = {(p.partition, p.offset): p for p in parked}
    missing = [f"{partition}:{offset}" for partition, offset in wanted if (partition, offset) not in by_position]
    if missing:
        raise DeadLetterError(f"no dead letter at {', '.join(missing)} on {dlq_topic}; `saga dlq list` shows the "
                              "positions")
    chosen = {position: by_position[position] for position in wanted}
    if saga_id is not None:
        of_saga = {(p.partition, p.offset): p for p in parked if matches(p, saga_id=saga_id)}
        if not of_saga:
            raise DeadLetterError(f"no dead letter of saga {saga_id!r} on {dlq_topic}")
        chosen.update(of_saga)
    return sorted(chosen.values(), key=lambda p: (time_of(p), p.partition, p.offset))


async def dismiss(index: DeadLetterIndex, audit: OperatorAudit, positions: Sequence[str], operator: str,
                  reason: str | None, at_ms: int, dlq_topic: str) -> list[Parked]:
    """Dismiss the letters at ``positions`` for ``operator``: mark them handled without a replay (nothing is
    published; the inbox drops them), because of ``reason``, and audit each. The letters dismissed, oldest failure
    first. DeadLetterError (audited, nothing marked) when there is no reason, no position, or a position names no
    letter."""
    why = (reason or "").strip()
    asked = {"positions": list(positions), "reason": why or None}
    try:
        if not positions:
            raise DeadLetterError("name the letters to dismiss: positions as PARTITION:OFFSET")
        if not why:
            raise DeadLetterError("say why the letters are dismissed (a reason is required): a dismissed letter is "
                                  "never sent again")
        letters = await chosen(index, [parse_position(text) for text in positions], None, dlq_topic)
    except DeadLetterError as error:
        await audit.record(operator, DISMISS, f"dead letters {', '.join(positions)}", asked, f"refused: {error}")
        raise
    await index.dismiss([(item.partition, item.offset) for item in letters], operator, why, at_ms)
    for item in letters:
        letter = item.letter
        await audit.record(operator, DISMISS, f"dead letter {item.position}",
                           {"saga": letter.saga_id if letter else None, "reason": why}, "dismissed; nothing re-sent")
    return letters


def is_step_topic(topic: str) -> bool:
    """True for a participant's commands or results topic (``<prefix><participant>.commands|results``)."""
    return topic.endswith((".commands", ".results"))


@dataclass
class ReplayPlan:
    """What a replay of chosen letters publishes, and which letters it refuses with why."""

    replays: list[tuple[Parked, Replay]] = field(default_factory=list)
    refused: list[tuple[Parked, str]] = field(default_factory=list)
    statuses: dict[str, str] = field(default_factory=dict)  # of the replayed letters' sagas that have a history

    def notes(self, operator: str, reason: str | None) -> list[OperateSaga]:
        """The OperateSaga DlqReplay of each replay whose saga has a history, which records it there."""
        return [OperateSaga(saga_id=item.letter.saga_id, action=Lever.DLQ_REPLAY, step=None, operator=operator,
                            reason=replay_detail(item, record, reason))
                for item, record in self.replays if item.letter and item.letter.saga_id in self.statuses]

    def recorded(self, parked: Parked) -> bool:
        """Whether the replay of ``parked`` is recorded in its saga's history (the saga has one)."""
        return parked.letter is not None and parked.letter.saga_id in self.statuses


async def plan_replays(chosen: Sequence[Parked], dlq_topic: str, operator: str,
                       statuses_of: Callable[[set[str]], Awaitable[dict[str, str]]], *, force: bool,
                       force_hint: str, resume_hint: str) -> ReplayPlan:
    """The replays of ``chosen`` for ``operator``: a letter without its record is refused; so is a step's command
    or reply of a saga that ended (its status from ``statuses_of``), unless ``force``. A refusal's why ends with
    ``force_hint`` (how to force it) and, for a saga whose compensation failed, ``resume_hint`` (what to do
    instead)."""
    plan = ReplayPlan()
    for item in chosen:
        try:
            plan.replays.append((item, replay_of(item, dlq_topic, operator)))
        except NotReplayable as why:
            plan.refused.append((item, str(why)))
    plan.statuses = await statuses_of({item.letter.saga_id for item, _ in plan.replays
                                       if item.letter and item.letter.saga_id})
    if force:
        return plan
    kept = []
    for item, record in plan.replays:
        saga_id = item.letter.saga_id if item.letter else None
        status = plan.statuses.get(saga_id or "") if is_step_topic(record.topic) else None
        if status is None or not SagaStatus(status).is_terminal:
            kept.append((item, record))
            continue
        plan.refused.append((item, f"saga {saga_id or ''} ended {status}, and a step's command or reply after its "
                                   "end could redo what it undid"
                                   + (f"; {resume_hint}" if status == "COMPENSATION_FAILED" else "")
                                   + f"; {force_hint}"))
    plan.replays = kept
    return plan


def note_record(note: OperateSaga, control_topic: str) -> Replay:
    """The OperateSaga DlqReplay that records a replay in the saga's history, as a record for saga.control."""
    return Replay(topic=control_topic, key=note.saga_id.encode(), value=wire.encode_operate(note),
                  headers=client_headers(note.saga_id))


async def publish(producer: AIOKafkaProducer, records: Sequence[Replay]) -> None:
    """Send ``records`` through a started (idempotent) producer, in order, and wait until each is written."""
    # Sent in order: records of one key keep their order on its partition.
    futures = [await producer.send(r.topic, value=r.value, key=r.key, headers=r.headers) for r in records]
    for future in futures:
        await future
