"""End-to-end throughput of the whole system: N happy trip sagas through every service, on real infra.

    python -m bench.throughput --sagas 2000 [--rate 300] [--runs 5] [--participants SPEC] [--prefix P] [--keep]

Each run gets a fresh topic prefix and a fresh database (``bench_<hex>``, created through ``--admin-dsn``,
default the configured DSN), starts the orchestrator (relaying its own outbox) and the participant workers as
child processes (as ``saga run all`` does; ``--participants`` groups them as ``SAGA_PARTICIPANTS`` does),
warms them up (3 s of sagas at the measured rate, waited for), then publishes N StartSagas (paced at
``--rate`` per second, or as fast as possible) and reads ``saga.events`` until every saga has a terminal event.
Reported: sagas/s (terminal count / time from first publish to last terminal), saga latency percentiles
(publish → terminal event on Kafka; SagaStarted.occurred_at → terminal occurred_at), messages/s the relays
published, messages/s the orchestrator handled, CPU per process, the latency of every hop a step takes
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
from collections import Counter
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import uvloop
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from bench.hops import hop_latencies, hop_table
from bench.probes import (
    MACHINE,
    Watched,
    backend_cpu,
    cpu_by_application,
    cpu_delta,
    fold_events_per_s,
    percentile,
    sample_cpu,
)
from bench.runs import RunSummary, runs_table
from bench.watch import Observed, Watcher, publish, wait_for
from cli.run_cmd import Services, participant_workers, start_services, stop_services
from infra.kafka_admin import delete_topics
from infra.launcher.kafka import KafkaLauncher
from infra.launcher.postgres import PostgresLauncher
from infra.settings import Settings
from orchestrator.bootstrap import prepare
from participants.runner import hosted_participants, worker_id
from schemas.topics import PARTICIPANTS, Topics

console = Console()
WARMUP_SAGAS = 8
WARMUP_S = 3.0


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


def with_backend_split(cpu: dict[str, float], split: dict[str, float]) -> dict[str, float]:
    """``cpu`` with a row per client application inserted after the bench database's backends row."""
    rows: dict[str, float] = {}
    for label, used in cpu.items():
        rows[label] = used
        if label.startswith("  of which"):
            rows.update((f"    for {application}", value) for application, value in split.items())
    return rows


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


def ms(seconds: float) -> str:
    """Seconds as a millisecond figure."""
    return f"{seconds * 1000:,.0f}"


def report(args: argparse.Namespace, saga_ids: list[str], seen: Observed, wall_s: float,
           messages: dict[str, int], handled: int, timeouts: int, cpu: dict[str, float],
           fold: tuple[float, int]) -> RunSummary | None:
    """Print the results; return the headline numbers (None when no saga ended)."""
    ended = [s for s in saga_ids if s in seen.terminal_at]
    if not ended:
        console.print("[red]no saga ended: nothing to report")
        return None
    summary = Table("measure", "value", title=f"{len(saga_ids)} happy trip sagas, rate "
                    f"{args.rate or 'unlimited'}/s, {args.partitions} partitions")
    summary.add_row("sagas ended / wall time", f"{len(ended)} / {wall_s:.2f} s"
                    + (f"  ({len(saga_ids) - len(ended)} did not end)" if len(ended) < len(saga_ids) else ""))
    summary.add_row("[bold]sagas/s sustained", f"[bold]{len(ended) / wall_s:,.1f}")
    summary.add_row("outcomes", ", ".join(f"{k}: {v}" for k, v in sorted(Counter(seen.outcome[s] for s in ended)
                                                                         .items())))
    summary.add_row("step timeouts (StepTimedOut events)", str(timeouts))
    relayed = sum(v for k, v in messages.items() if k != "start")
    summary.add_row("relay msgs/s (events + commands + results)",
                    f"{relayed / wall_s:,.0f}  ({messages['events']:,} + {messages['commands']:,} + "
                    f"{messages['results']:,} msgs)")
    summary.add_row("orchestrator msgs handled/s (inbox rows)", f"{handled / wall_s:,.0f}  ({handled:,} msgs)")
    folds, length = fold
    summary.add_row(f"fold events/s (in-process, {length}-event trip)", f"{folds:,.0f}")
    console.print(summary)

    latency = Table("latency (ms)", "p50", "p95", "p99", "max", title="saga latency")
    observed = sorted(seen.terminal_at[s] - seen.published_at[s] for s in ended)
    recorded = sorted((seen.terminal_ms[s] - seen.started_at_ms[s]) / 1000 for s in ended if s in seen.started_at_ms)
    for name, values in (("publish → terminal on Kafka", observed), ("SagaStarted → terminal (occurred_at)", recorded)):
        latency.add_row(name, *(ms(percentile(values, q)) for q in (0.50, 0.95, 0.99)), ms(values[-1]))
    console.print(latency)
    console.print(latency_over_time(ended, seen))

    usage = Table("process", "cpu s", "% of one core", "ms per saga",
                  title=f"CPU during the run ({os.cpu_count()} cores)")
    machine = cpu.pop(MACHINE, 0.0)
    ours = sum(used for label, used in cpu.items() if not label.startswith(" "))

    def row(label: str, used: float) -> None:
        usage.add_row(label, f"{used:.1f}", f"{100 * used / wall_s:.0f}%", f"{1000 * used / len(ended):.1f}")

    for label, used in cpu.items():
        row(label, used)
    row("total of the above", ours)
    row("rest of the machine", max(0.0, machine - ours))
    console.print(usage)
    return RunSummary(sagas_per_s=len(ended) / wall_s, p50_ms=1000 * percentile(observed, 0.50),
                      p95_ms=1000 * percentile(observed, 0.95), p99_ms=1000 * percentile(observed, 0.99),
                      cpu_percent=100 * ours / wall_s, cpu_ms_per_saga=1000 * ours / len(ended),
                      fold_events_per_s=folds)


