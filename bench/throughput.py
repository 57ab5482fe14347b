"""End-to-end throughput of the whole system: N happy trip sagas through every service, on real infra.

    python -m bench.throughput --sagas 2000 [--rate 300] [--runs 5] [--participants SPEC] [--prefix P] [--keep]

Each run gets a fresh topic prefix and a fresh database (``bench_<hex>``, created through ``--admin-dsn``,
default the configured DSN), starts the orchestrator (relaying its own outbox) and the participant workers as
child processes (as ``saga run all`` does; ``--participants`` groups them as ``SAGA_PARTICIPANTS`` does),
warms them up (3 s of sagas at the measured rate, waited for), then publishes N StartSagas (paced at
``--rate`` per second, or as fast as possible) and reads ``saga.events`` until every saga has a terminal event.
Reported: sagas/s (terminal count / time from first publish to last terminal), saga latency percentiles
(publish → terminal event on Kafka; SagaStarted.occurred_at → terminal occurred_at), messages/s the relays
published, messages/s the orchestrator handled, Postgres WAL bytes per saga (``pg_current_wal_lsn`` before and after,
the whole server), CPU per process, the latency of every hop a step takes
(``bench/hops.py``), and an in-process fold benchmark.
Everything is stopped, and the database and topics dropped, at the end (unless ``--keep``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import uvloop
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bench.hops import hop_latencies, hop_table
from bench.probes import (
    Watched,
    backend_cpu,
    cpu_by_application,
    cpu_delta,
    fold_events_per_s,
    sample_cpu,
)
from bench.report import console, report, with_backend_split
from bench.runs import RunSummary, runs_table
from bench.trip import trip_settings
from bench.watch import Watcher, publish, wait_for
from saga_orchestrator.cli.run_cmd import (
    Services,
    start_service,
    start_services,
    stop_services,
)
from saga_orchestrator.infra.kafka_admin import delete_topics, settled_group
from saga_orchestrator.infra.launcher.kafka import KafkaLauncher
from saga_orchestrator.infra.launcher.postgres import PostgresLauncher
from saga_orchestrator.infra.logging import configure_logging
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.orchestrator.bootstrap import prepare
from saga_orchestrator.participants.registry import participant_workers
from saga_orchestrator.participants.runner import hosted_participants, worker_id
from saga_orchestrator.participants.trip import PARTICIPANTS
from saga_orchestrator.schemas.topics import Topics

WARMUP_SAGAS = 8
WARMUP_S = 3.0
STALL_FACTOR = 3  # p99 above this many p50s: something stopped for a while (a slow machine raises both)


async def warm_up(settings: Settings, topics: Topics, watcher: Watcher, services: Services, sagas: int,
                  rate: float | None, prefix: str) -> None:
    """Run ``sagas`` sagas at ``rate`` and wait for them (not measured)."""
    warmup = [f"{prefix}-{n}" for n in range(sagas)]
    with console.status(f"warming up with {len(warmup)} sagas (services start, consumer groups join, "
                        "connection pools fill)"):
        await publish(settings.kafka(), topics.start, warmup, rate, watcher.seen.published_at)
        if not await wait_for(watcher, warmup, 180, services):
            raise TimeoutError("the warm-up sagas did not end within 180 s: see the service logs")
    for saga_id in warmup:
        watcher.seen.published_at.pop(saga_id)


def warmup_sagas(rate: float | None) -> int:
    """Sagas run (and waited for) before the measured ones: ``WARMUP_S`` seconds at the measured rate, so
    that the measurement starts on a warm stack (every pooled connection open, statements prepared, the
    broker's code compiled) instead of including its cold start; a few when the rate is unpaced."""
    return max(WARMUP_SAGAS, int((rate or 0) * WARMUP_S))


def with_database(dsn: str, database: str) -> str:
    """``dsn`` pointing at another database."""
    parts = urlsplit(dsn)
    return urlunsplit((parts.scheme, parts.netloc, f"/{database}", parts.query, parts.fragment))


async def applications(dsn: str) -> dict[int, str]:
    """``application_name`` of every backend connected to the bench database, by backend pid."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT pid, application_name FROM pg_stat_activity"
                                " WHERE datname = current_database() AND pid <> pg_backend_pid()")
        return {row["pid"]: row["application_name"] or "(unnamed)" for row in rows}
    finally:
        await conn.close()


async def count(dsn: str, sql: str) -> int:
    """One integer from the bench database."""
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval(sql))
    finally:
        await conn.close()


def watched_processes(settings: Settings, services: Services, database: str) -> list[Watched]:
    """The service processes plus Kafka and Postgres (when run by the local launcher) and this process.

    Postgres is split into the backends serving the benchmark's database and everything else (WAL
    writer, checkpointer, other databases' backends); Kafka cannot be split by client.
    """
    watched = [Watched(label, process.pid) for label, process in services.items()]
    if (kafka := KafkaLauncher(settings).pid()) is not None:
        watched.append(Watched("kafka (whole broker)", kafka))
    if (postgres := PostgresLauncher(settings).pid()) is not None:
        watched.append(Watched("postgres (whole server)", postgres, tree=True))
        watched.append(Watched(f"  of which {database} backends", postgres, tree=True, only=f" {database} "))
    watched.append(Watched("bench (this)", os.getpid()))
    return watched


Alongside = Callable[[Settings, str], AbstractAsyncContextManager[object]]
"""Something run beside the measured sagas (bench.console: the console, its fleet page asked again and again),
entered once the services are warm and left when the last saga ended; given the run's settings and log folder."""


async def run(args: argparse.Namespace, alongside: Alongside | None = None) -> RunSummary | None:
    """Create, measure, tear down; the run's headline numbers (None when no saga ended). ``alongside`` runs
    during the measured sagas; its own processes are not in the numbers."""
    run_id = uuid.uuid4().hex[:8]
    base = trip_settings()
    admin_dsn = args.admin_dsn or base.dsn()
    database = f"bench_{run_id}"
    prefix = args.prefix or f"bench-{run_id}."
    settings = base.model_copy(update={"database_url": with_database(admin_dsn, database),
                                       "saga_topic_prefix": prefix,
                                       "saga_topic_partitions": args.partitions,
                                       "saga_participants": args.participants or base.saga_participants})
    topics = Topics(prefix)
    fold = fold_events_per_s()  # before the services start: on an otherwise idle process
    admin = await asyncpg.connect(admin_dsn)
    await admin.execute(f'CREATE DATABASE "{database}"')
    log_dir = os.path.join(settings.saga_home, "logs", database)
    os.makedirs(log_dir, exist_ok=True)
    console.print(f"database {database}, topic prefix {prefix!r}, orchestrators: {args.orchestrators}, "
                  "participant workers: "
                  f"{' '.join('+'.join(worker) for worker in participant_workers(settings))}")
    services: dict[str, subprocess.Popen[bytes]] = {}
    keep_logs = False  # set when something went wrong: what the services logged explains it
    watcher = Watcher(settings.kafka(), topics.events)
    beside = AsyncExitStack()
    try:
        await prepare(settings)
        services.update(start_services(settings, log_dir))
        await watcher.start()
        await warm_up(settings, topics, watcher, services, warmup_sagas(args.rate), args.rate, f"warm-{run_id}")
        if args.orchestrators > 1:
            # The others join a group that already runs (starting together, two have stalled their join).
            for number in range(2, args.orchestrators + 1):
                services[f"orchestrator-{number}"] = start_service(settings, "orchestrator", log_dir,
                                                                   name=f"orchestrator-{number}")
            with console.status(f"waiting for {args.orchestrators} orchestrators to share the partitions"):
                await settled_group(settings.kafka(), f"{prefix}saga-orchestrator", args.orchestrators, 120)
            await warm_up(settings, topics, watcher, services, warmup_sagas(args.rate), args.rate,
                          f"warm2-{run_id}")

        if alongside is not None:
            await beside.enter_async_context(alongside(settings, log_dir))
        watched = watched_processes(settings, services, database)
        groups = {"start": [topics.start], "events": [topics.events],
                  "commands": [topics.commands(p) for p in PARTICIPANTS],
                  "results": [topics.results(p) for p in PARTICIPANTS]}
        all_topics = [t for names in groups.values() for t in names]
        offsets_before = await watcher.end_offsets(all_topics)
        inbox_sql = "SELECT count(*) FROM saga.inbox"
        inbox_before = await count(settings.dsn(), inbox_sql)
        postmaster = PostgresLauncher(settings).pid()
        backends_before = backend_cpu(postmaster) if postmaster else {}
        cpu_before = sample_cpu(watched)
        wal_before = await admin.fetchval("SELECT pg_current_wal_lsn()")

        saga_ids = [f"bench-{run_id}-{n:06d}" for n in range(args.sagas)]
        with Progress(TextColumn("[bold]sagas"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("{task.description}"), console=console, refresh_per_second=2) as progress:
            publisher = asyncio.create_task(publish(settings.kafka(), topics.start, saga_ids,
                                                    args.rate, watcher.seen.published_at))
            if not await wait_for(watcher, saga_ids, args.timeout, services, progress):
                console.print(f"[red]{len(saga_ids) - watcher.done(saga_ids)} of {len(saga_ids)} sagas did not "
                              f"end within {args.timeout:.0f} s; the numbers below are of those that did")
                keep_logs = True
            await publisher

        cpu = cpu_delta(cpu_before, sample_cpu(watched))
        await beside.aclose()
        wal_bytes = int(await admin.fetchval("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1)", wal_before))
        if postmaster:
            split = cpu_by_application(backends_before, backend_cpu(postmaster), await applications(settings.dsn()))
            cpu = with_backend_split(cpu, split)
        offsets_after = await watcher.end_offsets(all_topics)
        messages = {group: sum(offsets_after[t] - offsets_before[t] for t in names)
                    for group, names in groups.items()}
        handled = await count(settings.dsn(), inbox_sql) - inbox_before
        timeouts = await count(settings.dsn(), "SELECT count(*) FROM saga.events"
                                               " WHERE event_type = 'StepTimedOut' AND saga_id LIKE 'bench-%'")
        first_publish = min(watcher.seen.published_at[s] for s in saga_ids)
        ends = [watcher.seen.terminal_at[s] for s in saga_ids if s in watcher.seen.terminal_at]
        wall_s = max(ends, default=first_publish) - first_publish
        summary = report(args, saga_ids, watcher.seen, wall_s, messages, handled, timeouts, cpu, fold, wal_bytes)
        if summary is not None and summary.p99_ms > STALL_FACTOR * summary.p50_ms:
            console.print(f"[yellow]p99 is more than {STALL_FACTOR}x p50: a stall, not a slow machine; the service "
                          "logs are kept for a look")
            keep_logs = True
        with console.status("reading every hop's timestamps"):
            hops = await hop_latencies(settings.kafka(), settings.dsn(), topics, saga_ids)
        console.print(hop_table(hops))
    except BaseException:
        keep_logs = True
        raise
    finally:
        await beside.aclose()
        await watcher.stop()
        stop_services(services)
        await remove_run(admin, settings, database, log_dir, keep=args.keep, keep_logs=keep_logs,
                         topic_names=run_topics(settings), idents=worker_ids(settings))
        await admin.close()
    return summary


async def remove_run(admin: asyncpg.Connection, settings: Settings, database: str, log_dir: str, *, keep: bool,
                     keep_logs: bool, topic_names: Sequence[str], idents: Sequence[str]) -> None:
    """Remove what a run made once its services stopped: its database, ``topic_names``, the faust data of the
    workers ``idents`` and its service logs (kept, and said where, when ``keep_logs``: something went wrong);
    with ``keep``, nothing, and say where it all is."""
    if keep:
        console.print(f"kept database {database}, topics {settings.saga_topic_prefix}*, service logs in {log_dir}")
        return
    await admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    try:
        await delete_topics(settings.kafka(), list(topic_names))
    except Exception as error:  # leftovers of a benchmark are not worth failing the report for
        console.print(f"[yellow]could not delete topics: {error!r}")
    for ident in idents:
        shutil.rmtree(settings.saga_home / "faust" / ident, ignore_errors=True)
    if keep_logs:
        console.print(f"service logs kept in {log_dir}")
    else:
        shutil.rmtree(log_dir, ignore_errors=True)


def run_topics(settings: Settings) -> list[str]:
    """Every topic a run creates: the contract's, and the one faust creates per participant app."""
    internal = [f"{ident}-__assignor-__leader" for ident in worker_ids(settings)]
    return [*Topics(settings.saga_topic_prefix).all(PARTICIPANTS), *internal]


def worker_ids(settings: Settings) -> list[str]:
    """The consumer-group id of every participant worker ``saga run all`` starts."""
    return [worker_id([participant.name for participant in hosted_participants(worker)], settings)
            for worker in participant_workers(settings)]


def arguments() -> argparse.ArgumentParser:
    """The command line of one run (``run`` reads what it parses; bench.curve builds its rungs with it)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sagas", type=int, default=2000, help="happy trip sagas to run")
    parser.add_argument("--rate", type=float, default=None, help="StartSagas per second (default: all at once)")
    parser.add_argument("--prefix", default=None, help="topic prefix (default: a fresh bench-<hex>.)")
    parser.add_argument("--partitions", type=int, default=Settings().saga_topic_partitions)
    parser.add_argument("--participants", default=None,
                        help="participant workers, as SAGA_PARTICIPANTS (default: its value); "
                             "flight+hotel+payment+notification runs one worker hosting all four")
    parser.add_argument("--orchestrators", type=int, default=1,
                        help="orchestrator processes (each relaying the outbox shards of its partitions); the "
                             "others start after the first warm-up and a second warm-up runs once they share "
                             "the partitions")
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for every saga to end")
    parser.add_argument("--admin-dsn", default=None, help="DSN allowed to CREATE DATABASE (default: DATABASE_URL)")
    parser.add_argument("--keep", action="store_true", help="keep the database and topics")
    parser.add_argument("--runs", type=int, default=1,
                        help="repeat the run (fresh database, topics and services each time) and end with a "
                             "table of every run, their median and range")
    return parser


def main() -> None:
    """Command-line entry."""
    configure_logging("WARNING", "kv")  # the report is the output; warnings of this process's clients only
    parser = arguments()
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.orchestrators < 1:
        parser.error("--orchestrators must be at least 1")
    summaries = []
    for number in range(1, args.runs + 1):
        if args.runs > 1:
            console.rule(f"run {number} of {args.runs}")
        if (summary := uvloop.run(run(args))) is not None:
            summaries.append(summary)
    if args.runs > 1:
        console.print(runs_table(summaries))


if __name__ == "__main__":
    main()
