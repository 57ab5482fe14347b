"""``saga dlq list`` and ``saga dlq replay``: what the services dead-lettered, and sending it again.

A dead letter keeps the original record (key, value, headers) and where it came from. Once its cause is
fixed (the saga type deployed, the participant upgraded), ``replay`` publishes that record again to its
source topic. The replay carries a message id derived from the letter's position on ``saga.dlq``
(``dlq-replay:<topic>:<partition>:<offset>``), so replaying one letter twice delivers it once: the
orchestrator's inbox drops the second copy, a participant answers it from its idempotency record. A replay
that fails again is dead-lettered again, as a new letter at a new position, which can be replayed in turn.

Who replayed what is kept twice: the replayed record carries headers ``replayed_from`` (the letter) and
``replayed_by`` (the operator), and a letter of a saga that has a history is recorded in it, once the records
are published: an OperateSaga ``DlqReplay`` the orchestrator records as OperatorAction with the operator and,
as detail, ``letter P:O from <topic> P:O to <topic>`` and the reason (``replay_detail``). ``list`` shows those
records beside each letter. A letter of no saga (an unreadable record) has the headers only.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Annotated

import typer
from rich.table import Table

from ..client.event_feed import assign_from_beginning
from ..client.saga_client import client_headers
from ..infra.db import create_pool
from ..infra.settings import Settings
from ..orchestrator.domain.status import SagaStatus
from ..orchestrator.store.postgres import PostgresStore
from ..schemas import wire
from ..schemas.codec import WireError
from ..schemas.event_types import Event, OperatorAction
from ..schemas.message_types import DeadLetter, Lever, OperateSaga
from .context import (
    OPERATOR_HELP,
    console,
    database,
    fail,
    kafka_clients,
    operator_or_login,
    producer,
    run,
    settings,
    topics,
)
from .inspect_cmd import parse_duration, when

dlq_app = typer.Typer(no_args_is_help=True, help="Dead letters on saga.dlq: list them, replay them.")

_POSITION = re.compile(r"^(\d+):(\d+)$")
REPLAYED_FROM = "replayed_from"  # header naming the dead letter a replayed record came from
REPLAYED_BY = "replayed_by"  # header naming the operator who replayed it
_REPLAY_DETAIL = re.compile(r"^letter (\d+:\d+) from ")


@dataclass(frozen=True)
class Parked:
    """A record on saga.dlq: its position there and the dead letter it holds (None: not a readable letter)."""

    partition: int
    offset: int
    timestamp_ms: int
    letter: DeadLetter | None

    @property
    def position(self) -> str:
        """``PARTITION:OFFSET`` on saga.dlq, the handle ``replay`` takes."""
        return f"{self.partition}:{self.offset}"


@dataclass(frozen=True)
class Replay:
    """The record a replay publishes."""

    topic: str
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]


class NotReplayable(Exception):
    """The letter cannot be sent again; the message says why."""


def parse_position(text: str) -> tuple[int, int]:
    """``3:17`` → (3, 17); a clear error otherwise."""
    match = _POSITION.match(text.strip())
    if not match:
        fail(f"{text!r} is not a dead-letter position; use PARTITION:OFFSET as `saga dlq list` shows it, e.g. 3:17")
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
    letter's position on saga.dlq, where it came from, where it went, and why."""
    letter = parked.letter
    assert letter is not None
    detail = (f"letter {parked.position} from {letter.source_topic} {letter.source_partition}:"
              f"{letter.source_offset} to {record.topic}")
    return f"{detail}: {reason}" if reason else detail


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


