"""Poison input at volume: malformed records on every consumed topic, interleaved with valid trip sagas.

Every malformed record must land on saga.dlq exactly once in effect (matched by source topic, partition and
offset) with a reason; every valid saga must end as its scenario says with the right effects; every consumer
group must commit to the end of every partition it consumes (no stall); no service may exit.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
from aiokafka import AIOKafkaProducer

from saga_orchestrator.cli.demo_cmd import drive
from saga_orchestrator.infra import kafka_records
from saga_orchestrator.infra.kafka_admin import ensure_topics
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.operations.verify import verify_system
from saga_orchestrator.orchestrator.bootstrap import prepare
from saga_orchestrator.participants.runner import app_id
from saga_orchestrator.participants.trip import PARTICIPANTS
from saga_orchestrator.participants.trip.effects import TRIP_PARTICIPANTS
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.codec import WireError
from saga_orchestrator.schemas.limits import MAX_VALUE_BYTES
from saga_orchestrator.schemas.message_types import DeadLetter
from saga_orchestrator.schemas.records import ConsumedRecord
from saga_orchestrator.schemas.topics import Topics
from tests.chaos.crash_tools import scenario_problems
from tests.chaos.tools.kafka_tools import (
    LagWatch,
    Sent,
    publish_records,
    publish_with_raw_header_name,
    read_all,
    set_max_message_bytes,
    wait_caught_up,
    wait_consumers_up,
)
from tests.chaos.tools.poison import PoisonFactory
from tests.conftest import run_sync
from tests.e2e.harness import Stack

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]

POISON_COUNT = 10_000
CHUNKS = 12
MAX_BACKLOG = 300  # records the consumers may be behind when the next chunk goes out
VALID_WAVES = 3
VALID_MIX = {"happy": 10, "invalid_route": 3, "atlantis": 3, "card_declined": 3, "card_flaky": 2,
             "card_slow": 2, "email_bounce": 2, "uncancellable": 2, "cancelled": 2}
TOPIC_MAX_BYTES = 2 * 1024 * 1024  # an operator's topic setting above the codec limit
SETTLE_S = 60.0


def _consumed(topics: Topics) -> list[str]:
    return [topics.start, topics.control, *(topics.results(p) for p in PARTICIPANTS),
            *(topics.commands(p) for p in PARTICIPANTS)]


@pytest.fixture(scope="module")
def stack(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    log_dir: Path = tmp_path_factory.mktemp("logs")
    run_sync(prepare(settings))
    run_sync(set_max_message_bytes(settings, _consumed(Topics(settings.saga_topic_prefix)), TOPIC_MAX_BYTES))
    running = Stack(settings, log_dir)
    running.start()
    yield running
    running.stop()
    print(f"service logs: {log_dir}")


async def _publish_interleaved(settings: Settings, factory: PoisonFactory, planned: dict[str, str],
                               groups: dict[str, list[str]]) -> tuple[list[Sent], dict[str, str]]:
    """Poison in chunks, each sent once the consumers are nearly through the previous one (this is about bad
    input, not overload: a backlog would time the valid sagas' steps out on a slow machine), the valid
    sagas started in waves between them."""
    records = factory.generate(POISON_COUNT)
    chunks = [records[i::CHUNKS] for i in range(CHUNKS)]
    sagas = list(planned.items())
    waves = [dict(sagas[i::VALID_WAVES]) for i in range(VALID_WAVES)]
    driving = []
    sent: list[Sent] = []
    async with LagWatch(settings, groups) as watch:
        for index, chunk in enumerate(chunks):
            if index % (CHUNKS // VALID_WAVES) == 0 and waves:
                driving.append(asyncio.create_task(drive(settings, waves.pop(0), SETTLE_S + 30)))
            sent += await publish_records(settings, chunk)
            await watch.wait(SETTLE_S, max_lag=MAX_BACKLOG)
    ended: dict[str, str] = {}
    for outcome in await asyncio.gather(*driving):
        ended |= outcome
    return sent, ended


async def _dead_letters(settings: Settings, expected: set[tuple[str, int, int]],
                        timeout_s: float) -> list[DeadLetter]:
    """Read saga.dlq until every expected source position is there (or time is up)."""
    dlq = Topics(settings.saga_topic_prefix).dlq
    deadline = time.monotonic() + timeout_s
    while True:
        letters = [wire.decode_dead_letter(r.value) for r in await read_all(settings, dlq)]
        found = {(x.source_topic, x.source_partition, x.source_offset) for x in letters}
        if expected <= found or time.monotonic() >= deadline:
            return letters
        await asyncio.sleep(1.0)


async def _poison_rows(settings: Settings, run_id: str) -> dict[str, int]:
    """Business rows and processed commands any participant wrote for a poison saga id."""
    conn = await asyncpg.connect(settings.dsn())
    try:
        counts = {}
        for participant in TRIP_PARTICIPANTS:
            assert participant.effects is not None
            business = participant.effects.in_schema(participant.schema).table
            for table in (business, f"{participant.schema}.processed_commands"):
                counts[table] = await conn.fetchval(
                    f"SELECT count(*) FROM {table} WHERE saga_id LIKE $1", f"{run_id}%")
        return counts
    finally:
        await conn.close()


async def test_poison_everywhere_is_dead_lettered_once_and_valid_sagas_are_unharmed(stack: Stack) -> None:
    settings = stack.settings
    topics = Topics(settings.saga_topic_prefix)
    run_id = f"poison-{uuid.uuid4().hex[:6]}"
    factory = PoisonFactory(topics, seed=20240501, run_id=run_id,
                            include_above_codec_limit=True)
    planned = {f"valid-{run_id}-{name}-{i}": name for name, n in VALID_MIX.items() for i in range(n)}
    sent = await wait_consumers_up(settings)
    started = time.monotonic()

    groups = {f"{settings.saga_topic_prefix}saga-orchestrator": _consumed(topics)[:2 + len(PARTICIPANTS)]}
    groups |= {app_id(p, settings): [topics.commands(p)] for p in PARTICIPANTS}
    more, ended = await _publish_interleaved(settings, factory, planned, groups)
    sent += more
    published_s = time.monotonic() - started
    expected = {s.position for s in sent}
    letters = await _dead_letters(settings, expected, SETTLE_S)
    lagging = await wait_caught_up(settings, groups, SETTLE_S)
    elapsed = time.monotonic() - started

    by_kind = Counter(s.record.kind for s in sent)
    by_topic = Counter(s.record.topic.removeprefix(topics.prefix) for s in sent)
    letters_by_position: dict[tuple[str, int, int], list[DeadLetter]] = defaultdict(list)
    for letter in letters:
        letters_by_position[(letter.source_topic, letter.source_partition, letter.source_offset)].append(letter)
    print(f"\n{len(sent)} malformed records in {published_s:.1f} s; settled after {elapsed:.1f} s; "
          f"{len(letters)} dead letters")
    print("per kind:", dict(sorted(by_kind.items())))
    print("per topic:", dict(sorted(by_topic.items())))

    missing = [s for s in sent if s.position not in letters_by_position]
    missing_kinds = Counter(f"{s.record.kind}@{s.record.topic.removeprefix(topics.prefix)}" for s in missing)
    assert not missing, f"{len(missing)} malformed records never reached the DLQ: {dict(missing_kinds)}"
    # A command whose envelope is readable but whose input is not is answered Unprocessable as well as
    # dead-lettered (the saga of a real command moves on); the orchestrator then refuses that answer, as there
    # is no such saga here. Those refusals are the only other letters.
    answered = {s.record.key.decode() for s in sent if s.record.kind == "command_input_undecodable" and s.record.key}
    strangers = [letter for position, found in letters_by_position.items() if position not in expected
                 for letter in found]
    refused_answers = [x for x in strangers if x.consumer == "orchestrator" and x.saga_id in answered
                       and "StepResult has nothing to act on" in x.reason]
    others = [x for x in strangers if x not in refused_answers]
    assert not others, f"unexpected dead letters: {[(x.source_topic, x.reason) for x in others[:5]]}"
    assert {x.saga_id for x in refused_answers} == answered
    for s in sent:
        found = letters_by_position[s.position]
        assert len({x.message_id for x in found}) == 1 and len({x.reason for x in found}) == 1, (s.record.kind, found)
        _check_letter(s, found[0])

    assert not lagging, f"consumer groups stalled: {lagging}"
    assert not stack.exited(), f"services exited: {stack.exited()}"
    rows = await _poison_rows(settings, run_id)
    assert {table: count for table, count in rows.items() if not table.endswith(".processed_commands")} == {
        table: 0 for table in rows if not table.endswith(".processed_commands")}
    assert sum(count for table, count in rows.items() if table.endswith(".processed_commands")) == len(answered)

    pool = await asyncpg.create_pool(settings.dsn(), min_size=1, max_size=2)
    try:
        wrong = await scenario_problems(pool, planned, ended)
    finally:
        await pool.close()
    assert not wrong, wrong
    report = await verify_system(settings, wait_s=10)  # every saga: the valid ones and the rejected ids
    assert report.ok, (report.violations[:5], report.not_terminal[:5])
    assert report.started == len(planned)
    assert elapsed < 90, f"took {elapsed:.1f} s"


def _check_letter(sent: Sent, letter: DeadLetter) -> None:
    record = sent.record
    assert letter.reason.strip(), f"{record.kind}: empty reason"
    assert letter.original_key == record.key, record.kind
    if letter.original_value is None and record.value is not None:
        assert "not kept" in letter.reason, (record.kind, letter.reason)
        assert len(record.value) > MAX_VALUE_BYTES // 2, record.kind
    else:
        assert letter.original_value == record.value, record.kind
    assert list(letter.original_headers) == list(record.headers) or "headers not kept" in letter.reason, (
        record.kind, letter.original_headers, record.headers)


def test_every_kind_is_undecodable_or_refused_by_its_topic() -> None:
    """Sanity of the generator itself: no kind yields a value its topic would take as a valid message
    with a matching key (those are the ones the consumer must refuse on other grounds)."""
    factory = PoisonFactory(Topics("x."), seed=1, include_above_codec_limit=True)
    for topic, role in factory.roles().items():
        for kind in factory.kinds_for(role):
            if kind.huge:
                continue
            record = factory.make(kind.name, topic)
            assert record.topic == topic and record.kind == kind.name
            if kind.name in {"random_bytes", "short_header", "unknown_fingerprint", "truncated",
                             "trailing_garbage", "wrong_schema", "empty_value", "bad_enum"}:
                with pytest.raises(WireError):
                    _decode_for(role, record.value or b"")


def _decode_for(role: str, value: bytes) -> object:
    if role == "start":
        return wire.decode_start(value)
    if role == "control":
        return wire.decode_incoming("control", value)
    if role == "results":
        return wire.decode_result(value)
    return wire.decode_command(value, participant="flight", message_id="m")


async def test_a_header_name_that_is_not_utf8_can_be_read_past(settings: Settings) -> None:
    # Without the patch, aiokafka 0.14 raises UnicodeDecodeError in getmany on every poll here (its C parser
    # decodes header names as strict UTF-8), and the records of other partitions drained by that call are lost.
    kafka_records.install()
    topic = f"{settings.saga_topic_prefix}raw-header-names"
    await ensure_topics(settings.kafka(), [topic], 3)
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_servers())
    await producer.start()
    try:
        for n in range(6):
            await producer.send_and_wait(topic, b"fine", key=b"k%d" % n, partition=n % 3)
        bad = await publish_with_raw_header_name(settings, topic, 0, b"k", b"v", header_name=b"\xff\xfe")
        await producer.send_and_wait(topic, b"after", key=b"k", partition=0)
    finally:
        await producer.stop()
    records = await read_all(settings, topic, timeout_s=10)
    assert len(records) == 6 + 2  # every record of every partition, the bad one included
    [odd] = [r for r in records if r.partition == 0 and r.offset == bad]
    [(name, value)] = odd.headers
    assert (kafka_records.raw_header_name(name), value) == (b"\xff\xfe", b"1")
    assert ConsumedRecord(topic=topic, headers=tuple(odd.headers)).unreadable == (
        "a header name is not UTF-8 (base64://4=)")
    assert any(r.partition == 0 and r.value == b"after" for r in records)
