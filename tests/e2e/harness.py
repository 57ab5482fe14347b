"""The whole system as child processes on real Kafka and Postgres, and helpers to drive and observe it."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

import asyncpg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord

from saga_orchestrator.cli.run_cmd import service_commands, service_environment, start_service, stop_services
from saga_orchestrator.client.event_feed import EventFeed, assign_from_beginning
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.orchestrator.bootstrap import prepare
from saga_orchestrator.orchestrator.dead_letter_index import DeadLetterIndexer
from saga_orchestrator.orchestrator.store.dead_letters import PostgresDeadLetterIndex
from saga_orchestrator.orchestrator.store.operations.reads import PostgresReads
from saga_orchestrator.participants.trip.scenarios import SCENARIOS
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.event_types import Event
from saga_orchestrator.schemas.topics import Topics


class Stack:
    """Every service of one test module, each a real process that can be stopped, killed and restarted."""

    def __init__(self, settings: Settings, log_dir: Path) -> None:
        self.settings = settings
        self.log_dir = log_dir
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def labels(self) -> list[str]:
        return list(service_commands(self.settings))

    def start(self, *labels: str, extra_env: dict[str, str] | None = None) -> None:
        """Start the named services (all when none is named), ``extra_env`` added to their environment."""
        for label in labels or tuple(self.labels):
            self.processes[label] = start_service(self.settings, label, str(self.log_dir), extra_env)

    def kill(self, label: str) -> None:
        """kill -9 one service."""
        process = self.processes[label]
        os.kill(process.pid, signal.SIGKILL)
        process.wait()

    def stop(self) -> None:
        """Stop every service (SIGTERM, then SIGKILL)."""
        stop_services(self.processes)

    def exited(self) -> dict[str, int]:
        """Services that have exited, with their exit codes."""
        return {k: p.returncode for k, p in self.processes.items() if p.poll() is not None}

    def start_another(self, label: str, name: str, extra_env: dict[str, str] | None = None) -> None:
        """Start one more process of service ``label`` as ``name`` (its log ``name``.log), with its own
        SAGA_HOME (its faust data folder) and ``extra_env``."""
        env = {**service_environment(self.settings), "SAGA_HOME": str(self.log_dir / f"{name}-home"),
               "SAGA_HEALTH_PORT": "0", **(extra_env or {})}
        log = open(self.log_dir / f"{name}.log", "ab")  # the process keeps writing to it
        self.processes[name] = subprocess.Popen(service_commands(self.settings)[label], stdout=log, stderr=log,
                                                env=env)

    def log(self, label: str) -> str:
        """What a service logged so far."""
        path = self.log_dir / f"{label}.log"
        return path.read_text(errors="replace") if path.exists() else ""


async def start_stack(settings: Settings, log_dir: Path) -> Stack:
    """Create the topics, then start every service."""
    await prepare(settings)
    stack = Stack(settings, log_dir)
    stack.start()
    return stack


async def publish(settings: Settings, topic: str, key: bytes | None, value: bytes | None,
                  headers: list[tuple[str, bytes]] | None = None) -> None:
    """Publish one record, with a fresh message id unless headers are given."""
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_servers())
    await producer.start()
    try:
        if headers is None:
            headers = [("message_id", str(uuid.uuid4()).encode())]
        await producer.send_and_wait(topic, value=value, key=key, headers=headers)
    finally:
        await producer.stop()


async def read_topic(settings: Settings, topic: str, timeout_s: float = 5.0) -> list[ConsumerRecord]:
    """Every record currently on ``topic``, from the beginning."""
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_servers(), enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = await assign_from_beginning(consumer, topic)
        ends = await consumer.end_offsets(partitions)
        records: list[ConsumerRecord] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for batch in (await consumer.getmany(timeout_ms=200)).values():
                records.extend(batch)
            positions = [await consumer.position(p) for p in partitions]
            if all(pos >= ends[p] for pos, p in zip(positions, partitions, strict=True)):
                break
        return records
    finally:
        await consumer.stop()


async def start_happy_trips(settings: Settings, prefix: str, count: int) -> list[str]:
    """Publish ``count`` StartSagas of the trip's happy scenario, ids ``prefix-<random>``; their ids."""
    saga_ids = [f"{prefix}-{uuid.uuid4().hex[:8]}" for _ in range(count)]
    for saga_id in saga_ids:
        await publish(settings, Topics(settings.saga_topic_prefix).start, saga_id.encode(),
                      wire.encode_start(SCENARIOS["happy"].start(saga_id)))
    return saga_ids


async def terminal_events(settings: Settings, saga_ids: Iterable[str], timeout_s: float) -> dict[str, Event]:
    """The terminal event of each saga, read from saga.events, waiting up to ``timeout_s`` for them."""
    feed = EventFeed(settings.kafka(), Topics(settings.saga_topic_prefix).events)
    await feed.start()
    try:
        return await feed.wait_terminal(saga_ids, timeout_s)
    finally:
        await feed.stop()


async def wait_for(predicate_coro: object, timeout_s: float, interval_s: float = 0.2) -> bool:
    """Poll an async predicate (a zero-argument coroutine function) until it is true or time is up."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await predicate_coro():  # type: ignore[operator]
            return True
        await asyncio.sleep(interval_s)
    return False


async def saga_cli(settings: Settings, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``saga ARGS...`` (the real CLI, a child process) with ``settings``; its exit code and output."""
    return await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "saga_orchestrator.cli", *args],
                                   env=service_environment(settings), capture_output=True, text=True,
                                   timeout=timeout_s)


def run_refused(settings: Settings, *args: str, **env: str) -> str:
    """Run ``saga ARGS...`` with ``settings`` and ``env`` changed, expect it to refuse (exit code 2, no
    traceback) and return the one ``error:`` line it printed."""
    result = subprocess.run([sys.executable, "-P", "-m", "saga_orchestrator.cli", *args], capture_output=True,
                            text=True, timeout=120, env={**service_environment(settings), **env})
    assert result.returncode == 2, (result.returncode, result.stdout[-2000:], result.stderr[-2000:])
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in result.stderr + result.stdout, result.stderr[-3000:]
    return lines[0]


async def sagas_by_version(settings: Settings) -> dict[tuple[str, int | None], int]:
    """How many sagas of the read model are in each (status, definition version)."""
    conn = await asyncpg.connect(settings.dsn())
    try:
        rows = await conn.fetch("SELECT status, definition_version, count(*) AS n FROM saga.saga_summary GROUP BY 1, 2")
    finally:
        await conn.close()
    return {(row["status"], row["definition_version"]): row["n"] for row in rows}


async def index_dead_letters(settings: Settings, pool: asyncpg.Pool, count: int, timeout_s: float = 30.0) -> None:
    """Run the orchestrator's dead-letter indexer on ``settings``' saga.dlq until the index holds ``count`` letters
    (AssertionError after ``timeout_s``), then stop it."""
    index = PostgresDeadLetterIndex(pool)
    stop = asyncio.Event()
    running = asyncio.create_task(DeadLetterIndexer(index, PostgresReads(pool), settings.kafka(),
                                                    Topics(settings.saga_topic_prefix).dlq).run(stop))
    try:
        async def held() -> bool:
            return await index.count() >= count
        assert await wait_for(held, timeout_s), f"the index holds {await index.count()} letters, not {count}"
    finally:
        stop.set()
        await running