async def read_parked(current: Settings) -> list[Parked]:
    """Every record on saga.dlq up to its end when called, in partition then offset order."""
    consumer = (await kafka_clients(current)).consumer(enable_auto_commit=False, group_id=None,
                                                       isolation_level="read_committed")
    try:
        await consumer.start()
        partitions = await assign_from_beginning(consumer, topics(current).dlq)
    except Exception as error:
        await consumer.stop()
        fail(f"cannot read {topics(current).dlq} from Kafka at {current.kafka_servers()} ({error}); "
             "run `saga infra up`, or check KAFKA_BOOTSTRAP_SERVERS and SAGA_TOPIC_PREFIX")
    try:
        ends = await consumer.end_offsets(partitions)
        found: list[Parked] = []
        while [tp for tp, end in ends.items() if await consumer.position(tp) < end]:
            for tp, records in (await consumer.getmany(timeout_ms=500, max_records=5000)).items():
                found.extend(_parked(tp.partition, record.offset, record.timestamp, record.value)
                             for record in records if record.offset < ends[tp])
        return sorted(found, key=lambda parked: (parked.partition, parked.offset))
    finally:
        await consumer.stop()


def _parked(partition: int, offset: int, timestamp_ms: int, value: bytes | None) -> Parked:
    letter = None
    if value is not None:
        try:
            letter = wire.decode_dead_letter(value)
        except WireError:
            pass  # listed as unreadable: saga.dlq should hold letters only, but anyone may write to it
    return Parked(partition, offset, timestamp_ms, letter)


