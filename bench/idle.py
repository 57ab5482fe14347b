"""What a quiet system costs: CPU of every process of the stack while no saga runs.

    python -m bench.idle [--seconds 60] [--participants SPEC]

Starts the orchestrator (relaying its own outbox) and the participant workers on a fresh database and topic
prefix, as ``saga run all`` does, runs a few sagas so that every consumer has joined its group and every pool
is open, waits ``--settle`` seconds, then samples ``/proc`` over ``--seconds`` with nothing to do and prints
each process's share of one core (Kafka and Postgres included, when the local launcher runs them) and the
total. Everything is stopped and dropped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import time
import uuid

import asyncpg
import uvloop
from rich.table import Table

from bench.probes import MACHINE, cpu_delta, sample_cpu
from bench.report import console
from bench.throughput import remove_run, run_topics, watched_processes, with_database, worker_ids
from bench.trip import trip_settings
from bench.watch import Watcher, publish, wait_for
from saga_orchestrator.cli.run_cmd import start_services, stop_services
from saga_orchestrator.infra.logging import configure_logging
from saga_orchestrator.orchestrator.bootstrap import prepare
from saga_orchestrator.schemas.topics import Topics

WARMUP_SAGAS = 8


async def measure(seconds: float, settle_s: float, participants: str | None) -> dict[str, float]:
    """CPU seconds per watched process over ``seconds`` of a quiet, warmed-up stack."""
    run_id = uuid.uuid4().hex[:8]
    base = trip_settings()
    database = f"bench_{run_id}"
    settings = base.model_copy(update={"database_url": with_database(base.dsn(), database),
                                       "saga_topic_prefix": f"idle-{run_id}.",
                                       "saga_participants": participants or base.saga_participants})
    topics = Topics(settings.saga_topic_prefix)
    admin = await asyncpg.connect(base.dsn())
    await admin.execute(f'CREATE DATABASE "{database}"')
    log_dir = os.path.join(settings.saga_home, "logs", database)
    os.makedirs(log_dir, exist_ok=True)
    services: dict[str, subprocess.Popen[bytes]] = {}
    watcher = Watcher(settings.kafka(), topics.events)
    try:
        await prepare(settings)
        services.update(start_services(settings, log_dir))
        await watcher.start()
        warmup = [f"warm-{run_id}-{n}" for n in range(WARMUP_SAGAS)]
        with console.status("warming up (services start, consumer groups join, pools fill)"):
            await publish(settings.kafka(), topics.start, warmup, None, watcher.seen.published_at)
            if not await wait_for(watcher, warmup, 180, services):
                raise TimeoutError("the warm-up sagas did not end within 180 s: see the service logs")
        await watcher.stop()  # this process stays quiet too while it measures
        with console.status(f"settling for {settle_s:.0f} s, then measuring {seconds:.0f} s with nothing to do"):
            await asyncio.sleep(settle_s)
            watched = watched_processes(settings, services, database)
            before, started = sample_cpu(watched), time.monotonic()
            await asyncio.sleep(seconds)
            used = cpu_delta(before, sample_cpu(watched))
            elapsed = time.monotonic() - started
        return {label: cpu / elapsed for label, cpu in used.items()}
    finally:
        stop_services(services)
        await remove_run(admin, settings, database, log_dir, keep=False, keep_logs=False,
                         topic_names=run_topics(settings), idents=worker_ids(settings))
        await admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to measure")
    parser.add_argument("--settle", type=float, default=10.0, help="quiet seconds before measuring")
    parser.add_argument("--participants", help="participant workers, as SAGA_PARTICIPANTS")
    args = parser.parse_args()
    configure_logging("WARNING", "kv")
    share = uvloop.run(measure(args.seconds, args.settle, args.participants))
    table = Table("process", "% of one core", title=f"a quiet stack over {args.seconds:.0f} s")
    stack = {label: value for label, value in share.items() if label not in ("bench (this)", MACHINE)}
    for label, value in stack.items():
        table.add_row(label, f"{value * 100:.2f}%")
    # The Postgres split is part of its whole server: the total counts each process once.
    total = sum(value for label, value in stack.items() if not label.startswith("  "))
    table.add_row("[bold]the stack", f"[bold]{total * 100:.2f}%")
    table.add_row("the whole machine (every process)", f"{share.get(MACHINE, 0.0) * 100:.2f}%")
    console.print(table)


if __name__ == "__main__":
    main()
