"""`up` / `down` / `status` of the local Kafka and Postgres, plus start/stop/restart helpers for fault tests.

A service given by the environment (KAFKA_BOOTSTRAP_SERVERS / DATABASE_URL) is never started or stopped here:
`up` only checks that it answers.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import asyncpg
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from ..failures import describe
from ..kafka_admin import wait_for_broker
from ..kafka_clients import KafkaClients
from ..settings import Settings
from .kafka import KafkaLauncher, every_kafka_node, kafka_nodes
from .postgres import PostgresLauncher
from .process import LauncherError, Report, file_lock, stop_process


@dataclass(frozen=True)
class Endpoints:
    """Where the running services answer."""

    kafka_bootstrap: str
    database_url: str
    secure_kafka_bootstrap: str | None = None  # the local broker's SASL_SSL listener (None: Kafka is external)
    kafka_secrets: Path | None = None  # its CA, SCRAM password (infra.launcher.security)


@dataclass(frozen=True)
class ServiceStatus:
    """One service as `status` shows it; `external` means it comes from an environment variable."""

    name: str
    running: bool
    external: bool
    address: str
    port: int | None
    pid: int | None
    data_dir: Path | None


def _lock(settings: Settings, service: str) -> AbstractAsyncContextManager[None]:
    """One lock per service, so restarting Kafka and Postgres at the same time is fine."""
    return file_lock(settings.saga_home.expanduser() / f"{service}.lock")


async def _started(server: KafkaLauncher | PostgresLauncher, report: Report) -> int:
    """The pid of ``server``: the running one's, else that of one prepared and started now."""
    pid = server.pid()
    if pid is not None:
        report(f"already running (pid {pid}); checking it answers")
        return pid
    server.refuse_unusable_ports()  # before any slow preparation: a port it cannot have fails at once
    await asyncio.to_thread(server.prepare, report)
    return await asyncio.to_thread(server.start, report)


async def _start_kafka(settings: Settings, report: Report, only_node: int | None = None) -> str:
    """Start the local broker, or every node of the local cluster (``only_node``: that one), then wait until
    each answers: a cluster's nodes start together, since none is ready before a quorum of them runs."""
    nodes = [node for node in kafka_nodes(settings) if only_node is None or node.node == only_node]
    async with _lock(settings, "kafka"):
        _refuse_other_layout(settings)
        pids = {node.node: await _started(node, report) for node in nodes}
        report("waiting for the broker to answer" if len(nodes) == 1 else f"waiting for {len(nodes)} brokers")
        for node in nodes:  # they come up together; asking in turn costs no time
            await node.wait_ready(pids[node.node])
    where = ", ".join(f"{node.bootstrap} (pid {pids[node.node]})" for node in nodes)
    return f"Kafka ready at {where}"


def _refuse_other_layout(settings: Settings) -> None:
    """A single broker and a local cluster share ports: only one of them runs in a SAGA_HOME at a time."""
    wanted = {node.home for node in kafka_nodes(settings)}
    running = [node for node in every_kafka_node(settings) if node.home not in wanted and node.pid() is not None]
    if running:
        layout = "a local cluster" if running[0].nodes > 1 else "the single local broker"
        raise LauncherError(f"{layout} runs in this SAGA_HOME (pid {running[0].pid()}); stop it with "
                            "`saga infra down` first")


async def _start_postgres(settings: Settings, report: Report) -> str:
    launcher = PostgresLauncher(settings)
    async with _lock(settings, "postgres"):
        pid = await _started(launcher, report)
        report(f"waiting for Postgres (pid {pid}) to accept connections")
        await launcher.wait_ready(pid)
    return f"Postgres ready at {launcher.dsn} (pid {pid})"


async def _stop(settings: Settings, service: str, call: Callable[[Report], bool], report: Report) -> bool:
    async with _lock(settings, service):
        return await asyncio.to_thread(call, report)


