"""What every console request works with: the database, the reads, who may act, and how an action is sent."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import asyncpg
from fastapi import HTTPException
from starlette.requests import Request

from . import operating
from .identity import Identity
from .reads import ConsoleReads


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class Console:
    """One console process's parts (made by ``console.app.console_app``)."""

    pool: asyncpg.Pool
    reads: ConsoleReads
    identity: Identity
    control: operating.ControlPublisher
    levers: bool = False
    now_ms: Callable[[], int] = field(default=_wall_clock_ms)

    async def act(self, operator: str, saga_id: str, action: str, step: str | None, reason: str | None) -> None:
        """Send ``action`` for ``operator`` and audit it; HTTPException 400 when it is asked wrongly (audited too)."""
        target = f"saga {saga_id}"
        detail = {"step": step, "reason": reason}
        try:
            message = operating.message_for(saga_id, action, step, operator, reason)
        except operating.ActionRefused as error:
            await self.reads.record(operator, action, target, detail, f"refused: {error}")
            raise HTTPException(400, str(error)) from None
        await operating.publish(self.control, message)
        await self.reads.record(operator, action, target, detail, "published on saga.control")


def console_of(request: Request) -> Console:
    """The console of the app serving ``request``."""
    console: Console = request.app.state.console
    return console
