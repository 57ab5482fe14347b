"""Chaos soak: trip sagas of every scenario while services are killed and Kafka and Postgres restart.

    python -m bench.chaos --duration 600 --rate 4 --kill-every 15 [--broker-restart-every 240]
                          [--db-restart-every 240] [--seed 1] [--dup-copies 1] [--keep]

Starts a private Kafka and Postgres (own folder and free ports; the only ones this run ever restarts), every
service as a child process, then for ``--duration`` seconds: starts sagas at ``--rate`` per second (a mix of
every scenario in participants/trip/scenarios.py, the 'cancelled' ones cancelled once started), kill -9s a
random service every ``--kill-every`` seconds on average (spread over all of them) and restarts it, restarts
the broker and Postgres every so often, and injects duplicates of every command, reply, start and cancel. Then
it waits for every started saga to end (``--drain-timeout``) and runs ``verify_system``.

Prints sagas started / terminal / lost, kills by service, broker and Postgres restarts, duplicates injected,
invariant violations, isolation steps (what the services' isolation ladders logged below the batch: the chaos
holds no poison, so each is healthy work treated as bad) and throughput under chaos. Exit code 1 on any lost
saga, violation, isolation step, or service that exited by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench.chaos_run import ChaosPlan, ChaosResult, ChaosRun
from bench.chaos_support import started_and_ready
from bench.trip import trip_settings
from saga_orchestrator.cli.run_cmd import service_commands
from saga_orchestrator.infra.launcher.private import free_port_block, private_infrastructure
from saga_orchestrator.infra.settings import Settings

console = Console()


async def chaos_on_private_stack(plan: ChaosPlan, home: Path, partitions: int = 4,
                                 console_out: Console | None = None) -> ChaosResult:
    """Start a private Kafka + Postgres in ``home`` and every service, run ``plan``, stop everything."""
    out = console_out or console
    async with private_infrastructure(Settings(), home) as private:
        settings = trip_settings(private).model_copy(update={"saga_topic_prefix": "chaos.",
                                                            "saga_topic_partitions": partitions})
        settings = settings.model_copy(update={"saga_health_port": free_port_block(len(service_commands(settings)))})
        log_dir = home / "service-logs"
        log_dir.mkdir(exist_ok=True)
        out.log(f"private Kafka {settings.kafka_servers()}, Postgres {settings.dsn()}; logs in {log_dir}")
        stack = await started_and_ready(settings, log_dir)
        try:
            run = ChaosRun(stack, plan, note=lambda text: out.log(text))
            ticker = asyncio.create_task(_tick(run, out))
            try:
                return await run.run()
            finally:
                ticker.cancel()
        finally:
            stack.stop()


async def _tick(run: ChaosRun, out: Console, every_s: float = 30.0) -> None:
    started = time.monotonic()
    while True:
        await asyncio.sleep(every_s)
        result = run.result
        out.log(f"{time.monotonic() - started:5.0f} s: {len(result.scenario_of)} started, "
                f"{len(result.outcome_of)} ended, {sum(result.kills.values())} kills, "
                f"{result.broker_restarts} broker / {result.db_restarts} Postgres restarts")


def print_result(result: ChaosResult, out: Console | None = None) -> None:
    """The run's figures, then any lost saga and violation."""
    out = out or console
    report = result.report
    figures = Table("figure", "value", title="chaos run", title_justify="left")
    plan = result.plan
    figures.add_row("plan", f"{plan.duration_s:.0f} s at {plan.rate:g} sagas/s, a kill every ~{plan.kill_every_s:g} s, "
                            f"seed {plan.seed}, " + (f"{plan.duplicate_copies} duplicate(s) of every message"
                                                   if plan.duplicates else "no duplicates"))
    figures.add_row("sagas started", str(len(result.scenario_of)))
    terminal = report.terminal if report else {}
    by_status = ", ".join(f"{k} {v}" for k, v in terminal.items())
    figures.add_row("terminal", f"{sum(terminal.values())}  ({by_status})")
    figures.add_row("lost (not terminal after drain)", _flag(len(result.lost)))
    figures.add_row("invariant violations", _flag(len(report.violations) if report else -1))
    figures.add_row("kills (kill -9)", f"{sum(result.kills.values())}  (" +
                    ", ".join(f"{k} {v}" for k, v in sorted(result.kills.items())) + ")")
    figures.add_row("services that exited by themselves", _flag(sum(result.unexpected_exits.values())))
    figures.add_row("broker restarts", str(result.broker_restarts))
    figures.add_row("Postgres restarts", str(result.db_restarts))
    figures.add_row("duplicates injected", str(result.duplicates_injected))
    figures.add_row("isolation steps (healthy work down a ladder)", _flag(sum(result.isolation_steps.values())))
    throughput = result.terminal_during_chaos / result.chaos_s if result.chaos_s else 0.0
    figures.add_row("throughput under chaos", f"{throughput:.2f} sagas/s ({result.terminal_during_chaos} ended "
                                              f"in {result.chaos_s:.0f} s)")
    figures.add_row("drain", f"{result.drain_s:.1f} s")
    as_planned = len(result.scenario_of) - len(result.ended_otherwise)
    figures.add_row("ended as their scenario says", f"{as_planned} of {len(result.scenario_of)} (the others timed "
                                                    "out while a service was down and were unwound)")
    out.print(figures)
    deviations = Counter(f"{name} → {seen or '(none)'}" for name, seen in result.ended_otherwise.values())
    if deviations:
        table = Table("scenario → ended", "sagas", title="outcomes other than the scenario's", title_justify="left")
        for key, count in deviations.most_common():
            table.add_row(key, str(count))
        out.print(table)
    if result.lost:
        table = Table("saga", "state", "where it waits", title="lost", title_justify="left")
        for saga_id, state, why in result.lost[:30]:
            table.add_row(saga_id, state, why)
        out.print(table)
    if result.isolation_steps:
        table = Table("service: logged (ladder): error", "times", title="isolation steps", title_justify="left")
        for step, count in result.isolation_steps.most_common(30):
            table.add_row(step, str(count))
        out.print(table)
    if report and report.violations:
        table = Table("saga", "problem", title="violations", title_justify="left")
        for violation in report.violations[:50]:
            table.add_row(violation.saga_id, violation.problem)
        out.print(table)
    passed = result.ok and not result.unexpected_exits and not result.isolation_steps
    out.print("[green]OK: nothing lost, no invariant broken, no healthy work isolated[/]" if passed
              else "[red]FAILED[/]")


