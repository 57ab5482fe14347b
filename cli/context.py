"""Shared plumbing of the ``saga`` command: settings, connections, and errors that say what to fix."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import sys
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from typing import Any, NoReturn, TypeVar

import asyncpg
import typer
from aiokafka import AIOKafkaProducer
from rich.console import Console

from ..client.saga_client import SagaClient
from ..infra.db import create_pool
from ..infra.deployment import Deployment, load_deployment
from ..infra.failures import Fault, classify, describe
from ..infra.kafka_clients import KafkaClients, KafkaSetupError
from ..infra.misconfigured import Misconfigured
from ..infra.settings import Settings
from ..orchestrator.domain.definition import DefinitionRegistry
from ..schemas.topics import Topics

T = TypeVar("T")

# Piped into a file, grep or another program a table keeps every cell whole: rich would otherwise lay it out for
# 80 columns and cut cells short ("StepRetr…"). Tables are not expanded, so they take only the width they need.
PIPED_WIDTH = 10_000


def terminal_console(stderr: bool = False) -> Console:
    """A console as wide as the terminal, or wide enough for any row when the stream is not a terminal."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else PIPED_WIDTH)


console = terminal_console()
errors = terminal_console(stderr=True)


def fail(message: str, code: int = 2) -> NoReturn:
    """Stop the command with ``message`` (what is wrong and what to do) and a non-zero exit code."""
    errors.print(f"[bold red]error:[/] {message}", soft_wrap=True)  # one line, however narrow the terminal
    raise typer.Exit(code)


JSON_HELP = "As JSON: times as epoch milliseconds (UTC), in fields named *_ms."


def print_json(value: Any) -> None:
    """``value`` as one line of JSON on stdout, nothing else on it: what every read's ``--json`` prints (a list
    prints as one document; a stream prints one object per call). Times are epoch milliseconds (``*_ms``)."""
    typer.echo(json.dumps(value, default=str))


def settings() -> Settings:
    """Settings from the environment."""
    return Settings()


def deployed_definitions() -> DefinitionRegistry:
    """The definition registry of the deployment the environment names; the command stops with what to fix when
    it names none or one cannot be loaded."""
    from ..orchestrator.bootstrap import definitions

    try:
        return definitions(settings())
    except Misconfigured as refused:
        fail(str(refused))


def deployed_client(current: Settings) -> SagaClient:
    """``SagaClient.from_settings(current)``; the command stops with what to fix when the deployment names no
    saga type or one cannot be loaded."""
    try:
        return SagaClient.from_settings(current)
    except Misconfigured as refused:
        fail(str(refused))


def deployment(saga_types: bool = True) -> Deployment:
    """The deployment the environment names (``infra.deployment``); the command stops with what to fix when it
    cannot be loaded (or, ``saga_types`` True, names no saga type)."""
    try:
        return load_deployment(settings(), saga_types=saga_types)
    except Misconfigured as refused:
        fail(str(refused))


OPERATOR_HELP = "Who is acting; recorded in the saga's history (default: your login name, $USER)."


def operator_or_login(operator: str | None) -> str:
    """The operator a lever records: ``--operator`` when given, else the login name ($USER, $LOGNAME, or the
    account of this process's uid, as in a container that sets neither); stops the command when none names
    anyone."""
    if operator is not None and operator.strip():
        return operator.strip()
    login = (os.environ.get("USER") or os.environ.get("LOGNAME") or "").strip()
    if not login:
        try:
            login = pwd.getpwuid(os.getuid()).pw_name
        except KeyError:  # a uid with no account
            login = ""
    if not login:
        fail("--operator is needed: there is no login name ($USER) to record as the operator")
    return login


def topics(current: Settings) -> Topics:
    """The topic names for the configured prefix."""
    return Topics(current.saga_topic_prefix)


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run an async command body."""
    return asyncio.run(coroutine)


def refuse_postgres_failure(error: BaseException, dsn: str, advice: str = "") -> None:
    """Stop the command with one line when ``error`` is Postgres's: unreachable (what to run) or refused (what
    to check); return for anything else (the caller re-raises it)."""
    if classify(error) is Fault.PLATFORM:
        fail(f"cannot reach Postgres at {dsn} ({describe(error)}); run `saga infra up` or set DATABASE_URL")
    if isinstance(error, asyncpg.PostgresError):
        fail(f"Postgres at {dsn} refused: {describe(error)}; {advice or 'check DATABASE_URL'}")


@asynccontextmanager
async def database(current: Settings) -> AsyncIterator[asyncpg.Pool]:
    """A small pool to the configured database, with a clear error when it is not reachable."""
    try:
        pool = await asyncio.wait_for(create_pool(current.dsn(), 2), timeout=15)
    except Exception as error:
        refuse_postgres_failure(error, current.dsn())
        raise
    try:
        yield pool
    finally:
        await pool.close()


@asynccontextmanager
async def producer(current: Settings) -> AsyncIterator[AIOKafkaProducer]:
    """A started Kafka producer, with a clear error when the broker is not reachable."""
    kafka = await kafka_clients(current)
    producer = kafka.producer(acks="all", enable_idempotence=True)
    try:
        await asyncio.wait_for(producer.start(), timeout=15)
    except Exception as error:
        await producer.stop()
        fail(f"cannot reach Kafka at {current.kafka_servers()} ({error!r}); run `saga infra up` "
             "or set KAFKA_BOOTSTRAP_SERVERS")
    try:
        yield producer
    finally:
        await producer.stop()


async def kafka_clients(current: Settings) -> KafkaClients:
    """The settings' Kafka clients, once a broker accepted a connection with them; a clear error otherwise."""
    kafka = current.kafka()
    try:
        await asyncio.wait_for(kafka.check(), timeout=15)
    except KafkaSetupError as error:
        fail(str(error))
    except Exception as error:
        fail(f"cannot reach Kafka at {current.kafka_servers()} ({error}); run `saga infra up` "
             "or set KAFKA_BOOTSTRAP_SERVERS")
    return kafka