async def _check_external_kafka(bootstrap: str, report: Report) -> str:
    report(f"checking KAFKA_BOOTSTRAP_SERVERS={bootstrap}")
    if not await wait_for_broker(KafkaClients(bootstrap), seconds=30.0):
        raise LauncherError(f"KAFKA_BOOTSTRAP_SERVERS={bootstrap} does not answer")
    return f"Kafka (external) answers at {bootstrap}"


async def _check_external_postgres(dsn: str, report: Report) -> str:
    report("checking DATABASE_URL")
    try:
        conn = await asyncpg.connect(dsn, timeout=10)
    except Exception as error:
        raise LauncherError(f"DATABASE_URL does not accept connections: {describe(error)}") from error
    await conn.close()
    return "Postgres (external) accepts connections at DATABASE_URL"


async def _with_progress(console: Console, jobs: dict[str, Callable[[Report], Awaitable[str]]]) -> None:
    """Run the jobs concurrently, one spinner line each; a job returns its final line or raises."""
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=console) as bar:

        async def run(name: str, job: Callable[[Report], Awaitable[str]]) -> None:
            task = bar.add_task(f"{name}: …", total=1)

            def report(text: str) -> None:
                bar.update(task, description=f"{name}: {text}")

            try:
                done = await job(report)
            except BaseException:
                bar.update(task, description=f"[red]{name}: failed")
                raise
            bar.update(task, description=f"[green]✓[/] {done}", completed=1)

        await asyncio.gather(*(run(name, job) for name, job in jobs.items()))


async def up(settings: Settings | None = None, console: Console | None = None) -> Endpoints:
    """Start whatever is not running yet (idempotent) and wait until both services answer."""
    settings = settings or Settings()
    console = console or Console(stderr=True)
    jobs: dict[str, Callable[[Report], Awaitable[str]]] = {}
    if settings.kafka_bootstrap_servers:
        external_kafka = settings.kafka_bootstrap_servers
        jobs["kafka"] = lambda report: _check_external_kafka(external_kafka, report)
    else:
        jobs["kafka"] = lambda report: _start_kafka(settings, report)
    if settings.database_url:
        external_dsn = settings.database_url
        jobs["postgres"] = lambda report: _check_external_postgres(external_dsn, report)
    else:
        jobs["postgres"] = lambda report: _start_postgres(settings, report)
    await _with_progress(console, jobs)
    if settings.kafka_bootstrap_servers:
        return Endpoints(kafka_bootstrap=settings.kafka_servers(), database_url=settings.dsn())
    nodes = kafka_nodes(settings)
    return Endpoints(kafka_bootstrap=settings.kafka_servers(), database_url=settings.dsn(),
                     secure_kafka_bootstrap=",".join(node.secure_bootstrap for node in nodes),
                     kafka_secrets=nodes[0].secrets.folder)


async def down(settings: Settings | None = None, console: Console | None = None) -> None:
    """Stop the local services (external ones are left alone)."""
    settings = settings or Settings()
    console = console or Console(stderr=True)
    postgres = PostgresLauncher(settings)

    def stop_kafka_nodes(report: Report) -> bool:
        # A cluster's nodes stop together: one left alone has no quorum for its controlled shutdown and
        # waits out the timeout.
        with ThreadPoolExecutor() as pool:
            return any(list(pool.map(lambda node: node.stop(report), every_kafka_node(settings))))

    async def stop(name: str, external: bool, call: Callable[[Report], bool], report: Report) -> str:
        if external:
            return f"{name}: external, left running"
        stopped = await _stop(settings, name, call, report)
        return f"{name}: stopped" if stopped else f"{name}: was not running"

    await _with_progress(
        console,
        {
            "kafka": lambda report: stop("kafka", bool(settings.kafka_bootstrap_servers), stop_kafka_nodes, report),
            "postgres": lambda report: stop("postgres", bool(settings.database_url), postgres.stop, report),
        },
    )