def _flag(count: int) -> str:
    return f"[green]{count}[/]" if count == 0 else f"[red]{count}[/]"


def main() -> None:
    """Command-line entry: ``python -m bench.chaos``."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of chaos (default 600)")
    parser.add_argument("--rate", type=float, default=4.0, help="sagas started per second (default 4)")
    parser.add_argument("--kill-every", type=float, default=15.0, help="mean seconds between kills (0: none)")
    parser.add_argument("--broker-restart-every", type=float, default=240.0, help="seconds (0: none)")
    parser.add_argument("--db-restart-every", type=float, default=240.0, help="seconds (0: none)")
    parser.add_argument("--outage-max", type=float, default=4.0, help="longest a restarted server stays down")
    parser.add_argument("--dup-copies", type=int, default=1,
                        help="extra copies of every start, cancel, command and reply (0: no duplicates; default 1)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--drain-timeout", type=float, default=240.0, help="seconds to wait for the last sagas")
    parser.add_argument("--partitions", type=int, default=4, help="partitions per topic (default 4)")
    parser.add_argument("--home", type=Path, help="folder for the private Kafka, Postgres and logs (default: temp)")
    parser.add_argument("--keep", action="store_true", help="keep the folder (data and service logs) afterwards")
    args = parser.parse_args()
    # This process's own Kafka clients log every refused connection while the broker restarts; the run
    # reports outages itself.
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    plan = ChaosPlan(duration_s=args.duration, rate=args.rate, kill_every_s=args.kill_every,
                     broker_restart_every_s=args.broker_restart_every, db_restart_every_s=args.db_restart_every,
                     outage_s=(0.0, args.outage_max), duplicates=args.dup_copies > 0,
                     duplicate_copies=max(1, args.dup_copies), seed=args.seed,
                     drain_timeout_s=args.drain_timeout)
    home = args.home or Path(tempfile.mkdtemp(prefix="saga-chaos-"))
    try:
        result = asyncio.run(chaos_on_private_stack(plan, home, args.partitions))
    finally:
        if not args.keep and args.home is None:
            shutil.rmtree(home, ignore_errors=True)
    print_result(result)
    if args.keep or args.home:
        console.print(f"data and service logs kept in {home}")
    raise SystemExit(0 if result.ok and not result.unexpected_exits and not result.isolation_steps else 1)


if __name__ == "__main__":
    main()
