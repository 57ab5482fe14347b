"""``saga demo``: all services, 20 trip sagas over every trigger, live progress, a final check."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections import Counter
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..client.event_feed import EventFeed
from ..infra.settings import Settings
from ..orchestrator.bootstrap import prepare
from ..participants.trip.effects import collect_effects
from ..participants.trip.scenarios import DEMO_MIX, SCENARIOS, observed
from ..schemas import wire
from ..schemas.event_types import SagaStarted
from ..schemas.message_types import CancelSaga
from .context import console, database, producer, settings, topics
from .run_cmd import Services, exited_services, start_services, stop_services

DEMO_APP = "saga_orchestrator.participants.trip:app"
"""What ``saga demo`` runs, whatever the environment names: its scenarios are the example trip's."""
DEMO_TIMEOUT_S = 120.0

class ServicesExited(Exception):
    """Services the demo started exited while its sagas were running: nothing more will end."""

    def __init__(self, labels: list[str]) -> None:
        super().__init__(", ".join(labels))
        self.labels = labels


def log_tail(log_dir: str, label: str) -> str:
    """Why a service stopped, from its log: what it printed after its last JSON log line (a CLI error),
    else that last line."""
    path = Path(log_dir) / f"{label}.log"
    try:
        lines = [line.strip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines()]
    except (FileNotFoundError, PermissionError):
        return f"(no log at {path})"
    lines = [line for line in lines if line]
    structured = [index for index, line in enumerate(lines) if line.startswith("{")]
    after = lines[structured[-1] + 1:] if structured else lines
    return " ".join(after or lines[-1:]) or "(empty log)"


async def publish_starts(current: Settings, planned: dict[str, str]) -> None:
    """Publish one StartSaga per planned saga (saga id → scenario name)."""
    async with producer(current) as kafka:
        for saga_id, scenario in planned.items():
            body = wire.encode_start(SCENARIOS[scenario].start(saga_id))
            await kafka.send(topics(current).start, value=body, key=saga_id.encode(),
                             headers=[("message_id", str(uuid.uuid4()).encode())])
        await kafka.flush()


async def cancel(current: Settings, saga_id: str, reason: str) -> None:
    """Publish a CancelSaga for ``saga_id``."""
    async with producer(current) as kafka:
        body = wire.encode_cancel(CancelSaga(saga_id=saga_id, reason=reason))
        await kafka.send_and_wait(topics(current).control, value=body, key=saga_id.encode(),
                                  headers=[("message_id", str(uuid.uuid4()).encode())])


async def drive(current: Settings, planned: dict[str, str], timeout_s: float,
                services: Services | None = None) -> dict[str, str]:
    """Start the sagas, cancel those whose scenario says so, and wait for every terminal event; raises
    ``ServicesExited`` as soon as one of ``services`` stopped."""
    feed = EventFeed(current.kafka(), topics(current).events)
    await feed.start()
    cancelled: set[str] = set()
    to_cancel = {saga_id for saga_id, name in planned.items() if SCENARIOS[name].cancel}
    try:
        await publish_starts(current, planned)
        with Progress(TextColumn("[bold]sagas"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("{task.description}"), console=console) as progress:
            task = progress.add_task("", total=len(planned))
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                for event in await feed.poll(200):
                    if isinstance(event, SagaStarted) and event.saga_id in to_cancel - cancelled:
                        cancelled.add(event.saga_id)
                        await cancel(current, event.saga_id, "customer changed plans")
                done = planned.keys() & feed.terminal.keys()
                states = Counter(type(feed.terminal[s]).__name__ for s in done)
                progress.update(task, completed=len(done),
                                description=" ".join(f"{k}:{v}" for k, v in sorted(states.items())))
                if len(done) == len(planned):
                    break
                if services and (gone := exited_services(services)):
                    raise ServicesExited(gone)
    finally:
        await feed.stop()
    return {saga_id: type(feed.terminal[saga_id]).__name__ for saga_id in planned if saga_id in feed.terminal}


async def check_effects(current: Settings, planned: dict[str, str], ended: dict[str, str]) -> list[list[str]]:
    """One row per saga: id, scenario, expected and actual terminal event, effect mismatches."""
    rows = []
    async with database(current) as pool:
        for saga_id, name in planned.items():
            scenario = SCENARIOS[name]
            found = observed(await collect_effects(pool, saga_id))
            terminal = ended.get(saga_id, "(none)")
            problems = scenario.problems(terminal, found)
            rows.append([saga_id, name, terminal, "ok" if not problems else "; ".join(problems)])
    return rows


async def demo_body(current: Settings, services: Services | None = None) -> int:
    """Run the demo against already-running services; 0 when every saga ended as expected."""
    run_id = uuid.uuid4().hex[:6]
    planned = {f"demo-{run_id}-{name}-{i}": name for name, count in DEMO_MIX for i in range(1, count + 1)}
    started = time.monotonic()
    ended = await drive(current, planned, DEMO_TIMEOUT_S, services)
    elapsed = time.monotonic() - started
    rows = await check_effects(current, planned, ended)
    by_state = Table("terminal state", "sagas")
    for state, count in sorted(Counter(ended.values()).items()):
        by_state.add_row(state, str(count))
    by_state.add_row("(not terminal)", str(len(planned) - len(ended)))
    console.print(by_state)
    checks = Table("saga", "scenario", "ended", "effects check")
    for row in rows:
        checks.add_row(*row)
    console.print(checks)
    failures = [row for row in rows if row[3] != "ok"]
    console.print(f"{len(planned)} sagas in {elapsed:.1f} s; {len(planned) - len(failures)} as expected, "
                  f"{len(failures)} not")
    return 1 if failures else 0


def run_demo(keep_running: bool) -> int:
    """Start every service, run the demo sagas, stop the services (unless asked to keep them)."""
    current = settings().model_copy(update={"saga_app": DEMO_APP})  # the demo's scenarios are the trip's
    asyncio.run(prepare(current))
    log_dir = os.path.join(current.saga_home, "logs")
    os.makedirs(log_dir, exist_ok=True)
    processes = start_services(current, log_dir)
    console.print(f"services started (logs in {log_dir}): {', '.join(processes)}")
    try:
        return asyncio.run(demo_body(current, processes))
    except ServicesExited as stopped:
        for label in stopped.labels:
            console.print(f"[red]{label} exited with code {processes[label].returncode}:[/] "
                          f"{log_tail(log_dir, label)}", markup=True, highlight=False)
        console.print(f"the demo needs every service running; fix the above (full logs in {log_dir}) and run it "
                      "again")
        return 1
    finally:
        if keep_running:
            console.print("services left running; stop them with: kill " +
                          " ".join(str(p.pid) for p in processes.values()))
        else:
            stop_services(processes)