def status(settings: Settings | None = None) -> list[ServiceStatus]:
    """Each service's state; local ones by pid file and process, external ones as configured (not probed)."""
    settings = settings or Settings()
    postgres = PostgresLauncher(settings)
    rows = []
    if settings.kafka_bootstrap_servers:
        rows.append(ServiceStatus("kafka", True, True, settings.kafka_bootstrap_servers, None, None, None))
    else:
        wanted = kafka_nodes(settings)
        others = [node for node in every_kafka_node(settings)
                  if node.home not in {shown.home for shown in wanted} and node.pid() is not None]
        for node in wanted + others:
            pid = node.pid()
            name = "kafka" if node.nodes == 1 else f"kafka-{node.node}"
            rows.append(ServiceStatus(name, pid is not None, False, node.bootstrap, node.port, pid, node.data_dir))
    if settings.database_url:
        rows.append(ServiceStatus("postgres", True, True, "DATABASE_URL", None, None, None))
    else:
        pid = postgres.pid()
        running = pid is not None
        rows.append(
            ServiceStatus("postgres", running, False, postgres.dsn, postgres.port, pid, postgres.data_dir)
        )
    return rows


def _quiet(_: str) -> None:
    """A progress callback that discards progress (restart helpers run inside tests)."""


def _local_only(settings: Settings, name: str, external: str | None) -> None:
    if external:
        raise LauncherError(f"{name} comes from the environment; only the local launcher's can be restarted")


@contextmanager
def _timed(timings: dict[str, float], key: str) -> Iterator[None]:
    started = time.monotonic()
    yield
    timings[key] = time.monotonic() - started


async def stop_kafka(settings: Settings | None = None, node: int = 1) -> None:
    """Stop the local broker, or node ``node`` of the local cluster (cleanly: SIGTERM, SIGKILL after the
    timeout)."""
    settings = settings or Settings()
    _local_only(settings, "Kafka", settings.kafka_bootstrap_servers)
    await _stop(settings, "kafka", KafkaLauncher(settings, node).stop, _quiet)


async def kill_kafka(settings: Settings, node: int) -> None:
    """kill -9 node ``node`` of the local broker or cluster (a crash: no controlled shutdown)."""
    _local_only(settings, "Kafka", settings.kafka_bootstrap_servers)
    launcher = KafkaLauncher(settings, node)
    pid = launcher.pid()
    if pid is None:
        raise LauncherError(f"Kafka node {node} is not running")
    await asyncio.to_thread(stop_process, pid, signal.SIGKILL, 10)


async def start_kafka(settings: Settings | None = None, node: int | None = None) -> None:
    """Start the local broker (or cluster; ``node``: that node only) if it is not running and wait until it
    answers."""
    settings = settings or Settings()
    _local_only(settings, "Kafka", settings.kafka_bootstrap_servers)
    await _start_kafka(settings, _quiet, node)


async def restart_kafka(settings: Settings | None = None) -> dict[str, float]:
    """Stop then start the local broker (same data); returns the seconds each half took."""
    timings: dict[str, float] = {}
    with _timed(timings, "stop"):
        await stop_kafka(settings)
    with _timed(timings, "start"):
        await start_kafka(settings)
    return timings


async def stop_postgres(settings: Settings | None = None) -> None:
    """Stop the local Postgres (fast shutdown: open connections are cut)."""
    settings = settings or Settings()
    _local_only(settings, "Postgres", settings.database_url)
    await _stop(settings, "postgres", PostgresLauncher(settings).stop, _quiet)


async def start_postgres(settings: Settings | None = None) -> None:
    """Start the local Postgres if it is not running and wait until it accepts connections."""
    settings = settings or Settings()
    _local_only(settings, "Postgres", settings.database_url)
    await _start_postgres(settings, _quiet)


async def restart_postgres(settings: Settings | None = None) -> dict[str, float]:
    """Stop then start the local Postgres (same data); returns the seconds each half took."""
    timings: dict[str, float] = {}
    with _timed(timings, "stop"):
        await stop_postgres(settings)
    with _timed(timings, "start"):
        await start_postgres(settings)
    return timings
