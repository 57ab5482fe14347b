"""The console under load: its pages' answer times with sagas running, and whether the sagas notice it.

    python -m bench.console [--rate 200] [--seconds 20] [--rounds 3] [--every 0.5] [--history 500000] [--tabs 10]

Each round is two ``bench.throughput`` runs at ``--rate`` for ``--seconds`` (fresh database, topics and
services each, the read model first given ``--history`` rows of ended sagas, as a deployment that has run a
while has: one in a hundred FAILED and so in the inbox, each with a searchable customer id): one plain, one with
``saga console`` started beside the services once they are warm (logins off: the bench reads without signing
in), every page of ``PAGES`` (the fleet, the inbox, a search by a prefix, the dead letters; the page and its API)
asked one after the other every ``--every`` seconds while the sagas run, and ``--tabs`` console tabs open. A tab
holds a running saga's page and a server-sent-event stream of it (``GET /live``, the events read and counted; a
browser shares one stream between its tabs, so ten streams of one page each are the heavier case; once that saga
has ended and been shown ``TAB_DWELL_S``, it opens another running one, picked from the read model by the bench),
and refreshes the fleet's body every ``FLEET_REFRESH_S`` as the fleet page does: each tab does both, so the
console carries at least the load of that many open tabs. The runs alternate, plain
first, so a machine that changes speed affects both alike. The end is one table: per run, sagas/s, p50 / p99
latency and CPU per saga of the services (the console's own CPU apart), and for the console runs the fleet
page's answer times (p50, p95, max), the console's CPU, the tabs held and the saga pages they opened, the SSE
events they read and their errors (a stream or a page that failed); then the medians of each side, each page's
p50 / p95 over every console run against its target, and the tabs' totals.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import asyncpg
import httpx
import uvloop
from rich.table import Table

from bench import throughput
from bench.probes import percentile, process_cpu_s
from bench.report import console
from bench.runs import RunSummary
from saga_orchestrator.cli.run_cmd import service_environment
from saga_orchestrator.client.api import saga_segment
from saga_orchestrator.infra.logging import configure_logging
from saga_orchestrator.infra.settings import Settings

PAGE_TARGET_MS = 300.0
HISTORY = 500_000  # ended sagas in the read model: a month of a busy deployment's trips, purged after that
PAGES: dict[str, float] = {
    "/": PAGE_TARGET_MS, "/api/v1/fleet": PAGE_TARGET_MS,
    "/inbox": 100.0, "/api/v1/inbox": 100.0,
    "/search?q=CUST-12": 100.0, "/api/v1/search?q=cust-12": 100.0,
    "/dead-letters": 100.0, "/api/v1/dead-letters": 100.0,
}
"""Every path asked, with the p95 it should answer within (ms)."""
TABS = 10  # console tabs open during a console run
FLEET_REFRESH_S = 5.0  # the fleet page's own refresh: hx-trigger="every 5s" on /fleet/body (templates/fleet.html)
TAB_DWELL_S = 2.0  # a tab stays on a saga at least this long, ended or not, before it opens a running one
RUNNING_SQL = ("SELECT saga_id FROM saga.saga_summary WHERE status IN ('RUNNING', 'COMPENSATING')"
               " ORDER BY updated_at DESC LIMIT 50")
"""Sagas a tab may open: the latest moved of those still running (the (status, updated_at) index)."""
_WATCHED = re.compile(r'data-watch-after="(\d+)"')
_ENDED = re.compile(r'class=\\?"status (COMPLETED|FAILED|COMPENSATED|COMPENSATION_FAILED|CANCELLED|'
                    r'COMPLETED_WITH_FAILURES|TERMINATED|QUARANTINED|REJECTED|PURGED)\\?" id=\\?"status-badge')
"""The saga's own status badge (saga_status.html) once nothing moves it on by itself, as the page draws it or as
the stream's JSON carries it (its quotes escaped)."""