@dlq_app.command("list")
def list_letters(
    saga_id: str | None = typer.Option(None, "--saga", help="Only letters of this saga id."),
    source: str | None = typer.Option(None, "--source", help="Only letters from this topic, e.g. saga.start."),
    reason: str | None = typer.Option(None, "--reason", help="Only letters whose reason contains this text."),
    since: str | None = typer.Option(None, "--since", help="Only letters of the last 90s, 15m, 2h, 7d."),
    limit: int = typer.Option(100, "--limit", min=1, help="At most this many, the newest of those that match."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per letter, with the original bytes."),
) -> None:
    """List dead letters: where each came from, why, and its position for `saga dlq replay`."""
    since_ms = int(time.time() * 1000) - parse_duration(since, "--since") if since else None
    current = settings()
    parked = run(read_parked(current))
    chosen = [p for p in parked if matches(p, saga_id, source, reason, since_ms)]
    shown = sorted(chosen, key=_time_of)[-limit:]
    replays, unknown = run(recorded_replays(current, {p.letter.saga_id for p in shown
                                                      if p.letter and p.letter.saga_id}))
    if as_json:
        for item in shown:
            console.print_json(json.dumps(letter_record(item, replays.get(item.position, []))))
        return
    table = Table("position", "failed at (UTC)", "consumer", "from", "saga", "reason", "bytes", "replayed",
                  title=f"dead letters on {topics(current).dlq}")
    for item in shown:
        table.add_row(*_columns(item), _replays_cell(replays.get(item.position, [])))
    console.print(table)
    console.print(f"{len(shown)} shown, {len(chosen)} match, {len(parked)} on {topics(current).dlq}")
    if unknown:
        console.print(f"replays not shown: {unknown}")


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
        store = PostgresStore(pool)
        events = [wire.decode_event(row.body) for saga in sorted(saga_ids) for row in await store.load_events(saga)]
    finally:
        await pool.close()
    return replays_by_letter(events), None


def _replays_cell(replays: Sequence[Replayed]) -> str:
    if not replays:
        return ""
    last = replays[-1]
    return f"{len(replays)}x, last by {last.operator or '?'} at {when(last.at_ms)}"


def _time_of(parked: Parked) -> int:
    return parked.letter.failed_at if parked.letter else parked.timestamp_ms


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
    wanted = [parse_position(text) for text in positions or []]
    if not wanted and saga_id is None:
        fail("name the letters to replay: positions as PARTITION:OFFSET, or --saga ID (see `saga dlq list`)")
    who = operator_or_login(operator)
    current = settings()
    dlq_topic = topics(current).dlq
    parked = run(read_parked(current))
    chosen = select(parked, wanted, saga_id, dlq_topic)
    replays: list[tuple[Parked, Replay]] = []
    refused = 0
    for item in chosen:
        try:
            replays.append((item, replay_of(item, dlq_topic, who)))
        except NotReplayable as why:
            refused += 1
            console.print(f"[red]{item.position} not replayed:[/] {why}")
    statuses = run(saga_statuses(current, {item.letter.saga_id for item, _ in replays
                                           if item.letter and item.letter.saga_id}))
    if not force:
        kept = []
        for item, record in replays:
            status = statuses.get(item.letter.saga_id or "") if item.letter and is_step_topic(record.topic) else None
            if status is None or not SagaStatus(status).is_terminal:
                kept.append((item, record))
                continue
            refused += 1
            console.print(f"[red]{item.position} not replayed:[/] saga {item.letter.saga_id if item.letter else ''} "
                          f"ended {status}, and a step's command or reply after its end could redo what it undid"
                          + ("; `saga resume` retries its compensation" if status == "COMPENSATION_FAILED" else "")
                          + "; --force replays it anyway")
        replays = kept
    notes = [OperateSaga(saga_id=item.letter.saga_id, action=Lever.DLQ_REPLAY, step=None, operator=who,
                         reason=replay_detail(item, record, because))
             for item, record in replays if item.letter and item.letter.saga_id in statuses]
    if not dry_run and replays:
        run(_publish([record for _, record in replays], current))
        run(_publish([_note_record(note, topics(current).control) for note in notes], current))
    verb = "would publish" if dry_run else "published"
    for item, record in replays:
        saga = item.letter.saga_id if item.letter else None
        noted = "recorded in its history" if saga in statuses else "no history to record it in"
        console.print(f"{item.position} {verb} to {record.topic}" + (f" (saga {saga}); {noted}" if saga else ""))
    console.print(f"{len(replays)} {verb} by {who}, {refused} not replayable")
    if refused:
        raise typer.Exit(1)


def is_step_topic(topic: str) -> bool:
    """True for a participant's commands or results topic (``<prefix><participant>.commands|results``)."""
    return topic.endswith((".commands", ".results"))


async def saga_statuses(current: Settings, saga_ids: set[str]) -> dict[str, str]:
    """The status (the read model's) of each of ``saga_ids`` that has a history, by saga id: a replay is
    recorded there, and one of a step's command or reply is held back once the saga ended."""
    if not saga_ids:
        return {}
    async with database(current) as pool:
        rows = await pool.fetch("SELECT saga_id, status FROM saga.saga_summary WHERE saga_id = ANY($1::text[])",
                                sorted(saga_ids))
    return {row["saga_id"]: row["status"] for row in rows}


def _note_record(note: OperateSaga, control_topic: str) -> Replay:
    """The OperateSaga DlqReplay that records a replay in the saga's history, as a record for saga.control."""
    return Replay(topic=control_topic, key=note.saga_id.encode(), value=wire.encode_operate(note),
                  headers=client_headers(note.saga_id))


def select(parked: Sequence[Parked], wanted: Iterable[tuple[int, int]], saga_id: str | None,
           dlq_topic: str) -> list[Parked]:
    """The letters at ``wanted`` positions plus those of ``saga_id``, in saga.dlq order, each once; a
    position with no letter is an error that names it."""
    by_position = {(p.partition, p.offset): p for p in parked}
    missing = [f"{partition}:{offset}" for partition, offset in wanted if (partition, offset) not in by_position]
    if missing:
        fail(f"no dead letter at {', '.join(missing)} on {dlq_topic}; `saga dlq list` shows the positions")
    chosen = {position: by_position[position] for position in wanted}
    if saga_id is not None:
        of_saga = {(p.partition, p.offset): p for p in parked if matches(p, saga_id=saga_id)}
        if not of_saga:
            fail(f"no dead letter of saga {saga_id!r} on {dlq_topic}")
        chosen.update(of_saga)
    return sorted(chosen.values(), key=lambda p: (_time_of(p), p.partition, p.offset))


async def _publish(records: Sequence[Replay], current: Settings) -> None:
    async with producer(current) as kafka:
        # One idempotent producer, sent in order: records of one key keep their order on its partition.
        futures = [await kafka.send(r.topic, value=r.value, key=r.key, headers=r.headers) for r in records]
        for future in futures:
            await future
