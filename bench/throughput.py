"""End-to-end throughput of the whole system: N happy trip sagas through every service, on real infra.

    python -m bench.throughput --sagas 2000 [--rate 300] [--prefix P] [--keep]

Each run gets a fresh topic prefix and a fresh database (``bench_<hex>``, created through ``--admin-dsn``,
default the configured DSN), starts the orchestrator, the relay and every participant as child processes
(as ``saga run all`` does), warms them up with a few sagas, then publishes N StartSagas (paced at
``--rate`` per second, or as fast as possible) and reads ``saga.events`` until every saga has a terminal
event. Reported: sagas/s (terminal count / time from first publish to last terminal), saga latency
percentiles (publish → terminal observed; SagaStarted.occurred_at → terminal occurred_at), messages/s the
relays published, messages/s the orchestrator handled, CPU per process, and an in-process fold benchmark.
Everything is stopped, and the database and topics dropped, at the end (unless ``--keep``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

import asyncpg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from bench.probes import Watched, cpu_delta, fold_events_per_s, percentile, sample_cpu
from cli.feed import assign_from_beginning
from cli.run_cmd import start_services, stop_services
from cli.scenarios import SCENARIOS
from infra.launcher.kafka import KafkaLauncher
from infra.launcher.postgres import PostgresLauncher
from infra.settings import Settings
from orchestrator import wire
from orchestrator.bootstrap import prepare
from orchestrator.domain.events import TERMINAL_EVENTS, SagaStarted
from orchestrator.wire import EVENTS_NAMESPACE
from schemas.registry import default_registry
from schemas.topics import PARTICIPANTS, Topics

console = Console()
WARMUP_SAGAS = 8


@dataclass
class Observed:
    """What the events topic said about the sagas, with local receive times (perf_counter seconds)."""

    published_at: dict[str, float] = field(default_factory=dict)
    started_at_ms: dict[str, int] = field(default_factory=dict)
    terminal_at: dict[str, float] = field(default_factory=dict)
    terminal_ms: dict[str, int] = field(default_factory=dict)
    outcome: dict[str, str] = field(default_factory=dict)


class Watcher:
    """Reads saga.events and decodes only SagaStarted and terminal events (picked by writer fingerprint)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
        self._topic = topic
        registry = default_registry()
        names = [SagaStarted.__name__, *(cls.__name__ for cls in TERMINAL_EVENTS)]
        self._wanted = {registry.fingerprint(f"{EVENTS_NAMESPACE}.{name}") for name in names}
        self.seen = Observed()

    async def start(self) -> None:
        """Connect and read the topic from its beginning."""
        await self._consumer.start()
        await assign_from_beginning(self._consumer, self._topic)

    async def stop(self) -> None:
        """Disconnect."""
        await self._consumer.stop()

    async def poll(self) -> None:
        """Take in what has arrived."""
        batches = await self._consumer.getmany(timeout_ms=50, max_records=10_000)
        now = time.perf_counter()
        for records in batches.values():
            for record in records:
                if record.value is None or record.value[2:10] not in self._wanted:
                    continue
                event = wire.decode_event(record.value)
                if isinstance(event, SagaStarted):
                    self.seen.started_at_ms.setdefault(event.saga_id, event.occurred_at)
                elif event.saga_id not in self.seen.terminal_at:
                    self.seen.terminal_at[event.saga_id] = now
                    self.seen.terminal_ms[event.saga_id] = event.occurred_at
                    self.seen.outcome[event.saga_id] = type(event).__name__

    async def end_offsets(self, topics: list[str]) -> dict[str, int]:
        """Messages on each topic so far (sum of partition end offsets; fresh topics start at 0)."""
        # The consumer's own metadata covers only the topic it reads: fetch the whole cluster's.
        cluster = await self._consumer._client.fetch_all_metadata()
        partitions = [TopicPartition(t, p) for t in topics for p in cluster.partitions_for_topic(t) or ()]
        ends = await self._consumer.end_offsets(partitions)
        return {t: sum(offset for tp, offset in ends.items() if tp.topic == t) for t in topics}

    def done(self, saga_ids: list[str]) -> int:
        """How many of ``saga_ids`` have ended."""
        return sum(1 for saga_id in saga_ids if saga_id in self.seen.terminal_at)


