"""The local launcher itself: idempotent `up`, `status`, `down`, and the restart helpers fault tests rely on.

Restarts run on a private instance (own SAGA_HOME and ports, sharing the jar cache) so they never disturb the
session's services, which other tests and developers may be using.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from rich.console import Console

from saga_orchestrator.infra import launcher
from saga_orchestrator.infra.kafka_admin import broker_answers, ensure_topics
from saga_orchestrator.infra.kafka_clients import KafkaClients
from saga_orchestrator.infra.launcher.private import free_ports, private_settings
from saga_orchestrator.infra.launcher.process import bind_failure, ephemeral_ports, port_open
from saga_orchestrator.infra.settings import Settings
from tests.conftest import run_sync


async def test_up_when_already_running_returns_quickly(launcher_settings: Settings) -> None:
    started = time.monotonic()
    endpoints = await launcher.up(launcher_settings, Console(quiet=True))
    assert time.monotonic() - started < 5
    assert endpoints.kafka_bootstrap == launcher_settings.kafka_servers()
    assert endpoints.database_url == launcher_settings.dsn()


def test_status_shows_both_services_up(launcher_settings: Settings) -> None:
    rows = {row.name: row for row in launcher.status(launcher_settings)}
    assert set(rows) == {"kafka", "postgres"}
    for row in rows.values():
        assert row.running and not row.external
        assert row.pid is not None and row.data_dir is not None and row.data_dir.is_dir()


@pytest.fixture(scope="module")
def private_stack(
    launcher_settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Settings]:
    """A second, private launcher instance, started from an empty home and stopped afterwards."""
    # Free ports, and the session's jar cache instead of downloading the jars again.
    settings = private_settings(launcher_settings, tmp_path_factory.mktemp("saga-home"))
    try:
        run_sync(launcher.up(settings, Console(quiet=True)))
        yield settings
    finally:
        run_sync(launcher.down(settings, Console(quiet=True)))


def test_up_starts_both_from_an_empty_home(private_stack: Settings) -> None:
    home = Path(private_stack.saga_home)
    assert (home / "kafka" / "data" / "meta.properties").is_file()
    assert (home / "postgres" / "data" / "PG_VERSION").is_file()
    assert (home / "kafka" / "secrets" / "ca.pem").is_file()  # the SASL_SSL listener's CA
    assert all(row.running for row in launcher.status(private_stack))


async def test_the_command_creates_the_least_privilege_roles_in_its_own_postgres(private_stack: Settings) -> None:
    env = {name: value for name, value in os.environ.items()
           if name not in ("KAFKA_BOOTSTRAP_SERVERS", "DATABASE_URL")}
    env.update({"SAGA_HOME": str(private_stack.saga_home), "SAGA_KAFKA_PORT": str(private_stack.saga_kafka_port),
                "SAGA_KAFKA_CONTROLLER_PORT": str(private_stack.saga_kafka_controller_port),
                "SAGA_KAFKA_SECURE_PORT": str(private_stack.saga_kafka_secure_port),
                "SAGA_POSTGRES_PORT": str(private_stack.saga_postgres_port),
                "SAGA_PARTICIPANTS": "flight,hotel,payment,notification"})
    conn = await asyncpg.connect(private_stack.dsn())
    try:
        query = "SELECT array_agg(rolname ORDER BY rolname) FROM pg_roles WHERE rolname LIKE 'saga\\_%'"
        assert await conn.fetchval(query) is None  # a fresh Postgres: none yet
        done = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "saga_orchestrator.cli", "infra", "up"],
                                       env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "saga migrate" in done.stderr
        assert await conn.fetchval(query) == ["saga_console", "saga_flight", "saga_hotel", "saga_notification",
                                              "saga_orchestrator", "saga_payment"]
    finally:
        await conn.close()


async def test_restart_postgres_keeps_data_and_cuts_old_connections(private_stack: Settings) -> None:
    conn = await asyncpg.connect(private_stack.dsn())
    await conn.execute("CREATE TABLE restart_probe (id int PRIMARY KEY)")
    await conn.execute("INSERT INTO restart_probe VALUES (1)")

    timings = await launcher.restart_postgres(private_stack)

    with pytest.raises((asyncpg.PostgresConnectionError, asyncpg.InterfaceError, ConnectionError)):
        await conn.fetchval("SELECT 1")
    conn.terminate()
    fresh = await asyncpg.connect(private_stack.dsn())
    try:
        assert await fresh.fetchval("SELECT count(*) FROM restart_probe") == 1
    finally:
        await fresh.close()
    assert timings["start"] < 30


async def test_restart_kafka_keeps_acknowledged_records(private_stack: Settings) -> None:
    bootstrap = private_stack.kafka_servers()
    await ensure_topics(KafkaClients(bootstrap), ["restart-probe"], 1)  # the broker creates no topic by itself
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait("restart-probe", b"before restart")
    finally:
        await producer.stop()

    timings = await launcher.restart_kafka(private_stack)
    assert await broker_answers(KafkaClients(bootstrap))

    consumer = AIOKafkaConsumer("restart-probe", bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        record = await consumer.getone()
    finally:
        await consumer.stop()
    assert record.value == b"before restart"
    assert timings["start"] < 60


async def test_down_stops_both_and_frees_the_ports(private_stack: Settings) -> None:
    await launcher.down(private_stack, Console(quiet=True))
    assert not any(row.running for row in launcher.status(private_stack))
    assert not port_open(private_stack.saga_kafka_port)
    assert not port_open(private_stack.saga_postgres_port)
    await launcher.down(private_stack, Console(quiet=True))  # a second down is a no-op


def _infra_up(launcher_settings: Settings, home: Path, **ports: int) -> subprocess.CompletedProcess[str]:
    """``saga infra up`` of a new Kafka in ``home`` on ``ports`` (the session's Postgres as DATABASE_URL)."""
    free = dict(zip(("SAGA_KAFKA_PORT", "SAGA_KAFKA_CONTROLLER_PORT", "SAGA_KAFKA_SECURE_PORT"), free_ports(3),
                    strict=True))
    env = {name: value for name, value in os.environ.items() if name != "KAFKA_BOOTSTRAP_SERVERS"}
    env.update({"SAGA_HOME": str(home), "DATABASE_URL": launcher_settings.dsn(),
                **{name: str(port) for name, port in {**free, **ports}.items()}})
    return subprocess.run([sys.executable, "-m", "saga_orchestrator.cli", "infra", "up"], env=env,
                          capture_output=True, text=True, timeout=120)


def _the_one_error(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    return errors[0]


def test_a_port_another_socket_holds_is_refused_in_one_line_naming_it(launcher_settings: Settings,
                                                                      tmp_path: Path) -> None:
    # An outgoing connection's local port: bound, connected, not listening (no program answers on it, so a
    # connection attempt finds it free); a server cannot bind it.
    [held] = free_ports(1)
    with socket.socket() as listener, socket.socket() as outgoing:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        outgoing.bind(("127.0.0.1", held))
        outgoing.connect(listener.getsockname())
        assert not port_open(held)
        error = _the_one_error(_infra_up(launcher_settings, tmp_path, SAGA_KAFKA_CONTROLLER_PORT=held))
    assert f"port {held} (SAGA_KAFKA_CONTROLLER_PORT) is held by another socket: Address already in use" in error
    assert not (tmp_path / "kafka" / "data").exists()  # refused before anything was prepared


def test_a_port_in_the_ephemeral_range_is_refused_in_one_line_naming_the_setting(launcher_settings: Settings,
                                                                                  tmp_path: Path) -> None:
    ephemeral = ephemeral_ports()
    if ephemeral is None:
        pytest.skip("this machine does not say its ephemeral port range (no /proc/sys/net/ipv4/ip_local_port_range)")
    port = ephemeral.start + 16_324 % len(ephemeral)
    error = _the_one_error(_infra_up(launcher_settings, tmp_path, SAGA_KAFKA_PORT=port))
    assert (f"port {port} (SAGA_KAFKA_PORT) is in this machine's ephemeral range ({ephemeral.start}-"
            f"{ephemeral.stop - 1}, net.ipv4.ip_local_port_range)") in error


# What Kafka 4.1 and Postgres 15 wrote when their port was taken after the launcher looked (a race the check
# before the start cannot close): the launcher says the port and its setting instead of a log's last lines.
KAFKA_LOG = """\
[2026-12-04 17:34:24,711] ERROR [KafkaRaftServer nodeId=1] Fatal error during broker startup. Prepare to shutdown
org.apache.kafka.common.KafkaException: Socket server failed to bind to 127.0.0.1:22755: Address already in use.
\tat kafka.network.Acceptor.openServerSocket(SocketServer.scala:655)
Caused by: java.net.BindException: Address already in use
"""
POSTGRES_LOG = """\
2026-12-04 17:34:24.049 UTC [12784] LOG:  could not bind IPv4 address "127.0.0.1": Address already in use
2026-12-04 17:34:24.049 UTC [12784] HINT:  Is another postmaster already running on port 24568? If not, wait a \
few seconds and retry.
2026-12-04 17:34:24.049 UTC [12784] WARNING:  could not create listen socket for "127.0.0.1"
2026-12-04 17:34:24.050 UTC [12784] FATAL:  could not create any TCP/IP sockets
"""


def test_a_servers_own_words_for_a_port_it_could_not_bind_are_found_in_its_log() -> None:
    kafka = bind_failure(KAFKA_LOG)
    assert kafka is not None and kafka.port == 22755
    assert kafka.words == "failed to bind to 127.0.0.1:22755: Address already in use"
    postgres = bind_failure(POSTGRES_LOG)
    assert postgres is not None and postgres.port is None
    assert postgres.words == 'could not bind IPv4 address "127.0.0.1": Address already in use'
    assert bind_failure("[2026-12-04] INFO Kafka Server started\n") is None
