"""Real Kafka and Postgres for the tests that need them.

Where the services come from, first match wins, per service:
1. KAFKA_BOOTSTRAP_SERVERS / DATABASE_URL from the environment (nothing is started; they must answer);
2. testcontainers, only when a Docker engine answers a ping (the `docker` binary alone is not enough);
3. the local launcher (`saga infra up`: idempotent, reuses services that already run).
When none works, every test that needs them is skipped with the reason, or fails when CI is set, because
in CI a missing broker is a broken build, not a reason to go green.

Session fixtures: infrastructure, kafka_bootstrap, postgres_admin_dsn, launcher_settings (skips unless the
local launcher runs both services; for stop/restart tests). Module fixtures: database_url (a fresh database,
dropped afterwards), topic_prefix (unique), settings (Settings pointing at all three).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import re
import socket
import uuid
from collections.abc import Coroutine, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from rich.console import Console

from saga_orchestrator.infra import launcher
from saga_orchestrator.infra.kafka_admin import delete_topics, wait_for_broker
from saga_orchestrator.infra.kafka_clients import KafkaClients
from saga_orchestrator.infra.settings import Settings

if TYPE_CHECKING:
    from tests.e2e.harness import Stack

T = TypeVar("T")

TRIP_DEFINITIONS = "saga_orchestrator.participants.trip:TRIP"
TRIP_PARTICIPANTS = "flight,hotel,payment,notification"
# Settings name no saga types by default (a production process missing one must not run the example trip): the
# tests run the trip, as a 0.1 deployment names it, unless the environment or a test names something else.
os.environ.setdefault("SAGA_DEFINITIONS", TRIP_DEFINITIONS)
os.environ.setdefault("SAGA_PARTICIPANTS", TRIP_PARTICIPANTS)

KAFKA_IMAGE = "apache/kafka:4.1.1"  # the release infra/pom.xml pins
POSTGRES_IMAGE = "postgres:15"


def pytest_configure(config: pytest.Config) -> None:
    """Always list skipped tests with their reason (-rs), so a missing service is never silent."""
    chars = config.option.reportchars or ""
    if "s" not in chars and "a" not in chars and "A" not in chars:
        config.option.reportchars = chars + "s"


MARKED_REAL = ("integration", "e2e", "chaos")
MARK_OF_FOLDER = {"e2e": "e2e", "browser": "e2e", "chaos": "chaos"}  # elsewhere: integration


def pytest_itemcollected(item: pytest.Item) -> None:
    """Mark every test that reaches the real Kafka or Postgres (through the ``infrastructure`` fixture, which
    every such fixture depends on) unless it is marked already: ``e2e`` under tests/e2e and tests/browser,
    ``chaos`` under tests/chaos, ``integration`` elsewhere. So ``-m "not integration and not e2e and not
    chaos"`` runs the tests without I/O only."""
    if "infrastructure" in getattr(item, "fixturenames", ()) and not any(
            item.get_closest_marker(name) for name in MARKED_REAL):
        item.add_marker(getattr(pytest.mark, MARK_OF_FOLDER.get(item.path.parent.name, "integration")))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The ``slow`` tests first (a stable sort: the order is otherwise kept): ``make test`` hands whole files
    to two workers, and a long file started last leaves one worker running it alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion on a private event loop in a worker thread.

    Fixtures here are synchronous: their scopes (session, module) need not match pytest-asyncio's loops, and
    a thread keeps asyncio.run from replacing the loop the async tests run on.
    """
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def module_stack(starting: Coroutine[Any, Any, Stack], log_dir: Path) -> Iterator[Stack]:
    """The body of a module-scoped stack fixture (``yield from``): the stack ``starting`` returns, stopped
    after the module, with the folder of its service logs printed."""
    running = run_sync(starting)
    try:
        yield running
    finally:
        running.stop()
        print(f"service logs: {log_dir}")


def _unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(f"infrastructure unavailable in CI: {reason}", pytrace=False)
    pytest.skip(f"infrastructure unavailable: {reason}")


def _docker_engine_answers() -> bool:
    if not os.environ.get("DOCKER_HOST") and not os.path.exists("/var/run/docker.sock"):
        return False  # the usual case without Docker: answer without opening (and leaking) a client socket
    try:
        import docker  # type: ignore[import-untyped]  # the SDK ships no type hints

        client = docker.from_env(timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # no SDK, no socket, no daemon, no permission: all mean "no Docker here"
        return False


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _kafka_container(stack: ExitStack) -> str:
    """A single-node KRaft broker in Docker; host port == container port, so it can advertise it."""
    from testcontainers.core.container import DockerContainer
    from testcontainers.core.docker_client import DockerClient
    from testcontainers.core.wait_strategies import LogMessageWaitStrategy

    host, port = DockerClient().host(), free_port()
    container = (
        DockerContainer(KAFKA_IMAGE)
        .with_bind_ports(port, port)
        .with_envs(
            KAFKA_NODE_ID="1",
            KAFKA_PROCESS_ROLES="broker,controller",
            KAFKA_LISTENERS=f"PLAINTEXT://0.0.0.0:{port},CONTROLLER://localhost:9093",
            KAFKA_ADVERTISED_LISTENERS=f"PLAINTEXT://{host}:{port}",
            KAFKA_CONTROLLER_LISTENER_NAMES="CONTROLLER",
            KAFKA_LISTENER_SECURITY_PROTOCOL_MAP="CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            KAFKA_CONTROLLER_QUORUM_VOTERS="1@localhost:9093",
            KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR="1",
            KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS="10",
            KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR="1",
            KAFKA_TRANSACTION_STATE_LOG_MIN_ISR="1",
            KAFKA_TRANSACTION_STATE_LOG_NUM_PARTITIONS="10",
            KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR="1",
            KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR="1",
            KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS="0",
        )
        .waiting_for(LogMessageWaitStrategy("Kafka Server started").with_startup_timeout(120))
    )
    stack.enter_context(container)
    bootstrap = f"{host}:{port}"
    if not run_sync(wait_for_broker(KafkaClients(bootstrap), seconds=60)):
        raise RuntimeError(f"the Kafka container at {bootstrap} does not answer")
    return bootstrap


def _postgres_container(stack: ExitStack) -> str:
    from testcontainers.postgres import PostgresContainer

    container = PostgresContainer(
        POSTGRES_IMAGE, username="saga", password="saga", dbname="saga", driver=None
    )
    stack.enter_context(container)
    url: str = container.get_connection_url()
    return url


@dataclass(frozen=True)
class Infra:
    """The services of this test session and where they came from."""

    kafka_bootstrap: str
    database_url: str
    local_launcher: Settings | None  # the launcher's settings when it runs both services, else None


@pytest.fixture(scope="session")
def infrastructure() -> Iterator[Infra]:
    """Kafka and Postgres for the whole session (see the module docstring for the order of sources)."""
    settings = Settings()
    with ExitStack() as stack:
        missing = settings.kafka_bootstrap_servers is None or settings.database_url is None
        try:
            if missing and _docker_engine_answers():
                kafka = settings.kafka_bootstrap_servers or _kafka_container(stack)
                database = settings.database_url or _postgres_container(stack)
                settings = settings.model_copy(
                    update={"kafka_bootstrap_servers": kafka, "database_url": database}
                )
            # The launcher starts what is not given and checks that the given services answer.
            endpoints = run_sync(launcher.up(settings, Console(stderr=True)))
        except Exception as error:  # any failure here means "no infrastructure"; say which and why
            _unavailable(f"{type(error).__name__}: {error}")
        local = settings.kafka_bootstrap_servers is None and settings.database_url is None
        yield Infra(endpoints.kafka_bootstrap, endpoints.database_url, settings if local else None)


@pytest.fixture(scope="session")
def kafka_bootstrap(infrastructure: Infra) -> str:
    """Bootstrap servers of the session's broker."""
    return infrastructure.kafka_bootstrap