async def publish(bootstrap: str, topic: str, saga_ids: list[str], rate: float | None,
                  published_at: dict[str, float]) -> None:
    """One StartSaga per saga id (happy trips), paced at ``rate`` per second when given."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=2)
    await producer.start()
    try:
        bodies = [wire.encode_start(SCENARIOS["happy"].start(saga_id)) for saga_id in saga_ids]
        first = time.perf_counter()
        for n, (saga_id, body) in enumerate(zip(saga_ids, bodies, strict=True)):
            if rate:
                delay = first + n / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
            published_at[saga_id] = time.perf_counter()
            await producer.send(topic, value=body, key=saga_id.encode(),
                                headers=[("message_id", uuid.uuid4().hex.encode())])
        await producer.flush()
    finally:
        await producer.stop()


async def wait_for(watcher: Watcher, saga_ids: list[str], timeout_s: float, services: dict[str, object],
                   progress: Progress | None = None) -> None:
    """Poll the events topic until every saga ended, the time is up, or a service died."""
    task = progress.add_task("", total=len(saga_ids)) if progress else None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        await watcher.poll()
        done = watcher.done(saga_ids)
        if progress is not None and task is not None:
            elapsed = time.perf_counter() - min(watcher.seen.published_at.values(), default=time.perf_counter())
            progress.update(task, completed=done, description=f"{done / max(elapsed, 1e-9):7.1f} sagas/s")
        if done == len(saga_ids):
            return
        dead = [label for label, process in services.items() if process.poll() is not None]  # type: ignore[attr-defined]
        if dead:
            raise RuntimeError(f"service(s) exited during the run: {', '.join(dead)}")
    raise TimeoutError(f"{len(saga_ids) - watcher.done(saga_ids)} of {len(saga_ids)} sagas did not end "
                       f"within {timeout_s:.0f} s")


def with_database(dsn: str, database: str) -> str:
    """``dsn`` pointing at another database."""
    parts = urlsplit(dsn)
    return urlunsplit((parts.scheme, parts.netloc, f"/{database}", parts.query, parts.fragment))


async def count(dsn: str, sql: str) -> int:
    """One integer from the bench database."""
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval(sql))
    finally:
        await conn.close()


def watched_processes(settings: Settings, services: dict[str, object]) -> list[Watched]:
    """The service processes plus Kafka and Postgres (when run by the local launcher) and this process."""
    watched = [Watched(label, process.pid) for label, process in services.items()]  # type: ignore[attr-defined]
    if (kafka := KafkaLauncher(settings).pid()) is not None:
        watched.append(Watched("kafka", kafka))
    if (postgres := PostgresLauncher(settings).pid()) is not None:
        watched.append(Watched("postgres (all)", postgres, tree=True))
    watched.append(Watched("bench (this)", os.getpid()))
    return watched


def ms(seconds: float) -> str:
    """Seconds as a millisecond figure."""
    return f"{seconds * 1000:,.0f}"


def report(args: argparse.Namespace, saga_ids: list[str], seen: Observed, wall_s: float,
           messages: dict[str, int], handled: int, timeouts: int, cpu: dict[str, float],
           fold: tuple[float, int]) -> None:
    """Print the results."""
    ended = [s for s in saga_ids if s in seen.terminal_at]
    summary = Table("measure", "value", title=f"{len(saga_ids)} happy trip sagas, rate "
                    f"{args.rate or 'unlimited'}/s, {args.partitions} partitions")
    summary.add_row("sagas ended / wall time", f"{len(ended)} / {wall_s:.2f} s")
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
    for name, values in (("publish → terminal observed", observed), ("SagaStarted → terminal (occurred_at)", recorded)):
        latency.add_row(name, *(ms(percentile(values, q)) for q in (0.50, 0.95, 0.99)), ms(values[-1]))
    console.print(latency)

    usage = Table("process", "cpu s", "% of one core", title=f"CPU during the run ({os.cpu_count()} cores)")
    for label, used in sorted(cpu.items(), key=lambda item: -item[1]):
        usage.add_row(label, f"{used:.1f}", f"{100 * used / wall_s:.0f}%")
    usage.add_row("total", f"{sum(cpu.values()):.1f}", f"{100 * sum(cpu.values()) / wall_s:.0f}%")
    console.print(usage)


async def run(args: argparse.Namespace) -> None:
    """Create, measure, tear down."""
    run_id = uuid.uuid4().hex[:8]
    base = Settings()
    admin_dsn = args.admin_dsn or base.dsn()
    database = f"bench_{run_id}"
    prefix = args.prefix or f"bench-{run_id}."
    settings = base.model_copy(update={"database_url": with_database(admin_dsn, database),
                                       "saga_topic_prefix": prefix,
                                       "saga_topic_partitions": args.partitions})
    topics = Topics(prefix)
    fold = fold_events_per_s()  # before the services start: on an otherwise idle process
    admin = await asyncpg.connect(admin_dsn)
    await admin.execute(f'CREATE DATABASE "{database}"')
    log_dir = os.path.join(settings.saga_home, "logs", database)
    os.makedirs(log_dir, exist_ok=True)
    console.print(f"database {database}, topic prefix {prefix!r}, service logs in {log_dir}")
    services: dict[str, object] = {}
    watcher = Watcher(settings.kafka_servers(), topics.events)
    try:
        await prepare(settings)
        services.update(start_services(settings, log_dir))
        await watcher.start()
        warmup = [f"warm-{run_id}-{n}" for n in range(WARMUP_SAGAS)]
        with console.status("warming up (services start, consumer groups join)"):
            await publish(settings.kafka_servers(), topics.start, warmup, None, watcher.seen.published_at)
            await wait_for(watcher, warmup, 180, services)
        for saga_id in warmup:
            watcher.seen.published_at.pop(saga_id)

        watched = watched_processes(settings, services)
        groups = {"start": [topics.start], "events": [topics.events],
                  "commands": [topics.commands(p) for p in PARTICIPANTS],
                  "results": [topics.results(p) for p in PARTICIPANTS]}
        all_topics = [t for names in groups.values() for t in names]
        offsets_before = await watcher.end_offsets(all_topics)
        inbox_sql = "SELECT count(*) FROM saga.inbox"
        inbox_before = await count(settings.dsn(), inbox_sql)
        cpu_before = sample_cpu(watched)

        saga_ids = [f"bench-{run_id}-{n:06d}" for n in range(args.sagas)]
        with Progress(TextColumn("[bold]sagas"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("{task.description}"), console=console) as progress:
            publisher = asyncio.create_task(publish(settings.kafka_servers(), topics.start, saga_ids,
                                                    args.rate, watcher.seen.published_at))
            await wait_for(watcher, saga_ids, args.timeout, services, progress)
            await publisher

        cpu = cpu_delta(cpu_before, sample_cpu(watched))
        offsets_after = await watcher.end_offsets(all_topics)
        messages = {group: sum(offsets_after[t] - offsets_before[t] for t in names)
                    for group, names in groups.items()}
        handled = await count(settings.dsn(), inbox_sql) - inbox_before
        timeouts = await count(settings.dsn(), "SELECT count(*) FROM saga.events WHERE event_type = 'StepTimedOut'")
        wall_s = max(watcher.seen.terminal_at[s] for s in saga_ids) - min(
            watcher.seen.published_at[s] for s in saga_ids)
        report(args, saga_ids, watcher.seen, wall_s, messages, handled, timeouts, cpu, fold)
    finally:
        await watcher.stop()
        stop_services(services)  # type: ignore[arg-type]
        if args.keep:
            console.print(f"kept database {database} and topics {prefix}*")
        else:
            await admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
            await delete_topics(settings.kafka_servers(), topics.all())
        await admin.close()


async def delete_topics(bootstrap: str, names: list[str]) -> None:
    """Remove the run's topics."""
    client = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await client.start()
    try:
        await client.delete_topics(names)
    except Exception as error:  # leftovers of a benchmark are not worth failing the report for
        console.print(f"[yellow]could not delete topics: {error!r}")
    finally:
        await client.close()


def main() -> None:
    """Command-line entry."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sagas", type=int, default=2000, help="happy trip sagas to run")
    parser.add_argument("--rate", type=float, default=None, help="StartSagas per second (default: all at once)")
    parser.add_argument("--prefix", default=None, help="topic prefix (default: a fresh bench-<hex>.)")
    parser.add_argument("--partitions", type=int, default=Settings().saga_topic_partitions)
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for every saga to end")
    parser.add_argument("--admin-dsn", default=None, help="DSN allowed to CREATE DATABASE (default: DATABASE_URL)")
    parser.add_argument("--keep", action="store_true", help="keep the database and topics")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
