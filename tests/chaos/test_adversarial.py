"""Well-formed but wrong input, as a hostile or buggy client would send it, against the whole system (real Kafka
and Postgres, every service a process).

Each test starts 50 healthy trip sagas around one attack (half before it, half after; two of them with a flaky
card, whose retries need the durable timers) and asserts that all 50 complete at their usual latency, that every
consumer group catches up to the end of what it reads, that no service restarted, that the attack is visible (a
dead letter, a quarantine, a parked row, a refused reply) and that ``verify`` names only the attacked saga, if
any. The attacks are the ones that stopped the system, or doubled an effect, before: wrong replies for a live
saga, forged message ids, header names that are not UTF-8, a forward command after its compensation, a
decompression bomb, a record the broker refuses for good, and a saga whose definition version is gone.
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiokafka import AIOKafkaProducer

from saga_orchestrator.client.event_feed import EventFeed
from saga_orchestrator.client.saga_client import client_headers
from saga_orchestrator.infra import kafka_records
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.operations.verify import verify_system
from saga_orchestrator.orchestrator.bootstrap import prepare
from saga_orchestrator.participants.runner import app_id
from saga_orchestrator.participants.trip import PARTICIPANTS
from saga_orchestrator.participants.trip.scenarios import COMPLETED_EFFECTS, SCENARIOS, Scenario
from saga_orchestrator.schemas import event_types as ev
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.message_types import (
    CancelSaga,
    CommandKind,
    DeadLetter,
    ResultStatus,
    StepCommand,
    StepResult,
)
from saga_orchestrator.schemas.topics import Topics
from tests.chaos.tools.kafka_tools import publish_with_raw_header_name, read_all, set_max_message_bytes, wait_caught_up
from tests.conftest import run_sync
from tests.e2e.harness import Stack, saga_cli

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]

HEALTHY = 50
FLAKY = 2  # of the 50: a card that fails twice, transiently, so the saga completes only if its timers fire
SETTLE_S = 90.0
# The trip saga in two versions: the attack of the last test removes the second from the orchestrator.
BOTH_VERSIONS = "saga_orchestrator.participants.trip:TRIP,tests.chaos.tools.versions:TRIP_V2"
DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024 + 12  # the broker's default max.message.bytes
SLOW_HOTEL = Scenario("slow_hotel", "SagaCompleted", COMPLETED_EFFECTS, {"destination": "Slowtown"})

kafka_records.install()  # this process reads topics holding records that plain aiokafka 0.14 cannot


@dataclass
class Wave:
    """What a wave of sagas did: each one's terminal event and its latency (publish to end, ms)."""

    ended: dict[str, str]
    latency_ms: dict[str, int]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.latency_ms.values())