@pytest.fixture(scope="session")
def postgres_admin_dsn(infrastructure: Infra) -> str:
    """A DSN allowed to create and drop databases (the launcher's `saga` superuser, or DATABASE_URL)."""
    return infrastructure.database_url


@pytest.fixture(scope="session")
def launcher_settings(infrastructure: Infra) -> Settings:
    """Settings of the local launcher, for tests that stop or restart services (skips when not local)."""
    if infrastructure.local_launcher is None:
        pytest.skip("services come from the environment or Docker, not the local launcher")
    return infrastructure.local_launcher


def _database_name(module_name: str) -> str:
    """test_<module>_<random>: unique, and a leftover database says which module made it."""
    stem = re.sub(r"[^a-z0-9_]", "_", module_name.rsplit(".", 1)[-1].lower())[:40]
    return f"test_{stem}_{uuid.uuid4().hex[:8]}"


def _with_database(dsn: str, name: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path=f"/{name}"))


async def _create_database(admin_dsn: str, name: str) -> None:
    conn = await asyncpg.connect(admin_dsn)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()


async def _drop_database(admin_dsn: str, name: str) -> None:
    conn = await asyncpg.connect(admin_dsn)
    try:
        # FORCE: a pool a test forgot to close must not keep the database alive.
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


@pytest.fixture(scope="module")
def database_url(postgres_admin_dsn: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh, empty database for this test module, dropped after it."""
    name = _database_name(request.module.__name__)
    run_sync(_create_database(postgres_admin_dsn, name))
    try:
        yield _with_database(postgres_admin_dsn, name)
    finally:
        run_sync(_drop_database(postgres_admin_dsn, name))


@pytest.fixture(scope="module")
def topic_prefix(kafka_bootstrap: str) -> Iterator[str]:
    """A topic-name prefix unique to this test module, e.g. `t3f9a0c1d2b.`; the module's topics are deleted
    after it (the local broker is the user's own, and hundreds of partitions left by every test run make it
    slower for everything else)."""
    prefix = f"t{uuid.uuid4().hex[:10]}."
    yield prefix
    try:
        run_sync(delete_topics(KafkaClients(kafka_bootstrap), prefix=prefix))
    except Exception as error:  # a leftover topic is untidy, not a failed test
        Console(stderr=True).print(f"[yellow]could not delete the topics of {prefix}*: {error!r}")


@pytest.fixture(scope="module")
def settings(kafka_bootstrap: str, database_url: str, topic_prefix: str) -> Settings:
    """Settings pointing at the session's broker, this module's database and topic prefix."""
    return Settings(
        kafka_bootstrap_servers=kafka_bootstrap,
        database_url=database_url,
        saga_topic_prefix=topic_prefix,
        saga_definitions=TRIP_DEFINITIONS,
        saga_participants=TRIP_PARTICIPANTS,
    )