@dataclass
class PageTimes:
    """What the console did during one run: each path's answer times (ms), its CPU."""

    by_path: dict[str, list[float]] = field(default_factory=dict)
    cpu_s: float = 0.0
    errors: int = 0
    tabs: int = 0
    sagas_opened: int = 0
    sse_events: int = 0
    stream_errors: int = 0
    tab_errors: int = 0

    @property
    def page_ms(self) -> list[float]:
        """The fleet page's answer times."""
        return self.by_path.get("/", [])

    @property
    def api_ms(self) -> list[float]:
        """The fleet API's answer times."""
        return self.by_path.get("/api/v1/fleet", [])


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def fill_read_model(settings: Settings, sagas: int) -> None:
    """Give the run's read model ``sagas`` more rows, of trips that ended over the last 30 days (four in five
    completed), as a deployment that has run a while has: the fleet page reads them all."""
    conn = await asyncpg.connect(settings.dsn())
    try:
        await conn.execute(
            "INSERT INTO saga.saga_summary (saga_id, saga_type, status, started_at, updated_at, last_seq)"
            " SELECT 'old-' || n, 'trip', CASE WHEN n % 100 = 0 THEN 'FAILED' WHEN n % 5 = 0 THEN 'COMPENSATED'"
            "        ELSE 'COMPLETED' END,"
            "        now() - (n % 2592000) * interval '1 second', now() - (n % 2592000) * interval '1 second', 12"
            " FROM generate_series(1, $1) AS n", sagas)
        await conn.execute("INSERT INTO saga.search_keys (value, field, saga_id)"
                           " SELECT 'cust-' || n, 'customer_id', 'old-' || n FROM generate_series(1, $1) AS n", sagas)
        await conn.execute("ANALYZE saga.saga_summary")
        await conn.execute("ANALYZE saga.search_keys")
    finally:
        await conn.close()


def filled(history: int) -> throughput.Alongside:
    """The hook of a plain run: only the read model's older rows."""

    @asynccontextmanager
    async def beside(settings: Settings, log_dir: str) -> AsyncIterator[object]:
        await fill_read_model(settings, history)
        yield None

    return beside


def console_beside(times: PageTimes, every_s: float, history: int, tabs: int = TABS) -> throughput.Alongside:
    """The ``bench.throughput`` hook: the read model's older rows, then the console as its own process, logins
    off, every page of ``PAGES`` asked every ``every_s`` and ``tabs`` console tabs open (``_tab``)."""

    @asynccontextmanager
    async def beside(settings: Settings, log_dir: str) -> AsyncIterator[object]:
        await fill_read_model(settings, history)
        port = _free_port()
        process = _start_console(settings, os.path.join(log_dir, "console.log"), port)
        url = f"http://127.0.0.1:{port}"
        stop = asyncio.Event()
        try:
            # The tabs have their own connections (a stream holds one while it is open) and no read timeout on
            # them (their pages set one): the stream of a saga that records nothing sends nothing.
            async with (httpx.AsyncClient(base_url=url, timeout=10) as client,
                        httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(10, read=None),
                                          limits=httpx.Limits(max_connections=2 * tabs + 2)) as tab_client):
                await _ready(client, process)
                picker = await _Picker.open(settings)
                cpu_before = process_cpu_s(process.pid)
                times.tabs = tabs
                asking = [asyncio.create_task(_ask(client, times, every_s, stop)),
                          *(asyncio.create_task(_tab(tab_client, picker, times, stop)) for _ in range(tabs))]
                try:
                    yield times
                finally:
                    stop.set()
                    await asyncio.gather(*asking)
                    times.cpu_s = process_cpu_s(process.pid) - cpu_before
                    await picker.close()
        finally:
            process.terminate()
            process.wait(10)

    return beside


class _Picker:
    """Running sagas for the tabs to open, read from the read model by the bench itself (its own connection,
    named ``bench tabs``): choosing a saga is the operator's doing, not the console's load."""

    def __init__(self, connection: asyncpg.Connection) -> None:
        self._connection = connection
        self._lock = asyncio.Lock()
        self.held: set[str] = set()

    @classmethod
    async def open(cls, settings: Settings) -> _Picker:
        return cls(await asyncpg.connect(settings.dsn(), server_settings={"application_name": "bench tabs"}))

    async def pick(self) -> str | None:
        """A running saga no tab holds (now held), or None when there is none."""
        async with self._lock:
            running = [row["saga_id"] for row in await self._connection.fetch(RUNNING_SQL)]
            free = [saga_id for saga_id in running if saga_id not in self.held]
            if not free:
                return None
            chosen: str = random.choice(free)
            self.held.add(chosen)
            return chosen

    async def close(self) -> None:
        await self._connection.close()


