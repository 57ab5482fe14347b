"""The platform's faults never count against a step: a full disk, terminated backends, too many connections.

Trips of every trigger run at 10/s through the whole system (every service a process, on a private Kafka and
Postgres) while a real fault strikes for a few seconds:

- the disk under a participant's business table (``flight.bookings``) is full, and separately the disk under
  the orchestrator's event store (``saga.events``): a tablespace on a small tmpfs, filled up (SQLSTATE 53100);
- an administrator terminates every service backend mid-batch (``pg_terminate_backend``, 57P01), three times;
- every connection slot is taken while the services' pools reconnect (``too many connections``, 53300).

Afterwards every saga ended as its trigger says, nothing of theirs was dead-lettered, ``saga verify`` finds
nothing, no service exited, no isolation ladder went below its batch, and the fault was met and waited out (the
services' logs say so).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from bench.chaos_run import ChaosPlan, ChaosResult, ChaosRun
from bench.chaos_support import started_and_ready
from saga_orchestrator.cli.dlq_cmd import read_parked
from saga_orchestrator.cli.run_cmd import health_port
from saga_orchestrator.infra.health_server import fetch_health
from saga_orchestrator.infra.settings import Settings
from tests.chaos.conftest import private_stack_settings
from tests.chaos.tools.platform_faults import (
    FullDisk,
    can_mount,
    take_every_connection,
    terminate_service_backends,
)
from tests.conftest import module_stack
from tests.e2e.harness import Stack

pytestmark = pytest.mark.chaos

FAULT_S = 3.0
WAITED_OUT = "waiting out a platform fault"


@pytest.fixture(scope="module")
def stack(private_servers: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    settings = private_stack_settings(private_servers, "platform")
    log_dir: Path = tmp_path_factory.mktemp("platform-logs")
    yield from module_stack(started_and_ready(settings, log_dir), log_dir)


def _plan() -> ChaosPlan:
    return ChaosPlan(duration_s=11, rate=10, kill_every_s=0, broker_restart_every_s=0, db_restart_every_s=0,
                     duplicates=False, drain_timeout_s=120)


async def _run(stack: Stack, servers: Settings, at_s: float, name: str,
               fault: Callable[[], Awaitable[object]]) -> ChaosResult:
    async def strike() -> None:
        await fault()

    result = await ChaosRun(stack, _plan(), servers=servers, faults=[(at_s, name, strike)]).run()
    assert result.faults == [name]
    assert result.report is not None
    assert result.report.ok, (result.report.not_terminal[:5], result.report.violations[:5])
    wrong = result.ended_otherwise
    assert not wrong, f"{len(wrong)} of {len(result.scenario_of)} sagas ended wrongly: {list(wrong.items())[:10]}"
    assert len(result.scenario_of) >= 100 * _plan().duration_s / 12
    assert not result.unexpected_exits and stack.exited() == {}, stack.exited()
    assert not result.isolation_steps, f"healthy work down an isolation ladder: {result.isolation_steps}"
    letters = [parked.letter.saga_id for parked in await read_parked(stack.settings)
               if parked.letter is not None and parked.letter.saga_id in result.scenario_of]
    assert letters == [], f"dead-lettered: {letters[:10]}"
    return result


async def _watch_ready(stack: Stack, label: str, waits: list[str]) -> None:
    """Collect what ``label``'s ``GET /ready`` says it waits for, every 0.2 s, until cancelled."""
    settings = stack.settings
    while True:
        body = await fetch_health(settings.saga_health_host, health_port(settings, label), "/ready", any_status=True)
        if body is not None:
            waits.extend(json.loads(body)["waiting_for"])
        await asyncio.sleep(0.2)


def _logged_since(stack: Stack, offsets: dict[str, int]) -> dict[str, str]:
    return {label: stack.log(label)[offsets.get(label, 0):] for label in stack.labels}


@pytest.mark.parametrize(("tables", "waiter"), [
    (["flight.bookings"], "flight"),
    (["saga.events"], "orchestrator"),
], ids=["a-participants-business-table", "the-event-store"])
async def test_a_full_disk_for_a_few_seconds(stack: Stack, private_servers: Settings, tables: list[str],
                                             waiter: str) -> None:
    if (why := can_mount()) is not None:
        pytest.skip(why)
    folder = Path(f"/tmp/saga-full-disk-{uuid.uuid4().hex[:8]}")
    waits: list[str] = []

    async def fill_and_watch_ready() -> None:
        watching = asyncio.create_task(_watch_ready(stack, waiter, waits))
        try:
            await disk.fill(FAULT_S)
        finally:
            watching.cancel()

    async with FullDisk(stack.settings.dsn(), folder) as disk:
        await disk.move(tables)
        offsets = {label: len(stack.log(label)) for label in stack.labels}
        await _run(stack, private_servers, 4.0, f"no space left under {', '.join(tables)} for {FAULT_S:.0f} s",
                   fill_and_watch_ready)
    logged = _logged_since(stack, offsets)[waiter]
    assert WAITED_OUT in logged and "DiskFullError (53100)" in logged, logged[-3000:]
    # While it waited, /ready said so and named the fault.
    assert any("waits out a platform fault" in wait and "DiskFullError (53100)" in wait for wait in waits), waits


async def test_backends_terminated_mid_batch_then_too_many_connections(stack: Stack,
                                                                       private_servers: Settings) -> None:
    offsets = {label: len(stack.log(label)) for label in stack.labels}
    ended: list[int] = []
    held: list[int] = []

    async def terminate_then_take_every_slot() -> None:
        for _ in range(3):  # an administrator's pg_terminate_backend of every service connection, mid-batch
            ended.append(await terminate_service_backends(stack.settings.dsn()))
            await asyncio.sleep(1.0)
        await asyncio.sleep(1.0)
        # then the pools reconnect into a server whose every connection slot is taken
        held.append(await take_every_connection(stack.settings.dsn(), FAULT_S))

    await _run(stack, private_servers, 2.0, "pg_terminate_backend 3 times, then every connection slot taken",
               terminate_then_take_every_slot)
    assert min(ended) >= len(stack.labels), ended  # each service had a connection to lose, each time
    assert held and held[0] > 100, held
    logged = _logged_since(stack, offsets)
    assert all(WAITED_OUT in text for text in logged.values()), {k: v[-1500:] for k, v in logged.items()}
    assert "TooManyConnectionsError (53300)" in "".join(logged.values())
