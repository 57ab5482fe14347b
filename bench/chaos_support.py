"""Helpers of the chaos run: a publisher that outlives broker restarts, readiness, schedules, waiting."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from aiokafka import AIOKafkaProducer

from saga_orchestrator.cli.demo_cmd import publish_starts
from saga_orchestrator.cli.run_cmd import health_port
from saga_orchestrator.client.event_feed import EventFeed
from saga_orchestrator.infra.health_server import fetch_health
from saga_orchestrator.infra.kafka_clients import KafkaClients
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.schemas.topics import Topics
from tests.e2e.harness import Stack, start_stack

log = logging.getLogger("saga.chaos")


class Publisher:
    """Publishes records until Kafka acknowledges them, through broker restarts.

    One shared idempotent producer; a publish that fails (the broker is away) replaces it and tries again
    after a second, with the same message id, so a retry is a duplicate the consumer drops.
    """

    def __init__(self, kafka: KafkaClients) -> None:
        self._kafka = kafka
        self._producer: AIOKafkaProducer | None = None
        self._lock = asyncio.Lock()

    async def publish(self, topic: str, saga_id: str, body: bytes, message_id: str) -> None:
        """Publish one record keyed by ``saga_id``; returns once Kafka acknowledged it."""
        headers = [("message_id", message_id.encode()), ("saga_id", saga_id.encode())]
        while True:
            producer = await self._current()
            try:
                await asyncio.wait_for(producer.send_and_wait(topic, value=body, key=saga_id.encode(),
                                                              headers=headers), 30)
                return
            except Exception as error:  # broker away: wait, then try again (with a new producer)
                log.debug("publish failed, retrying", extra={"saga_id": saga_id, "error": repr(error)})
                await self._drop(producer)
                await asyncio.sleep(1.0)

    async def close(self) -> None:
        """Stop the producer."""
        producer, self._producer = self._producer, None
        if producer is not None:
            with contextlib.suppress(Exception):
                await producer.stop()

    async def _current(self) -> AIOKafkaProducer:
        async with self._lock:
            while self._producer is None:
                producer = self._kafka.producer(acks="all", enable_idempotence=True,
                                            linger_ms=5, request_timeout_ms=20_000)
                try:
                    await producer.start()
                    self._producer = producer
                except Exception:
                    with contextlib.suppress(Exception):
                        await producer.stop()
                    await asyncio.sleep(1.0)
            return self._producer

    async def _drop(self, broken: AIOKafkaProducer) -> None:
        async with self._lock:
            if id(self._producer) != id(broken):  # (id: ``is`` would narrow ``broken`` to Optional)
                return  # another publisher replaced it already
            self._producer = None
        with contextlib.suppress(Exception):
            await broken.stop()


async def started_and_ready(settings: Settings, log_dir: Path) -> Stack:
    """Start every service (``start_stack``) and wait until they are ready; stopped again on failure."""
    stack = await start_stack(settings, log_dir)
    try:
        await wait_ready(stack)
    except BaseException:
        stack.stop()
        raise
    return stack


async def wait_ready(stack: Stack, timeout_s: float = 120.0) -> None:
    """Wait until every service reports Kafka and Postgres reachable on /health, then until one happy saga
    went through end to end (so every consumer has joined its group)."""
    settings = stack.settings
    deadline = time.monotonic() + timeout_s
    for label in stack.labels:
        while True:
            body = await fetch_health(settings.saga_health_host, health_port(settings, label))
            if body is not None and b'"kafka_ok":true' in body and b'"postgres_ok":true' in body:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{label} is not healthy on port {health_port(settings, label)}: {body!r}")
            await asyncio.sleep(0.5)
    saga_id = f"warm-up-{uuid.uuid4().hex[:8]}"
    feed = EventFeed(settings.kafka(), Topics(settings.saga_topic_prefix).events)
    await feed.start()
    try:
        await publish_starts(settings, {saga_id: "happy"})
        ended = await feed.wait_terminal([saga_id], max(1.0, deadline - time.monotonic()))
    finally:
        await feed.stop()
    if saga_id not in ended:
        raise TimeoutError("the warm-up saga did not end")


def schedule(rng: random.Random, duration_s: float, every_s: float, phase: float) -> list[float]:
    """Moments (seconds into the run) spread over the run: one per ``every_s``, jittered, at least one;
    none when ``every_s`` is 0. ``phase`` (0..1) places them within their slot."""
    if every_s <= 0:
        return []
    count = max(1, round(duration_s / every_s))
    slot = duration_s / count
    return [slot * (i + phase + rng.uniform(-0.15, 0.15)) for i in range(count)]


async def sleep_or_over(seconds: float, over: asyncio.Event) -> bool:
    """Sleep ``seconds`` (or less when ``over`` is set); True when ``over`` is set."""
    if seconds > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(over.wait(), seconds)
    return over.is_set()


async def poll_until(condition: Callable[[], bool], deadline: float, every_s: float = 0.2) -> bool:
    """Poll ``condition`` until it holds (True) or ``deadline`` (monotonic) passes (False)."""
    while time.monotonic() < deadline:
        if condition():
            return True
        await asyncio.sleep(every_s)
    return condition()


async def publish_paced(settings: Settings, starts: dict[str, bytes], rate: float) -> None:
    """Publish each saga's StartSaga (``starts``: saga id → encoded StartSaga) at ``rate`` per second, each
    retried until Kafka acknowledged it (through broker restarts)."""
    publisher = Publisher(settings.kafka())
    topic = Topics(settings.saga_topic_prefix).start
    started = time.monotonic()
    sending: set[asyncio.Task[None]] = set()
    try:
        for index, (saga_id, body) in enumerate(starts.items()):
            await asyncio.sleep(max(0.0, started + index / rate - time.monotonic()))
            task = asyncio.create_task(publisher.publish(topic, saga_id, body, f"start-{saga_id}"))
            sending.add(task)
            task.add_done_callback(sending.discard)
        await asyncio.gather(*sending)
    finally:
        await publisher.close()