async def _tab(client: httpx.AsyncClient, picker: _Picker, times: PageTimes, stop: asyncio.Event) -> None:
    """One open console tab until ``stop``: the fleet body every ``FLEET_REFRESH_S`` as the fleet page refreshes
    it, and a running saga's page with a stream of it (``/live`` from the seq the page names), the events
    read and counted; once that saga has ended and the tab has shown it ``TAB_DWELL_S``, another running one.
    Each tab does both, so ten of them weigh at least what ten open tabs do."""
    refresh = asyncio.create_task(_refresh_fleet(client, times, stop))
    while not stop.is_set():
        saga_id = await picker.pick()
        if saga_id is None:
            await _pause(stop, 0.5)
            continue
        try:
            await _watch(client, saga_id, times, stop)
        except httpx.HTTPError:
            times.stream_errors += 1
            await _pause(stop, 0.5)
        finally:
            picker.held.discard(saga_id)
    await refresh


async def _watch(client: httpx.AsyncClient, saga_id: str, times: PageTimes, stop: asyncio.Event) -> None:
    page = await client.get(f"/sagas/{saga_segment(saga_id)}", timeout=10)
    page.raise_for_status()
    times.sagas_opened += 1
    found = _WATCHED.search(page.text)
    if found is None:
        raise httpx.HTTPError(f"the page of {saga_id} names no seq to watch from")
    opened = time.monotonic()
    ended = _ENDED.search(page.text) is not None

    async def read(stream: httpx.Response) -> None:
        nonlocal ended
        event = ""
        async for line in stream.aiter_lines():
            if line.startswith("event: "):
                event = line[len("event: "):]
                times.sse_events += 1
            elif event == "update" and _ENDED.search(line):
                ended = True
        raise httpx.HTTPError(f"the stream of {saga_id} ended")

    async with client.stream("GET", "/live", params={"watch": "1", "saga": saga_id, "after": found.group(1)}) as stream:
        stream.raise_for_status()
        reader = asyncio.create_task(read(stream))
        try:
            while not stop.is_set() and not reader.done():
                if ended and time.monotonic() - opened >= TAB_DWELL_S:
                    break
                await asyncio.wait([reader], timeout=0.25)
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader  # a reader that failed raises here


async def _refresh_fleet(client: httpx.AsyncClient, times: PageTimes, stop: asyncio.Event) -> None:
    await _pause(stop, random.uniform(0, FLEET_REFRESH_S))  # tabs opened at different moments
    while not stop.is_set():
        began = time.perf_counter()
        try:
            (await client.get("/fleet/body", timeout=10)).raise_for_status()
            times.by_path.setdefault("/fleet/body", []).append((time.perf_counter() - began) * 1000)
        except httpx.HTTPError:
            times.tab_errors += 1
        await _pause(stop, FLEET_REFRESH_S)