class System:
    """The module's running system and what tests need to drive and observe it."""

    def __init__(self, settings: Settings, stack: Stack) -> None:
        self.settings = settings
        self.verify_settings = settings.model_copy(update={"saga_definitions": BOTH_VERSIONS})
        self.stack = stack
        self.topics = Topics(settings.saga_topic_prefix)
        self.pids = {label: process.pid for label, process in stack.processes.items()}
        self.usual_ms = 0.0
        self._producer: AIOKafkaProducer | None = None
        self._feed: EventFeed | None = None

    @property
    def feed(self) -> EventFeed:
        assert self._feed is not None, "open() first"
        return self._feed

    async def open(self) -> None:
        """Connect a producer and a feed of saga.events (from its beginning) on the running event loop."""
        self._producer = AIOKafkaProducer(bootstrap_servers=self.settings.kafka_servers(), acks="all",
                                          max_request_size=32 * 1024 * 1024)
        await self._producer.start()
        self._feed = EventFeed(self.settings.kafka(), self.topics.events)
        await self._feed.start()

    async def close(self) -> None:
        if self._feed is not None:
            await self._feed.stop()
        if self._producer is not None:
            await self._producer.stop()
        self._feed = self._producer = None

    async def send(self, topic: str, key: bytes | None, value: bytes | None,
                   headers: list[tuple[str, bytes]] | None = None) -> tuple[int, int]:
        """Publish one record; its (partition, offset)."""
        assert self._producer is not None
        sent = await self._producer.send_and_wait(topic, value=value, key=key, headers=headers or [])
        return sent.partition, sent.offset

    async def start(self, saga_id: str, scenario: Scenario) -> int:
        """Publish a StartSaga; when it was published (epoch ms)."""
        value = wire.encode_start(scenario.start(saga_id))
        await self.send(self.topics.start, saga_id.encode(), value, client_headers(saga_id, "trip"))
        return time.time_ns() // 1_000_000

    async def wait_for(self, found: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while not found():
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout_s} s for {what}")
            await self.feed.poll(100)

    def history(self, saga_id: str) -> list[ev.Event]:
        return self.feed.history(saga_id)

    def has(self, saga_id: str, kind: type[ev.Event], step: str | None = None) -> bool:
        return any(isinstance(e, kind) and (step is None or getattr(e, "step", None) == step)
                   for e in self.history(saga_id))

    async def around(self, attack: Callable[[], Awaitable[Any]], extra: dict[str, Scenario] | None = None
                     ) -> tuple[Wave, Any]:
        """50 healthy sagas, half started before ``attack`` and half after, plus ``extra`` ones (started first);
        waits for all of them to end."""
        run = uuid.uuid4().hex[:6]
        healthy = {f"h-{run}-{n}": SCENARIOS["card_flaky" if n < FLAKY else "happy"] for n in range(HEALTHY)}
        names = list(healthy)
        published: dict[str, int] = {}
        for saga_id, scenario in (extra or {}).items():
            published[saga_id] = await self.start(saga_id, scenario)
        for saga_id in names[: HEALTHY // 2]:
            published[saga_id] = await self.start(saga_id, healthy[saga_id])
        result = await attack()
        for saga_id in names[HEALTHY // 2:]:
            published[saga_id] = await self.start(saga_id, healthy[saga_id])
        await self.wait_for(lambda: healthy.keys() <= self.feed.terminal.keys(), "the healthy sagas", SETTLE_S)
        wave = Wave({s: type(self.feed.terminal[s]).__name__ for s in healthy},
                    {s: self.feed.terminal[s].occurred_at - published[s] for s in healthy})
        return wave, result

    async def letters(self, positions: set[tuple[str, int, int]], timeout_s: float = 30) -> dict[tuple[str, int, int],
                                                                                                 DeadLetter]:
        """The dead letters of records at ``positions`` (topic, partition, offset), waiting for all of them."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = {}
            for record in await read_all(self.settings, self.topics.dlq):
                letter = wire.decode_dead_letter(record.value)
                position = (letter.source_topic, letter.source_partition, letter.source_offset)
                if position in positions:
                    found[position] = letter
            if found.keys() == positions or time.monotonic() > deadline:
                return found
            await asyncio.sleep(0.5)

    async def check_unharmed(self, wave: Wave, attacked: frozenset[str] = frozenset()) -> None:
        """The healthy sagas completed at their usual latency, every group caught up, no service restarted, and
        verify names nothing but ``attacked``."""
        assert set(wave.ended.values()) == {"SagaCompleted"}, wave.ended
        usual = self.usual_ms
        slowest = max(wave.latency_ms.values())
        print(f"\nmedian latency {wave.median_ms:.0f} ms (usual {usual:.0f} ms), slowest {slowest} ms")
        assert wave.median_ms <= 3 * usual + 1000, (wave.median_ms, usual)
        groups = {f"{self.settings.saga_topic_prefix}saga-orchestrator":
                  [self.topics.start, self.topics.control, *(self.topics.results(p) for p in PARTICIPANTS)]}
        groups |= {app_id(p, self.settings): [self.topics.commands(p)] for p in PARTICIPANTS}
        lagging = await wait_caught_up(self.settings, groups, 60)
        assert not lagging, f"consumer groups behind: {lagging}"
        assert not self.stack.exited(), f"services exited: {self.stack.exited()}"
        assert {label: p.pid for label, p in self.stack.processes.items()} == self.pids, "a service restarted"
        report = await verify_system(self.verify_settings, wait_s=0 if attacked else 20)
        named = {v.saga_id for v in report.violations} | {saga_id for saga_id, _, _ in report.not_terminal}
        assert named == attacked, (report.violations[:5], report.not_terminal[:5])

    def restart_orchestrator(self, extra_env: dict[str, str] | None = None) -> None:
        process = self.stack.processes["orchestrator"]
        os.kill(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
        self.stack.start("orchestrator", extra_env=extra_env)
        self.pids["orchestrator"] = self.stack.processes["orchestrator"].pid


@pytest.fixture(scope="module")
def system(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    log_dir: Path = tmp_path_factory.mktemp("logs")
    run_sync(prepare(settings))
    stack = Stack(settings, log_dir)
    stack.start()
    running = System(settings, stack)

    async def usual_latency() -> float:
        # A wave with no attack; its first sagas also wait for the services to come up, so a second one counts.
        await running.open()
        try:
            await running.around(_no_attack)
            wave, _ = await running.around(_no_attack)
        finally:
            await running.close()
        assert set(wave.ended.values()) == {"SagaCompleted"}
        return wave.median_ms

    try:
        running.usual_ms = run_sync(usual_latency())
        yield running
    finally:
        stack.stop()
        print(f"service logs: {log_dir}")


@pytest.fixture
async def live(system: System) -> AsyncIterator[System]:
    """The system, connected on this test's event loop."""
    await system.open()
    try:
        yield system
    finally:
        await system.close()


async def _no_attack() -> None:
    return None


def _result(saga_id: str, step: str, *, key: str | None = None, attempt: int = 1,
            output: bytes | None = None) -> bytes:
    return wire.encode_result(StepResult(saga_id=saga_id, step=step, kind=CommandKind.FORWARD,
                                         idempotency_key=key or f"{saga_id}:{step}", attempt=attempt,
                                         status=ResultStatus.SUCCEEDED, output=output))


async def test_wrong_replies_for_a_live_saga_are_dead_lettered_and_it_goes_on(live: System) -> None:
    system = live
    target = f"wrong-{uuid.uuid4().hex[:6]}"
    other = f"other-{uuid.uuid4().hex[:6]}"
    results = system.topics.results("hotel")

    async def attack() -> dict[str, tuple[int, int]]:
        # Its hotel reply comes 1.2 s late: a window in which the saga waits for it.
        await system.wait_for(lambda: system.has(target, ev.StepCommandSent, "book_hotel"), "the hotel command")
        sent = {
            "unknown step": await system.send(results, target.encode(), _result(target, "book_spaceship")),
            "foreign key": await system.send(results, target.encode(),
                                             _result(target, "book_hotel", key=f"{other}:book_hotel")),
            # A success whose output nothing can carry on, before the real reply: the step fails for good.
            "oversize": await system.send(results, target.encode(),
                                          _result(target, "book_hotel", output=b"o" * 600_000)),
        }
        return sent

    wave, sent = await system.around(attack, {target: SLOW_HOTEL, other: SCENARIOS["happy"]})
    letters = await system.letters({(results, *sent["unknown step"]), (results, *sent["foreign key"])})
    reasons = " | ".join(letter.reason for letter in letters.values())
    assert len(letters) == 2 and "book_spaceship" in reasons and f"{other}:book_hotel" in reasons, reasons
    await system.wait_for(lambda: target in system.feed.terminal and other in system.feed.terminal, "the two ends")
    refused = [e for e in system.history(target) if isinstance(e, ev.StepFailed) and e.step == "book_hotel"]
    assert [e.error_type for e in refused] == ["OutputRefused"]
    assert type(system.feed.terminal[target]).__name__ == "SagaCompensated"  # the hotel booked, and undone
    assert type(system.feed.terminal[other]).__name__ == "SagaCompleted"  # its key was not taken
    await system.check_unharmed(wave)
    # The saga has ended: its replies are not replayed from saga.dlq unless the operator insists.
    replay = await saga_cli(system.settings, "dlq", "replay", "--saga", target)
    said = " ".join(replay.stdout.split())
    assert replay.returncode == 1 and said.count("ended COMPENSATED") == 2 and "0 published" in said, said
    forced = await saga_cli(system.settings, "dlq", "replay", "--saga", target, "--force")
    assert forced.returncode == 0 and "2 published" in " ".join(forced.stdout.split()), forced


async def test_forged_message_ids_swallow_no_reply_and_no_timer(live: System) -> None:
    system = live
    target = f"forged-{uuid.uuid4().hex[:6]}"
    start = wire.encode_start(SCENARIOS["happy"].start(f"headerless-{uuid.uuid4().hex[:6]}"))
    headerless_key = wire.decode_start(start).saga_id.encode()

    async def attack() -> list[tuple[int, int]]:
        sent = []
        # Cancels for a saga that does not exist, under the ids the target's reply and retry timer would have.
        for forged in (f"{target}:book_flight:reply:1", f"{target}:charge_card:reply:3",
                       f"timer:{target}:STEP_RETRY:charge_card:2", f"timer:{target}:STEP_TIMEOUT:book_hotel:1"):
            cancel = wire.encode_cancel(CancelSaga(saga_id="nobody", reason="forged"))
            sent.append(await system.send(system.topics.control, b"nobody", cancel, [("message_id", forged.encode())]))
        # The same headerless start twice: one saga.
        await system.send(system.topics.start, headerless_key, start)
        await system.send(system.topics.start, headerless_key, start)
        return sent

    wave, sent = await system.around(attack, {target: SCENARIOS["card_flaky"]})
    letters = await system.letters({(system.topics.control, *position) for position in sent})
    assert len(letters) == 4 and all("nobody" in letter.reason for letter in letters.values())
    await system.wait_for(lambda: target in system.feed.terminal, "the target's end")
    assert type(system.feed.terminal[target]).__name__ == "SagaCompleted"  # its replies and timers all counted
    headerless = headerless_key.decode()
    await system.wait_for(lambda: headerless in system.feed.terminal, "the headerless saga's end")
    assert sum(isinstance(e, ev.SagaStarted) for e in system.history(headerless)) == 1
    assert not system.has(headerless, ev.SagaRejected)  # the copy was a duplicate, not a second start
    await system.check_unharmed(wave)


async def test_header_names_that_are_not_utf8_are_dead_lettered_on_every_topic(live: System) -> None:
    system = live
    victim = f"rawname-{uuid.uuid4().hex[:6]}"
    topics = system.topics
    values = {
        topics.start: wire.encode_start(SCENARIOS["happy"].start(victim)),
        topics.control: wire.encode_cancel(CancelSaga(saga_id=victim, reason="x")),
        topics.results("payment"): _result(victim, "charge_card"),
        topics.commands("flight"): (await _command_of(system, "flight")).value,
        topics.commands("notification"): (await _command_of(system, "notification")).value,
    }

    async def attack() -> set[tuple[str, int, int]]:
        sent = set()
        for topic, value in values.items():
            offset = await publish_with_raw_header_name(system.settings, topic, 0, victim.encode(), value,
                                                        header_name=b"\xff\xfe")
            sent.add((topic, 0, offset))
        return sent

    wave, sent = await system.around(attack)
    letters = await system.letters(sent)
    assert letters.keys() == sent, sent - letters.keys()
    for letter in letters.values():
        assert "a header name is not UTF-8 (base64://4=)" in letter.reason, letter.reason
        assert ("base64://4=", b"1") in letter.original_headers
    await system.check_unharmed(wave)  # the victim's start was refused, so it has only a SagaRejected


async def _command_of(system: System, participant: str) -> Any:
    """A command record from a participant's commands topic (the waves left plenty)."""
    records = await read_all(system.settings, system.topics.commands(participant))
    return records[-1]


async def test_a_forward_command_after_its_compensation_does_not_take_effect(live: System) -> None:
    system = live
    # A step's compensation reaches the flight participant before its forward command (a zombie relay, a
    # replay of an old command, a partition move): the forward must not book after the cancellation.
    target = f"late-{uuid.uuid4().hex[:6]}"
    trip = SCENARIOS["happy"].start(target).input
    commands = system.topics.commands("flight")

    def command(kind: CommandKind, action: str, key: str) -> tuple[bytes, list[tuple[str, bytes]]]:
        message_id = f"{key}:command:1"
        value = wire.encode_command(StepCommand(saga_id=target, saga_type="trip", step="book_flight",
                                                participant="flight", action=action, kind=kind, idempotency_key=key,
                                                attempt=1, input=trip, message_id=message_id))
        return value, [("message_id", message_id.encode()), ("saga_id", target.encode()), ("saga_type", b"trip")]

    async def attack() -> None:
        await system.send(commands, target.encode(), *command(CommandKind.COMPENSATE, "cancel_flight",
                                                               f"{target}:book_flight:compensate"))
        await system.send(commands, target.encode(), *command(CommandKind.FORWARD, "book_flight",
                                                               f"{target}:book_flight"))

    wave, _ = await system.around(attack)
    results = system.topics.results("flight")

    async def replies() -> list[StepResult]:
        records = await read_all(system.settings, results)
        return [wire.decode_result(r.value) for r in records if r.key == target.encode()]

    deadline = time.monotonic() + 30
    while True:
        answered = [(r.kind, r.status, r.error_type) for r in await replies()]
        if len(answered) >= 2 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    assert answered == [(CommandKind.COMPENSATE, ResultStatus.SUCCEEDED, None),
                        (CommandKind.FORWARD, ResultStatus.FAILED, "Compensated")]
    conn = await asyncpg.connect(system.settings.dsn())
    try:
        assert await conn.fetchval("SELECT count(*) FROM flight.bookings WHERE saga_id = $1", target) == 0
    finally:
        await conn.close()
    await system.check_unharmed(wave)


async def test_a_decompression_bomb_is_dead_lettered_without_being_read(live: System) -> None:
    system = live
    bomb = bytes(20 * 1024 * 1024)  # 20 MiB of zeros: about 20 kB in gzip, under every topic limit
    producer = AIOKafkaProducer(bootstrap_servers=system.settings.kafka_servers(), compression_type="gzip",
                                max_request_size=64 * 1024 * 1024, max_batch_size=64 * 1024 * 1024)

    async def attack() -> set[tuple[str, int, int]]:
        await producer.start()
        try:
            sent = set()
            for topic in (system.topics.start, system.topics.commands("hotel")):
                meta = await producer.send_and_wait(topic, bomb, key=b"bomb", partition=0)
                sent.add((topic, meta.partition, meta.offset))
            return sent
        finally:
            await producer.stop()

    wave, sent = await system.around(attack)
    letters = await system.letters(sent)
    assert letters.keys() == sent
    for letter in letters.values():
        assert "unreadable record batch at offsets" in letter.reason and "decompresses to more than" in letter.reason
        assert letter.original_value is not None and len(letter.original_value) < 1024 * 1024  # as it came
    await system.check_unharmed(wave)


async def test_a_record_the_broker_refuses_parks_its_saga_alone(live: System) -> None:
    system = live
    target = f"parked-{uuid.uuid4().hex[:6]}"
    big = Scenario("big_input", "SagaCompleted", COMPLETED_EFFECTS, {"customer_id": "c" * 100_000})
    # saga.events takes 64 kB records from now on: the target's SagaStarted (it copies the input) is refused.
    await set_max_message_bytes(system.settings, [system.topics.events], 64 * 1024)
    try:
        wave, _ = await system.around(_no_attack, {target: big})
        pool = await asyncpg.connect(system.settings.dsn())
        try:
            parked = await pool.fetch("SELECT id, reason FROM saga.outbox_parked WHERE message_key = $1", target)
        finally:
            await pool.close()
        assert len(parked) == 1 and "MessageSizeTooLarge" in parked[0]["reason"], parked
        listed = await saga_cli(system.settings, "outbox", "list", "--saga", target)
        assert listed.returncode == 0 and str(parked[0]["id"]) in listed.stdout, listed
        await system.check_unharmed(wave, frozenset({target}))  # it waits, in order, behind its parked row
    finally:
        await set_max_message_bytes(system.settings, [system.topics.events], DEFAULT_MAX_MESSAGE_BYTES)
    requeued = await saga_cli(system.settings, "outbox", "requeue", str(parked[0]["id"]))
    assert requeued.returncode == 0, requeued
    await system.wait_for(lambda: target in system.feed.terminal, "the target's end once requeued", 60)
    assert type(system.feed.terminal[target]).__name__ == "SagaCompleted"


async def test_a_saga_whose_version_is_gone_is_quarantined_until_released(live: System) -> None:
    system = live
    # Deploy version 2 next to 1 and start the target on it, then roll the deployment back to version 1 alone
    # while the target waits for its slow hotel.
    system.restart_orchestrator({"SAGA_DEFINITIONS": BOTH_VERSIONS})
    target = f"v2-{uuid.uuid4().hex[:6]}"
    await system.start(target, SLOW_HOTEL)
    await system.wait_for(lambda: system.has(target, ev.StepCommandSent, "book_hotel"), "the target's hotel command")
    assert system.history(target)[0].definition_version == 2
    system.restart_orchestrator({"SAGA_ALLOW_STRANDING": "true"})  # a rollback forced over the check at start
    await system.wait_for(lambda: system.has(target, ev.SagaQuarantined), "the quarantine", 90)
    # The healthy sagas run while the target sits quarantined, its timers firing to no effect.
    wave, _ = await system.around(_no_attack)
    [quarantined] = [e for e in system.history(target) if isinstance(e, ev.SagaQuarantined)]
    assert "UnknownDefinition" in quarantined.reason and "version 2" in quarantined.reason
    await system.check_unharmed(wave, frozenset({target}))

    refused = await saga_cli(system.settings, "release", target)  # this CLI has version 1 only
    assert refused.returncode == 2 and "still cannot go on" in refused.stdout + refused.stderr
    system.restart_orchestrator({"SAGA_DEFINITIONS": BOTH_VERSIONS})
    released = await saga_cli(system.verify_settings, "release", target, "--operator", "ops")
    assert released.returncode == 0, released
    await system.wait_for(lambda: target in system.feed.terminal, "the target's end once released", 60)
    assert type(system.feed.terminal[target]).__name__ == "SagaCompleted"
    assert system.has(target, ev.SagaReleased)
    report = await verify_system(system.verify_settings, wait_s=20)
    assert report.ok, (report.violations[:5], report.not_terminal[:5])