def latency_over_time(ended: list[str], seen: Observed, rows: int = 15) -> Table:
    """Latency percentiles by when the sagas were published: a stall shows as a few slow rows, a backlog
    as a steady climb."""
    first = min(seen.published_at[s] for s in ended)
    span = max(seen.published_at[s] for s in ended) - first
    width = max(span / rows, 0.5)
    buckets: dict[int, list[float]] = {}
    for saga_id in ended:
        index = min(int((seen.published_at[saga_id] - first) / width), rows - 1)
        buckets.setdefault(index, []).append(seen.terminal_at[saga_id] - seen.published_at[saga_id])
    table = Table("published at (s)", "sagas", "p50 ms", "p99 ms", "max ms", title="latency over time")
    for index in sorted(buckets):
        values = sorted(buckets[index])
        table.add_row(f"{index * width:.1f} to {(index + 1) * width:.1f}", str(len(values)),
                      ms(percentile(values, 0.5)), ms(percentile(values, 0.99)), ms(values[-1]))
    return table


async def run(args: argparse.Namespace) -> RunSummary | None:
    """Create, measure, tear down; the run's headline numbers (None when no saga ended)."""
    run_id = uuid.uuid4().hex[:8]
    base = Settings()
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
    console.print(f"database {database}, topic prefix {prefix!r}, participant workers: "
                  f"{' '.join('+'.join(worker) for worker in participant_workers(settings))}")
    services: dict[str, subprocess.Popen[bytes]] = {}
    keep_logs = False  # set when something went wrong: what the services logged explains it
    watcher = Watcher(settings.kafka_servers(), topics.events)
    try:
        await prepare(settings)
        services.update(start_services(settings, log_dir))
        await watcher.start()
        warmup = [f"warm-{run_id}-{n}" for n in range(warmup_sagas(args.rate))]
        with console.status(f"warming up with {len(warmup)} sagas (services start, consumer groups join, "
                            "connection pools fill)"):
            await publish(settings.kafka_servers(), topics.start, warmup, args.rate, watcher.seen.published_at)
            if not await wait_for(watcher, warmup, 180, services):
                raise TimeoutError("the warm-up sagas did not end within 180 s: see the service logs")
        for saga_id in warmup:
            watcher.seen.published_at.pop(saga_id)

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

        saga_ids = [f"bench-{run_id}-{n:06d}" for n in range(args.sagas)]
        with Progress(TextColumn("[bold]sagas"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("{task.description}"), console=console, refresh_per_second=2) as progress:
            publisher = asyncio.create_task(publish(settings.kafka_servers(), topics.start, saga_ids,
                                                    args.rate, watcher.seen.published_at))
            if not await wait_for(watcher, saga_ids, args.timeout, services, progress):
                console.print(f"[red]{len(saga_ids) - watcher.done(saga_ids)} of {len(saga_ids)} sagas did not "
                              f"end within {args.timeout:.0f} s; the numbers below are of those that did")
                keep_logs = True
            await publisher

        cpu = cpu_delta(cpu_before, sample_cpu(watched))
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
        summary = report(args, saga_ids, watcher.seen, wall_s, messages, handled, timeouts, cpu, fold)
        with console.status("reading every hop's timestamps"):
            hops = await hop_latencies(settings.kafka_servers(), settings.dsn(), topics, saga_ids)
        console.print(hop_table(hops))
    except BaseException:
        keep_logs = True
        raise
    finally:
        await watcher.stop()
        stop_services(services)
        if args.keep:
            console.print(f"kept database {database}, topics {prefix}*, service logs in {log_dir}")
        else:
            await admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
            try:
                await delete_topics(settings.kafka_servers(), run_topics(settings))
            except Exception as error:  # leftovers of a benchmark are not worth failing the report for
                console.print(f"[yellow]could not delete topics: {error!r}")
            for ident in worker_ids(settings):
                shutil.rmtree(settings.saga_home / "faust" / ident, ignore_errors=True)
            if keep_logs:
                console.print(f"service logs kept in {log_dir}")
            else:
                shutil.rmtree(log_dir, ignore_errors=True)
        await admin.close()
    return summary


def run_topics(settings: Settings) -> list[str]:
    """Every topic a run creates: the contract's, and the one faust creates per participant app."""
    internal = [f"{ident}-__assignor-__leader" for ident in worker_ids(settings)]
    return [*Topics(settings.saga_topic_prefix).all(), *internal]


def worker_ids(settings: Settings) -> list[str]:
    """The consumer-group id of every participant worker ``saga run all`` starts."""
    return [worker_id([participant.name for participant in hosted_participants(worker)], settings)
            for worker in participant_workers(settings)]


def main() -> None:
    """Command-line entry."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sagas", type=int, default=2000, help="happy trip sagas to run")
    parser.add_argument("--rate", type=float, default=None, help="StartSagas per second (default: all at once)")
    parser.add_argument("--prefix", default=None, help="topic prefix (default: a fresh bench-<hex>.)")
    parser.add_argument("--partitions", type=int, default=Settings().saga_topic_partitions)
    parser.add_argument("--participants", default=None,
                        help="participant workers, as SAGA_PARTICIPANTS (default: its value); "
                             "flight+hotel+payment+notification runs one worker hosting all four")
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for every saga to end")
    parser.add_argument("--admin-dsn", default=None, help="DSN allowed to CREATE DATABASE (default: DATABASE_URL)")
    parser.add_argument("--keep", action="store_true", help="keep the database and topics")
    parser.add_argument("--runs", type=int, default=1,
                        help="repeat the run (fresh database, topics and services each time) and end with a "
                             "table of every run, their median and range")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
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
