"""Service health without real servers: state changes and their log lines, timer hold, the HTTP endpoint."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
from aiokafka import TopicPartition

from saga_orchestrator.cli.run_cmd import health_port, service_commands
from saga_orchestrator.infra.consumer_lag import partition_lags
from saga_orchestrator.infra.health import Dependency, ServiceHealth
from saga_orchestrator.infra.health_server import HealthMonitor, KafkaProbe, fetch_health, serve_health
from saga_orchestrator.infra.kafka_clients import KafkaClients
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.infra.startup import StartupStopped, retry_startup
from saga_orchestrator.orchestrator.bootstrap import TIMER_HOLD_AFTER_JOIN_S, TIMER_HOLD_AFTER_OUTAGE_S, timer_hold


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_each_state_change_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    health = ServiceHealth("relay", clock=Clock())
    with caplog.at_level(logging.INFO, logger="saga.health"):
        for ok in (True, True, False, False, True, True):
            health.report(Dependency.KAFKA, ok, None if ok else "refused")
    assert [r.getMessage() for r in caplog.records] == [
        "kafka reachable", "kafka unavailable", "kafka reachable again"]
    unavailable = caplog.records[1]
    assert unavailable.dependency == "kafka" and unavailable.error == "refused"  # type: ignore[attr-defined]
    assert health.states[Dependency.KAFKA].outages == 1


def test_outage_within_covers_the_outage_and_the_grace_after_it() -> None:
    clock = Clock()
    health = ServiceHealth("orchestrator", clock=clock)
    assert not health.outage_within(10)  # nothing known yet counts as up
    health.report(Dependency.POSTGRES, True)
    assert not health.outage_within(10)
    health.report(Dependency.POSTGRES, False, "gone")
    assert health.outage_within(10)
    clock.now += 30
    health.report(Dependency.POSTGRES, True)
    clock.now += 9
    assert health.outage_within(10)
    clock.now += 2
    assert not health.outage_within(10)


def test_snapshot_and_metrics_say_what_happened() -> None:
    health = ServiceHealth("payment")
    health.report(Dependency.KAFKA, True)
    health.report(Dependency.POSTGRES, False, "refused")
    health.handled(3)
    health.published("payment.outbox", 5)
    snapshot = health.snapshot()
    assert snapshot["service"] == "payment" and snapshot["status"] == "degraded"
    assert snapshot["kafka_ok"] is True and snapshot["postgres_ok"] is False
    assert snapshot["messages_handled"] == 3 and snapshot["rows_published"] == 5
    assert snapshot["last_progress"] is not None
    assert snapshot["dependencies"]["postgres"]["error"] == "refused"
    metrics = asyncio.run(health.metrics()).decode()
    assert "saga_messages_handled_total 3.0" in metrics
    assert 'saga_relay_rows_published_total{table="payment.outbox"} 5.0' in metrics
    assert 'saga_dependency_up{dependency="postgres"} 0.0' in metrics


class FakeConsumer:
    consuming = False


def test_timers_are_held_until_the_consumer_settled_and_after_an_outage() -> None:
    clock, consumer = Clock(), FakeConsumer()
    health = ServiceHealth("orchestrator", clock=clock)
    hold = timer_hold(consumer, health, clock)  # type: ignore[arg-type]
    assert hold()  # not consuming yet
    consumer.consuming = True
    assert hold()  # just joined: the backlog comes first
    clock.now += TIMER_HOLD_AFTER_JOIN_S + 0.1
    assert not hold()
    health.report(Dependency.KAFKA, False, "refused")
    assert hold()
    health.report(Dependency.KAFKA, True)
    clock.now += TIMER_HOLD_AFTER_OUTAGE_S + 0.1
    assert not hold()
    consumer.consuming = False  # a rebalance or a reconnect
    assert hold()


async def test_the_endpoint_serves_health_and_metrics() -> None:
    health = ServiceHealth("hotel")
    health.report(Dependency.KAFKA, True)
    server = await serve_health(health, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        body = await fetch_health("127.0.0.1", port)
        assert body is not None and json.loads(body)["service"] == "hotel"
        metrics = await fetch_health("127.0.0.1", port, "/metrics")
        assert metrics is not None and b"saga_dependency_up" in metrics
        assert await fetch_health("127.0.0.1", port, "/nope") is None
    finally:
        server.close()
        await server.wait_closed()
    assert await fetch_health("127.0.0.1", port, timeout_s=0.5) is None


async def _status_and_body(port: int, path: str) -> tuple[str, dict[str, Any]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    response = await reader.read()
    writer.close()
    head, _, body = response.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0].decode(), json.loads(body)


async def test_ready_waits_for_the_group_and_both_dependencies() -> None:
    health = ServiceHealth("orchestrator")
    server = await serve_health(health, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        status, body = await _status_and_body(port, "/ready")
        assert status == "HTTP/1.1 503 Service Unavailable" and body["ready"] is False
        assert len(body["waiting_for"]) == 3  # the group, Postgres, Kafka
        health.report(Dependency.KAFKA, True)
        health.report(Dependency.POSTGRES, False, "connection refused")
        health.consuming = True
        status, body = await _status_and_body(port, "/ready")
        assert status.endswith("503 Service Unavailable")
        assert body["waiting_for"] == ["postgres does not answer: connection refused"]
        health.report(Dependency.POSTGRES, True)
        status, body = await _status_and_body(port, "/ready")
        assert status == "HTTP/1.1 200 OK" and body == {"service": "orchestrator", "ready": True, "waiting_for": []}
        health.consuming = False  # the consumer left its group (a rebalance, Kafka away)
        assert (await _status_and_body(port, "/ready"))[0].endswith("503 Service Unavailable")
    finally:
        server.close()
        await server.wait_closed()


async def test_probes_report_unreachable_servers() -> None:
    assert await KafkaProbe(KafkaClients("127.0.0.1:1"), timeout_s=1).error() is not None
    health = ServiceHealth("flight")
    await HealthMonitor(health, KafkaClients("127.0.0.1:1"), "postgresql://saga@127.0.0.1:1/saga",
                        timeout_s=1).probe_once()
    assert health.states[Dependency.KAFKA].ok is False and health.states[Dependency.POSTGRES].ok is False


async def test_probes_slow_down_while_healthy_and_speed_up_during_an_outage() -> None:
    async def probes_in(monitor: HealthMonitor, seconds: float) -> int:
        stop = asyncio.Event()
        count = 0
        probe_once = monitor.probe_once

        async def counted() -> bool:
            nonlocal count
            count += 1
            return await probe_once()

        monitor.probe_once = counted  # type: ignore[method-assign]
        task = asyncio.create_task(monitor.run(stop))
        await asyncio.sleep(seconds)
        stop.set()
        await task
        return count

    healthy = HealthMonitor(ServiceHealth("flight"), None, None, interval_s=0.02, healthy_interval_s=10)
    assert await healthy.probe_once() is True
    assert await probes_in(healthy, 0.3) == 1
    failing = HealthMonitor(ServiceHealth("flight"), None, "postgresql://saga@127.0.0.1:1/saga",
                            interval_s=0.02, timeout_s=1, healthy_interval_s=10)
    assert await failing.probe_once() is False
    assert await probes_in(failing, 0.3) >= 3


async def test_startup_steps_are_retried_until_they_succeed_or_stop() -> None:
    calls = 0

    async def flaky() -> str:
        nonlocal calls
        calls += 1
        if calls < 3:
            raise OSError("connection refused")
        return "ready"

    assert await retry_startup(flaky, "flaky step", first_backoff_s=0.01) == "ready"
    stop = asyncio.Event()
    stop.set()
    with pytest.raises(StartupStopped):
        await retry_startup(flaky, "never", stop)

    async def broken() -> None:
        raise ValueError("bad configuration")

    with pytest.raises(ValueError):  # not a dependency problem: no retry
        await retry_startup(broken, "broken step")


def test_saga_run_all_gives_each_service_its_own_health_port() -> None:
    settings = Settings(saga_health_port=9100)
    ports = [health_port(settings, label) for label in service_commands(settings)]
    assert ports == list(range(9100, 9100 + len(ports)))
    assert health_port(Settings(), "orchestrator") == 0


def test_saga_participants_joined_by_plus_share_one_worker() -> None:
    settings = Settings(saga_participants="flight+hotel, payment ,tests.e2e.checkout:BILLING+notification")
    commands = service_commands(settings)
    assert list(commands) == ["orchestrator", "flight+hotel", "payment", "billing+notification"]
    assert commands["flight+hotel"][-3:] == ["participant", "flight", "hotel"]
    assert commands["billing+notification"][-3:] == ["participant", "tests.e2e.checkout:BILLING", "notification"]
    assert [health_port(Settings(saga_participants="flight+hotel+payment+notification", saga_health_port=9000),
                        label) for label in ("orchestrator", "flight+hotel+payment+notification")] == [9000, 9001]


async def test_consumer_lag_is_the_end_offset_minus_what_is_handled_and_revoked_partitions_drop_out() -> None:
    a0, a1, a2, a3 = (TopicPartition("a", partition) for partition in range(4))
    ends = {a0: 120, a1: 50, a2: None, a3: 7}

    async def position(partition: TopicPartition) -> int | None:
        if partition == a3:
            await asyncio.sleep(5)  # a position still being reset is not waited for
        return {a0: 100, a1: 50}.get(partition)

    lags = await partition_lags([a0, a1, a2, a3], ends.__getitem__, position, unhandled_from={a1: 40})
    assert lags == {("a", 0): 20, ("a", 1): 10}  # a1: records fetched from 40 on are still in flight
    health = ServiceHealth("orchestrator")
    health.consumer_lags("g", lags)
    assert health.registry.get_sample_value("saga_consumer_lag", {"group": "g", "topic": "a", "partition": "1"}) == 10
    health.consumer_lags("g", {("a", 0): 3})
    assert health.registry.get_sample_value("saga_consumer_lag", {"group": "g", "topic": "a", "partition": "1"}) is None
    assert health.registry.get_sample_value("saga_consumer_lag", {"group": "g", "topic": "a", "partition": "0"}) == 3
