"""Start-up steps that wait for Kafka and Postgres instead of exiting.

A service started while the broker or the database restarts (after a crash, a deploy, a power cut) must not
exit and leave a supervisor to restart it in a loop: it waits, with backoff, and logs why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from .failures import Fault, classify

log = logging.getLogger("saga.startup")

T = TypeVar("T")

async def sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds``, or less when ``stop`` is set meanwhile (at once when it already is)."""
    if stop.is_set() or seconds <= 0:
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


async def sleep_or_woken(stop: asyncio.Event, wake: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds``, or less when ``stop`` or ``wake`` is set meanwhile (at once when one already is);
    True when ``wake`` is set. Clearing ``wake`` is the caller's."""
    if not stop.is_set() and not wake.is_set() and seconds > 0:
        waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())]
        try:
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
    return wake.is_set()


class StartupStopped(Exception):
    """The service was asked to stop while it waited for a dependency."""


async def retry_startup(step: Callable[[], Awaitable[T]], what: str, stop: asyncio.Event | None = None,
                        first_backoff_s: float = 0.2, max_backoff_s: float = 2.0) -> T:
    """Run ``step`` until it succeeds, retrying while a dependency is not reachable (yet) (``infra.failures``:
    a platform fault) with backoff; anything else (bad configuration, a refused password, a deployment
    mismatch) is raised and stops the service. Raises StartupStopped when ``stop`` is set meanwhile."""
    backoff = first_backoff_s
    attempt = 0
    while True:
        if stop is not None and stop.is_set():
            raise StartupStopped(what)
        attempt += 1
        try:
            return await step()
        except Exception as error:
            if classify(error) is not Fault.PLATFORM:
                raise
            log.warning(f"{what}: dependency not reachable, retrying",
                        extra={"step": what, "attempt": attempt, "retry_in_s": backoff, "error": repr(error)})
        if stop is None:
            await asyncio.sleep(backoff)
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), backoff)
        backoff = min(backoff * 2, max_backoff_s)


START_ATTEMPT_ENV = "SAGA_START_ATTEMPT"


def start_over(what: str, max_attempts: int = 10) -> None:
    """Replace this process by a fresh run of its own command line (same pid, same output) after a backoff,
    for a start that failed on a dependency outside ``retry_startup``'s reach; returns without doing so once
    ``max_attempts`` starts failed in a row (the caller then exits)."""
    attempt = int(os.environ.get(START_ATTEMPT_ENV, "1"))
    if attempt >= max_attempts:
        log.error(f"{what}: start failed {attempt} times; giving up", extra={"attempt": attempt})
        return
    delay = min(0.5 * 2 ** (attempt - 1), 5.0)
    log.warning(f"{what}: start failed (a dependency restarting?); starting over",
                extra={"attempt": attempt, "retry_in_s": delay})
    logging.shutdown()
    time.sleep(delay)
    os.environ[START_ATTEMPT_ENV] = str(attempt + 1)
    os.execv(sys.executable, sys.orig_argv)