async def _pause(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        pass


def _start_console(settings: Settings, log_path: str, port: int) -> subprocess.Popen[bytes]:
    """The console with logins off (no users, no operator header, no levers: anyone may read, as the bench
    asks), whatever the environment says."""
    reading = settings.model_copy(update={"saga_console_users": None, "saga_console_operator_header": None,
                                          "saga_console_levers": False})
    with open(log_path, "wb") as log:
        return subprocess.Popen([sys.executable, "-m", "saga_orchestrator.cli", "console", "--port", str(port)],
                                env=service_environment(reading), stdout=log, stderr=subprocess.STDOUT)


async def _ready(client: httpx.AsyncClient, process: subprocess.Popen[bytes]) -> None:
    for _ in range(300):
        try:
            if (await client.get("/api/openapi.json")).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if process.poll() is not None:
            raise RuntimeError("the console exited at start; its log is in the run's log folder")
        await asyncio.sleep(0.1)
    raise RuntimeError("the console did not answer within 30 s")


async def _ask(client: httpx.AsyncClient, times: PageTimes, every_s: float, stop: asyncio.Event) -> None:
    while not stop.is_set():
        for path in PAGES:
            began = time.perf_counter()
            try:
                answer = await client.get(path)
                answer.raise_for_status()
            except httpx.HTTPError:
                times.errors += 1
                continue
            times.by_path.setdefault(path, []).append((time.perf_counter() - began) * 1000)
        try:
            await asyncio.wait_for(stop.wait(), every_s)
        except TimeoutError:
            pass


def _row(label: str, run: RunSummary, times: PageTimes | None, seconds: float) -> list[str]:
    cells = [label, f"{run.sagas_per_s:,.0f}", f"{run.p50_ms:,.0f}", f"{run.p99_ms:,.0f}", f"{run.cpu_ms_per_saga:.1f}"]
    if times is None or not times.page_ms:
        return [*cells, "", "", "", "", "", "", "", ""]
    page = sorted(times.page_ms)
    return [*cells, f"{percentile(page, 0.5):,.0f}", f"{percentile(page, 0.95):,.0f}", f"{page[-1]:,.0f}",
            f"{percentile(sorted(times.api_ms), 0.5):,.0f}", f"{times.cpu_s / seconds * 100:.1f}%",
            f"{times.tabs} / {times.sagas_opened:,}", f"{times.sse_events:,}",
            f"{times.stream_errors + times.tab_errors}"]


def main() -> None:
    """Command-line entry."""
    configure_logging("WARNING", "kv")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=200.0, help="StartSagas per second")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long each run publishes")
    parser.add_argument("--rounds", type=int, default=3, help="pairs of runs, plain then with the console")
    parser.add_argument("--every", type=float, default=0.5, help="seconds between two asks of the fleet page")
    parser.add_argument("--history", type=int, default=HISTORY,
                        help="rows of ended sagas in the read model before the run (both kinds of run)")
    parser.add_argument("--tabs", type=int, default=TABS,
                        help="console tabs open during each console run: a running saga's page and its stream, "
                             "and the fleet's refresh")
    options = parser.parse_args()
    args = throughput.arguments().parse_args(["--sagas", str(int(options.rate * options.seconds)),
                                              "--rate", str(options.rate)])
    table = Table("run", "sagas/s", "p50 ms", "p99 ms", "CPU ms/saga", "page p50 ms", "page p95 ms",
                  "page max ms", "API p50 ms", "console CPU", "tabs / sagas opened", "SSE events",
                  "tab errors", title=f"the console beside {options.rate:g} sagas/s, {options.tabs} tabs open")
    plain: list[RunSummary] = []
    beside: list[tuple[RunSummary, PageTimes]] = []
    for number in range(1, options.rounds + 1):
        console.rule(f"round {number} of {options.rounds}: without the console")
        if (summary := uvloop.run(throughput.run(args, filled(options.history)))) is not None:
            plain.append(summary)
            table.add_row(*_row(f"{number} plain", summary, None, options.seconds))
        console.rule(f"round {number} of {options.rounds}: with the console open")
        times = PageTimes()
        if (summary := uvloop.run(throughput.run(args, console_beside(times, options.every, options.history,
                                                                        options.tabs)))) is not None:
            beside.append((summary, times))
            table.add_row(*_row(f"{number} console", summary, times, options.seconds))
    for label, runs in (("median plain", plain), ("median console", [run for run, _ in beside])):
        if runs:
            table.add_row(f"[bold]{label}", f"{statistics.median(r.sagas_per_s for r in runs):,.0f}",
                          f"{statistics.median(r.p50_ms for r in runs):,.0f}",
                          f"{statistics.median(r.p99_ms for r in runs):,.0f}",
                          f"{statistics.median(r.cpu_ms_per_saga for r in runs):.1f}", *[""] * 8)
    console.print(table)
    for path, target in PAGES.items():
        answers = sorted(ms for _, times in beside for ms in times.by_path.get(path, []))
        if answers:
            p95 = percentile(answers, 0.95)
            console.print(f"{path}: {len(answers)} answers, p50 {percentile(answers, 0.5):,.0f} ms, p95 {p95:,.0f} ms, "
                          f"max {answers[-1]:,.0f} ms; " + ("[green]under" if p95 < target else "[red]over")
                          + f" the {target:.0f} ms target at p95", soft_wrap=True)
    refreshes = sorted(ms for _, times in beside for ms in times.by_path.get("/fleet/body", []))
    if refreshes:
        console.print(f"/fleet/body (the tabs' refresh): {len(refreshes)} answers, p50 "
                      f"{percentile(refreshes, 0.5):,.0f} ms, p95 {percentile(refreshes, 0.95):,.0f} ms",
                      soft_wrap=True)
    console.print(f"{sum(times.errors for _, times in beside)} page errors; tabs: "
                  f"{sum(times.sagas_opened for _, times in beside):,} saga pages opened, "
                  f"{sum(times.sse_events for _, times in beside):,} SSE events, "
                  f"{sum(times.stream_errors for _, times in beside)} stream errors, "
                  f"{sum(times.tab_errors for _, times in beside)} refresh errors", soft_wrap=True)


if __name__ == "__main__":
    main()
