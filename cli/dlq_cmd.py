"""``saga dlq list`` and ``saga dlq replay``: what the services dead-lettered, and sending it again.

A dead letter keeps the original record (key, value, headers) and where it came from. Once its cause is
fixed (the saga type deployed, the participant upgraded), ``replay`` publishes that record again to its
source topic. The replay carries a message id derived from the letter's position on ``saga.dlq``
(``dlq-replay:<topic>:<partition>:<offset>``), so replaying one letter twice delivers it once: the
orchestrator's inbox drops the second copy, a participant answers it from its idempotency record. A replay
that fails again is dead-lettered again, as a new letter at a new position, which can be replayed in turn.
"""

from __future__ import annotations

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
from ..infra.settings import Settings
from ..orchestrator.domain.status import SagaStatus
from ..schemas import wire
from ..schemas.codec import WireError
from ..schemas.message_types import DeadLetter
from .context import console, database, fail, kafka_clients, producer, run, settings, topics
from .inspect_cmd import parse_duration, when

dlq_app = typer.Typer(no_args_is_help=True, help="Dead letters on saga.dlq: list them, replay them.")

_POSITION = re.compile(r"^(\d+):(\d+)$")
REPLAYED_FROM = "replayed_from"  # header naming the dead letter a replayed record came from


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


def replay_of(parked: Parked, dlq_topic: str) -> Replay:
    """The original record of a letter, to be published again to its source topic.

    Its headers are the original ones with a new ``message_id`` (the original was claimed when the record
    was dead-lettered, so it would be dropped as a duplicate) and ``replayed_from``; headers without a value
    are left out.
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
               if value is not None and name not in ("message_id", REPLAYED_FROM)]
    headers += [("message_id", f"dlq-replay:{origin}".encode()), (REPLAYED_FROM, origin.encode())]
    return Replay(topic=letter.source_topic, key=letter.original_key, value=letter.original_value, headers=headers)


def letter_record(parked: Parked) -> dict[str, object]:
    """A letter as a JSON-ready object; byte fields in base64."""
    record: dict[str, object] = {"position": parked.position, "timestamp": parked.timestamp_ms}
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
    if as_json:
        for item in shown:
            console.print_json(json.dumps(letter_record(item)))
        return
    table = Table("position", "failed at (UTC)", "consumer", "from", "saga", "reason", "bytes",
                  title=f"dead letters on {topics(current).dlq}")
    for item in shown:
        table.add_row(*_columns(item))
    console.print(table)
    console.print(f"{len(shown)} shown, {len(chosen)} match, {len(parked)} on {topics(current).dlq}")


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
) -> None:
    """Publish dead-lettered records again to their source topics, once their cause is fixed.

    A step command or reply of a saga that has ended is not replayed (without --force): the saga may have
    undone that step since, and a late command would do it again."""
    wanted = [parse_position(text) for text in positions or []]
    if not wanted and saga_id is None:
        fail("name the letters to replay: positions as PARTITION:OFFSET, or --saga ID (see `saga dlq list`)")
    current = settings()
    dlq_topic = topics(current).dlq
    parked = run(read_parked(current))
    chosen = select(parked, wanted, saga_id, dlq_topic)
    replays: list[tuple[Parked, Replay]] = []
    refused = 0
    for item in chosen:
        try:
            replays.append((item, replay_of(item, dlq_topic)))
        except NotReplayable as why:
            refused += 1
            console.print(f"[red]{item.position} not replayed:[/] {why}")
    if not force:
        ended = run(ended_sagas(current, {item.letter.saga_id for item, record in replays
                                          if item.letter and item.letter.saga_id and is_step_topic(record.topic)}))
        kept = []
        for item, record in replays:
            status = ended.get(item.letter.saga_id or "") if item.letter and is_step_topic(record.topic) else None
            if status is None:
                kept.append((item, record))
                continue
            refused += 1
            console.print(f"[red]{item.position} not replayed:[/] saga {item.letter.saga_id if item.letter else ''} "
                          f"ended {status}, and a step's command or reply after its end could redo what it undid"
                          + ("; `saga resume` retries its compensation" if status == "COMPENSATION_FAILED" else "")
                          + "; --force replays it anyway")
        replays = kept
    if not dry_run and replays:
        run(_publish([record for _, record in replays], current))
    verb = "would publish" if dry_run else "published"
    for item, record in replays:
        saga = item.letter.saga_id if item.letter else None
        console.print(f"{item.position} {verb} to {record.topic}" + (f" (saga {saga})" if saga else ""))
    console.print(f"{len(replays)} {verb}, {refused} not replayable")
    if refused:
        raise typer.Exit(1)


def is_step_topic(topic: str) -> bool:
    """True for a participant's commands or results topic (``<prefix><participant>.commands|results``)."""
    return topic.endswith((".commands", ".results"))


async def ended_sagas(current: Settings, saga_ids: set[str]) -> dict[str, str]:
    """The status of each of ``saga_ids`` that has ended (the read model's), by saga id."""
    if not saga_ids:
        return {}
    async with database(current) as pool:
        rows = await pool.fetch("SELECT saga_id, status FROM saga.saga_summary WHERE saga_id = ANY($1::text[])",
                                sorted(saga_ids))
    return {row["saga_id"]: row["status"] for row in rows if SagaStatus(row["status"]).is_terminal}


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
