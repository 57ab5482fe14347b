"""The console under load: its pages' answer times with sagas running, and whether the sagas notice it.

    python -m bench.console [--rate 200] [--seconds 20] [--rounds 3] [--every 0.5] [--history 500000]

Each round is two ``bench.throughput`` runs at ``--rate`` for ``--seconds`` (fresh database, topics and
services each, the read model first given ``--history`` rows of ended sagas, as a deployment that has run a
while has: one in a hundred FAILED and so in the inbox, each with a searchable customer id): one plain, one with
``saga console`` started beside the services once they are warm and every page of ``PAGES`` (the fleet, the
inbox, a search by a prefix, the dead letters; the page and its API) asked one after the other every
``--every`` seconds while the sagas run. The runs alternate, plain first, so a machine that changes speed
affects both alike. The end is one table: per run, sagas/s, p50 / p99 latency and CPU per saga of the services
(the console's own CPU apart), and for the console runs the fleet page's answer times (p50, p95, max) and the
console's CPU; then the medians of each side, and each page's p50 / p95 over every console run against its
target.
"""

from __future__ import annotations

import argparse
import asyncio
import os
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


@dataclass
class PageTimes:
    """What the console did during one run: each path's answer times (ms), its CPU."""

    by_path: dict[str, list[float]] = field(default_factory=dict)
    cpu_s: float = 0.0
    errors: int = 0

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


def console_beside(times: PageTimes, every_s: float, history: int) -> throughput.Alongside:
    """The ``bench.throughput`` hook: the read model's older rows, then the console as its own process, its
    fleet asked every ``every_s``."""

    @asynccontextmanager
    async def beside(settings: Settings, log_dir: str) -> AsyncIterator[object]:
        await fill_read_model(settings, history)
        port = _free_port()
        process = _start_console(settings, os.path.join(log_dir, "console.log"), port)
        url = f"http://127.0.0.1:{port}"
        stop = asyncio.Event()
        try:
            async with httpx.AsyncClient(base_url=url, timeout=10) as client:
                await _ready(client, process)
                cpu_before = process_cpu_s(process.pid)
                asking = asyncio.create_task(_ask(client, times, every_s, stop))
                try:
                    yield times
                finally:
                    stop.set()
                    await asking
                    times.cpu_s = process_cpu_s(process.pid) - cpu_before
        finally:
            process.terminate()
            process.wait(10)

    return beside


def _start_console(settings: Settings, log_path: str, port: int) -> subprocess.Popen[bytes]:
    with open(log_path, "wb") as log:
        return subprocess.Popen([sys.executable, "-m", "saga_orchestrator.cli", "console", "--port", str(port)],
                                env=service_environment(settings), stdout=log, stderr=subprocess.STDOUT)


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
        return [*cells, "", "", "", "", ""]
    page = sorted(times.page_ms)
    return [*cells, f"{percentile(page, 0.5):,.0f}", f"{percentile(page, 0.95):,.0f}", f"{page[-1]:,.0f}",
            f"{percentile(sorted(times.api_ms), 0.5):,.0f}", f"{times.cpu_s / seconds * 100:.1f}%"]


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
    options = parser.parse_args()
    args = throughput.arguments().parse_args(["--sagas", str(int(options.rate * options.seconds)),
                                              "--rate", str(options.rate)])
    table = Table("run", "sagas/s", "p50 ms", "p99 ms", "CPU ms/saga", "page p50 ms", "page p95 ms",
                  "page max ms", "API p50 ms", "console CPU", title=f"the console beside {options.rate:g} sagas/s")
    plain: list[RunSummary] = []
    beside: list[tuple[RunSummary, PageTimes]] = []
    for number in range(1, options.rounds + 1):
        console.rule(f"round {number} of {options.rounds}: without the console")
        if (summary := uvloop.run(throughput.run(args, filled(options.history)))) is not None:
            plain.append(summary)
            table.add_row(*_row(f"{number} plain", summary, None, options.seconds))
        console.rule(f"round {number} of {options.rounds}: with the console open")
        times = PageTimes()
        if (summary := uvloop.run(throughput.run(args, console_beside(times, options.every,
                                                                        options.history)))) is not None:
            beside.append((summary, times))
            table.add_row(*_row(f"{number} console", summary, times, options.seconds))
    for label, runs in (("median plain", plain), ("median console", [run for run, _ in beside])):
        if runs:
            table.add_row(f"[bold]{label}", f"{statistics.median(r.sagas_per_s for r in runs):,.0f}",
                          f"{statistics.median(r.p50_ms for r in runs):,.0f}",
                          f"{statistics.median(r.p99_ms for r in runs):,.0f}",
                          f"{statistics.median(r.cpu_ms_per_saga for r in runs):.1f}", "", "", "", "", "")
    console.print(table)
    for path, target in PAGES.items():
        answers = sorted(ms for _, times in beside for ms in times.by_path.get(path, []))
        if answers:
            p95 = percentile(answers, 0.95)
            console.print(f"{path}: {len(answers)} answers, p50 {percentile(answers, 0.5):,.0f} ms, p95 {p95:,.0f} ms, "
                          f"max {answers[-1]:,.0f} ms; " + ("[green]under" if p95 < target else "[red]over")
                          + f" the {target:.0f} ms target at p95", soft_wrap=True)
    console.print(f"{sum(times.errors for _, times in beside)} errors")


if __name__ == "__main__":
    main()
