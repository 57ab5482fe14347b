"""Dependency probes and the health endpoint of a service.

``HealthMonitor`` probes Kafka (a metadata request on a kept connection) and Postgres (``SELECT 1`` on a
connection of its own, so a busy pool never looks like an outage) and reports to the process's
``ServiceHealth``: every ``healthy_interval_s`` while both answer, every ``interval_s`` while one does not.
``serve_health`` answers ``GET /health`` (JSON) and ``GET /metrics`` (Prometheus) on SAGA_HEALTH_PORT; /health
answers 200 even while degraded, so a liveness check never turns an outage of Kafka or Postgres into a restart
loop (``status`` says "degraded").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import orjson
from aiokafka.protocol.metadata import MetadataRequest

from .health import Dependency, ServiceHealth, configure
from .kafka_clients import KafkaClients
from .settings import Settings

log = logging.getLogger("saga.health")


class KafkaProbe:
    """A metadata request on a dedicated connection, reconnecting after a failure (as ``PostgresProbe``).

    A broker that went away fails the next request within ``timeout_s`` (reset, refused, or no answer), so
    the kept connection never looks alive for long. A fresh connection per probe, as this once did, cost the
    broker a TCP accept, an ApiVersions exchange and a close every second per service: a third of a quiet
    broker's CPU with the five services of ``saga run all``.
    """

    def __init__(self, kafka: KafkaClients, timeout_s: float = 2.0) -> None:
        self._kafka = kafka
        self._hosts = kafka.hosts()
        self._timeout_s = timeout_s
        self._conn: Any = None

    async def error(self) -> str | None:
        """None when a broker answers, else why not. The kept connection is asked first; when it fails,
        every bootstrap host in turn on a fresh one."""
        if self._conn is not None and await self._ask() is None:
            return None
        error = "no bootstrap server"
        for host, port in self._hosts:
            try:
                async with asyncio.timeout(self._timeout_s):
                    self._conn = await self._kafka.connection(host, port, client_id="saga-health",
                                                              request_timeout_ms=int(self._timeout_s * 1000))
            except Exception as exc:  # refused, reset, timed out: not usable now
                error = repr(exc)
                continue
            refused = await self._ask()
            if refused is None:
                return None
            error = refused
        return error

    async def _ask(self) -> str | None:
        """A metadata request on the kept connection: None when answered with brokers; else why not, and the
        connection is dropped."""
        try:
            async with asyncio.timeout(self._timeout_s):
                metadata = await self._conn.send(MetadataRequest([]))
            if metadata.brokers:
                return None
            error = "metadata without brokers"
        except Exception as exc:  # reset, timed out, protocol error: all mean "not usable now"
            error = repr(exc)
        self.close()
        return error

    def close(self) -> None:
        """Drop the connection (the next probe opens one)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


class PostgresProbe:
    """``SELECT 1`` on a dedicated connection, reconnecting after a failure."""

    def __init__(self, dsn: str, timeout_s: float = 2.0) -> None:
        self._dsn = dsn
        self._timeout_s = timeout_s
        self._conn: asyncpg.Connection | None = None

    async def error(self) -> str | None:
        """None when Postgres answers, else why not."""
        if self._conn is not None and self._conn.is_closed():
            # The server dropped the connection since the last probe (a restart, an admin's kill): an
            # outage, however short; the next probe reconnects.
            self._conn = None
            return "connection lost"
        try:
            async with asyncio.timeout(self._timeout_s):
                if self._conn is None or self._conn.is_closed():
                    self._conn = await asyncpg.connect(self._dsn, timeout=self._timeout_s)
                await self._conn.fetchval("SELECT 1")
            return None
        except Exception as exc:
            self.close()
            return repr(exc)

    def close(self) -> None:
        """Drop the connection (it is reopened by the next probe)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.terminate()


HEALTHY_PROBE_EVERY_S = 5.0
"""How often a service whose dependencies answered probes them again. A probe a second cost each quiet service
about a quarter of its wake-ups, and the broker and Postgres a request a second per service; an outage now
shows in ``/health`` within 5 s plus the probe's timeout, well inside the period of a usual readiness probe."""


