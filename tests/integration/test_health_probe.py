"""The health monitor's Kafka probe keeps one connection to the broker and opens a new one only when the
kept one fails (real broker)."""

from __future__ import annotations

from saga_orchestrator.infra.health_server import KafkaProbe
from saga_orchestrator.infra.kafka_clients import KafkaClients


async def test_the_probe_keeps_its_connection_and_replaces_a_dropped_one(kafka_bootstrap: str) -> None:
    probe = KafkaProbe(KafkaClients(kafka_bootstrap), timeout_s=5)
    try:
        assert await probe.error() is None
        kept = probe._conn
        assert kept is not None
        for _ in range(3):
            assert await probe.error() is None
        assert probe._conn is kept  # no connection per probe
        kept.close()  # dropped from under the probe, as a broker restart does
        assert await probe.error() is None
        assert probe._conn is not None and probe._conn is not kept
    finally:
        probe.close()


async def test_an_unreachable_broker_is_reported_with_the_reason() -> None:
    probe = KafkaProbe(KafkaClients("127.0.0.1:1"), timeout_s=1)
    error = await probe.error()
    assert error is not None and "ConnectionRefusedError" in error and "('127.0.0.1', 1)" in error
    assert probe._conn is None
