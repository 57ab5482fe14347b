"""The console's composition root: ``console_app(settings)`` is the web app ``saga console`` serves (and tests
call). It opens a database pool and a control publisher when it starts, refreshes the command topics' attendance
in the background while it runs, and closes them when it stops."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles

from ..client.saga_client import SagaClient
from ..infra.db import create_pool
from ..infra.misconfigured import Misconfigured
from ..infra.settings import Settings
from ..operations.paging import BadCursor
from ..operations.postgres import migrate, postgres_reads, postgres_sessions
from ..orchestrator.bootstrap import definitions
from ..participants.registry import deployment_participants
from ..schemas.registry import default_registry
from . import api, pages
from .context import Console
from .guard import Guard, Scope, WhoAsks
from .identity import Identity, read_users
from .saga_paths import SagaIdPaths

STATIC = Path(__file__).parent / "static"
POOL_SIZE = 8  # pages and API calls at once; the live timelines poll through it too, a page its reads at once


def identity_of(settings: Settings) -> Identity:
    """The identity mode the settings ask for; Misconfigured when they contradict each other or levers have
    nobody to record."""
    if settings.saga_console_operator_header and settings.saga_console_users:
        raise Misconfigured("SAGA_CONSOLE_OPERATOR_HEADER and SAGA_CONSOLE_USERS are both set: the operator comes "
                            "from a trusted proxy or from a local login, not both")
    users = read_users(Path(settings.saga_console_users)) if settings.saga_console_users else None
    identity = Identity(header=settings.saga_console_operator_header or None, users=users)
    if settings.saga_console_levers and identity.mode == "anonymous":
        raise Misconfigured("SAGA_CONSOLE_LEVERS=true needs to know who pulls them: set "
                            "SAGA_CONSOLE_OPERATOR_HEADER (behind an authenticating proxy) or SAGA_CONSOLE_USERS")
    return identity


def session_cookie(settings: Settings) -> str:
    """The session cookie's name: ``__Host-`` prefixed when served over TLS (the browser then keeps it to this
    host and path /, and only over HTTPS, whatever another port or subdomain sets)."""
    return "__Host-saga_console" if settings.saga_console_secure_cookie else "saga_console"


async def _unusable_value(request: Request, error: Exception) -> Response:
    """A value that passed the edge but not the database (a number past its range, text it cannot hold): the
    caller's mistake, answered 400, never 500."""
    return JSONResponse({"detail": f"a value of the request cannot be used: {str(error)[:200]}"}, status_code=400)


async def _bad_cursor(request: Request, error: Exception) -> Response:
    """A list's cursor that no page of it gave (``operations.paging``): the caller's mistake, a 400 that says so."""
    return JSONResponse({"detail": str(error)}, status_code=400)


def _who_asks(scope: Scope) -> WhoAsks:
    console: Console = scope["app"].state.console
    return console.identity.who


def console_app(settings: Settings) -> FastAPI:
    """The console for ``settings`` (identity and definitions checked now: Misconfigured names the setting)."""
    identity = identity_of(settings)
    registry = definitions(settings)
    participants = deployment_participants(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool = await create_pool(settings.dsn(), POOL_SIZE, application_name="saga-console")
        await migrate(pool)  # like every service: the tables it reads exist before the orchestrator's first start
        client = SagaClient.from_settings(settings)
        await client.connect()
        try:
            app.state.console = Console(pool=pool,
                                        reads=postgres_reads(pool, registry, default_registry(), participants),
                                        identity=dataclasses.replace(identity, sessions=postgres_sessions(pool)),
                                        control=client, topics=client.topics,
                                        kafka=settings.kafka(), levers=settings.saga_console_levers,
                                        control_partitions=tuple(range(settings.saga_topic_partitions)),
                                        cookie=session_cookie(settings))
            stop = asyncio.Event()
            refreshing = asyncio.create_task(app.state.console.attendance.chore().run(stop))
            try:
                yield
            finally:
                stop.set()
                refreshing.cancel()  # a refresh in flight waits on Kafka for nothing now
                with contextlib.suppress(asyncio.CancelledError):
                    await refreshing
        finally:
            await client.close()
            await pool.close()

    app = FastAPI(title="saga console", summary="Sagas, their levers and what waits on an operator",
                  version="1", lifespan=lifespan, openapi_url="/api/openapi.json", docs_url=None, redoc_url=None)
    app.add_exception_handler(asyncpg.DataError, _unusable_value)
    app.add_exception_handler(OverflowError, _unusable_value)
    app.add_exception_handler(BadCursor, _bad_cursor)
    app.add_middleware(Guard, who_asks=_who_asks, cookie=session_cookie(settings))
    app.add_middleware(SagaIdPaths)  # outermost: the saga routes see an id's encoded slashes
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.include_router(api.router)
    app.include_router(pages.router)
    return app
