"""A private Kafka + Postgres pair (own SAGA_HOME and free ports) for fault tests and the chaos bench.

Restarting the broker or the database is only safe on instances nobody else uses: the pair started here
shares only the Kafka jar cache with the main launcher home, so restarts never disturb other tests or a
developer's running services.
"""

from __future__ import annotations

import random
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from rich.console import Console

from ..settings import KAFKA_NODE_PORT_STEP, Settings
from .process import ephemeral_ports
from .stack import down, up


def _below_ephemeral() -> int:
    """The first port of the ephemeral range (Linux's default when it cannot be read): a server's port is
    picked below it, where no outgoing connection takes one (the launcher refuses the range)."""
    ephemeral = ephemeral_ports()
    return ephemeral.start if ephemeral is not None else 32768


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports below the ephemeral range that were free on 127.0.0.1 a moment ago."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port_block(1)
        if port not in ports:
            ports.append(port)
    return ports


def free_port_block(count: int, attempts: int = 50) -> int:
    """The first of ``count`` consecutive TCP ports below the ephemeral range that were all free on 127.0.0.1 a
    moment ago."""
    for _ in range(attempts):
        base = random.randint(20_000, _below_ephemeral() - 1 - count)
        probes: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                probe = socket.socket()
                probes.append(probe)
                probe.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for probe in probes:
                probe.close()
    raise RuntimeError(f"no block of {count} free ports found")


def private_settings(base: Settings, home: Path, brokers: int = 1) -> Settings:
    """Settings of a launcher instance in ``home`` on free ports, reusing ``base``'s Kafka jar cache; with
    ``brokers`` > 1, a local cluster (its nodes' ports a block of consecutive free ports).

    The result names no KAFKA_BOOTSTRAP_SERVERS / DATABASE_URL, so the launcher's restart helpers accept it.
    """
    home.mkdir(parents=True, exist_ok=True)
    (home / "kafka").mkdir(exist_ok=True)
    shared_lib = base.saga_home.expanduser().resolve() / "kafka" / "lib"
    lib = home / "kafka" / "lib"
    if shared_lib.is_dir() and not lib.exists():
        lib.symlink_to(shared_lib)  # the jars are large and resolving them needs the network
    kafka_port, controller_port, secure_port, postgres_port = free_ports(4)
    if brokers > 1:
        kafka_port = free_port_block(KAFKA_NODE_PORT_STEP * (brokers - 1) + 3)
        controller_port, secure_port = kafka_port + 1, kafka_port + 2
    return base.model_copy(update={
        "kafka_bootstrap_servers": None, "database_url": None, "saga_home": home,
        "saga_kafka_port": kafka_port, "saga_kafka_controller_port": controller_port,
        "saga_kafka_secure_port": secure_port, "saga_kafka_brokers": brokers,
        "saga_postgres_port": postgres_port,
    })


@asynccontextmanager
async def private_infrastructure(base: Settings, home: Path, brokers: int = 1) -> AsyncIterator[Settings]:
    """Start a private Kafka (``brokers`` > 1: a cluster) + Postgres in ``home``, yield their settings, stop
    both afterwards."""
    settings = private_settings(base, home, brokers)
    quiet = Console(quiet=True)
    try:
        await up(settings, quiet)
        yield settings
    finally:
        await down(settings, quiet)