class HealthMonitor:
    """Probes the service's dependencies until stopped; each verdict goes to ``health``."""

    def __init__(self, health: ServiceHealth, kafka: KafkaClients | None, dsn: str | None,
                 interval_s: float = 1.0, timeout_s: float = 2.0,
                 healthy_interval_s: float = HEALTHY_PROBE_EVERY_S) -> None:
        self._health = health
        self._kafka = KafkaProbe(kafka, timeout_s) if kafka is not None else None
        self._postgres = PostgresProbe(dsn, timeout_s) if dsn else None
        self._interval_s = interval_s
        self._healthy_interval_s = healthy_interval_s

    async def probe_once(self) -> bool:
        """Probe every dependency once (concurrently) and report; True when every one answered."""
        async def answered(probe: KafkaProbe | PostgresProbe | None, dependency: Dependency) -> bool:
            if probe is None:
                return True
            error = await probe.error()
            self._health.report(dependency, error is None, error)
            return error is None

        return all(await asyncio.gather(answered(self._kafka, Dependency.KAFKA),
                                        answered(self._postgres, Dependency.POSTGRES)))

    async def run(self, stop: asyncio.Event) -> None:
        """Probe until ``stop`` is set: every ``healthy_interval_s`` while every dependency answers, every
        ``interval_s`` while one does not (so a recovery shows as soon as an outage did)."""
        try:
            while not stop.is_set():
                answered = await self.probe_once()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self._healthy_interval_s if answered else self._interval_s)
        finally:
            if self._kafka is not None:
                self._kafka.close()
            if self._postgres is not None:
                self._postgres.close()


async def _answer(health: ServiceHealth, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        async with asyncio.timeout(5):
            request = (await reader.readline()).decode("latin-1").split()
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass  # headers: nothing here needs them
        path = request[1].split("?", 1)[0] if len(request) >= 2 else ""
        if len(request) < 2 or request[0] not in ("GET", "HEAD"):
            status, kind, body = "405 Method Not Allowed", "text/plain", b"GET only\n"
        elif path == "/health":
            status, kind, body = "200 OK", "application/json", orjson.dumps(health.snapshot())
        elif path == "/ready":
            ready, waiting = health.readiness()
            status = "200 OK" if ready else "503 Service Unavailable"
            kind, body = "application/json", orjson.dumps({"service": health.service, "ready": ready,
                                                            "waiting_for": waiting})
        elif path == "/metrics":
            status, kind, body = "200 OK", "text/plain; version=0.0.4; charset=utf-8", await health.metrics()
        else:
            status, kind, body = "404 Not Found", "text/plain", b"try /health, /ready or /metrics\n"
        head = f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        writer.write(head.encode() + (body if request[:1] != ["HEAD"] else b""))
        await writer.drain()
    except Exception:
        pass  # a client that went away or sent garbage gets nothing
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


async def serve_health(health: ServiceHealth, host: str, port: int) -> asyncio.Server:
    """Start answering GET /health and GET /metrics on ``host``:``port``."""
    server = await asyncio.start_server(lambda r, w: _answer(health, r, w), host, port)
    log.info("health endpoint listening", extra={"service": health.service, "host": host, "port": port})
    return server


async def fetch_health(host: str, port: int, path: str = "/health", timeout_s: float = 2.0,
                       any_status: bool = False) -> bytes | None:
    """GET ``path`` from a service's health endpoint; the body, or None when it does not answer (or, unless
    ``any_status``, answers other than 200: ``/ready`` answers 503 with what the service waits for)."""
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
                await writer.drain()
                response = await reader.read()
            finally:
                writer.close()
    except Exception:  # refused, reset or timed out: no answer
        return None
    head, _, body = response.partition(b"\r\n\r\n")
    return body if any_status or head.startswith(b"HTTP/1.1 200") else None


async def run_health(health: ServiceHealth, kafka: KafkaClients | None, dsn: str | None,
                     host: str, port: int, stop: asyncio.Event) -> None:
    """Probe the dependencies and, when ``port`` is not 0, serve the endpoint; both until ``stop``."""
    server = None
    if port:
        try:
            server = await serve_health(health, host, port)
        except Exception as error:  # e.g. the port is taken: the service still works, without its endpoint
            log.error("health endpoint not started", extra={"host": host, "port": port, "error": repr(error)})
    try:
        await HealthMonitor(health, kafka, dsn).run(stop)
    finally:
        if server is not None:
            server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 2)


@contextlib.asynccontextmanager
async def health_running(service: str, settings: Settings) -> AsyncIterator[ServiceHealth]:
    """Name this process's health record after ``service``, probe its dependencies and serve its endpoint
    (SAGA_HEALTH_PORT) while the block runs."""
    health = configure(service)
    done = asyncio.Event()
    task = asyncio.create_task(
        run_health(health, settings.kafka(), settings.dsn(), settings.saga_health_host,
                   settings.saga_health_port, done),
        name=f"health-{service}",
    )
    try:
        yield health
    finally:
        done.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 5)
