"""What a signal costs a saga beside a step: the loan (``examples/loans``) at a steady rate, approved at once.

    python -m bench.signals [--rate 15] [--seconds 60] [--admin-dsn DSN] [--keep]

A fresh database and topic prefix, the loan's services as ``saga run all`` starts them (the orchestrator
relaying its own outbox, a worker per participant), warmed up with 3 s of loans; then ``rate * seconds`` loans
paced at ``--rate``. The bench reads ``saga.events`` and, as soon as a loan records SignalAwaited, publishes its
Approval with ``SagaClient.signal``. Compared, per loan:

- the signal's round trip: the Approval published (this process's clock just before the send) → the orchestrator
  records StepCommandSent of ``disburse``, the step after the wait (the signal goes one hop: saga.control to
  the orchestrator, which decides the next step in the same transaction as SignalReceived);
- a step's round trip: StepCommandSent → StepSucceeded of ``hold_funds`` (the command relayed to the treasury's
  worker, handled in its transaction, its reply relayed back and decided: two hops, a participant between), and
  of every step of the loan pooled.

Printed: p50 / p90 / p99 of each (ms, ``occurred_at`` of the events: this machine's clock) and the signal's over
the step's. The database and topics are dropped at the end unless ``--keep``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import time
import uuid
from collections.abc import Sequence

import asyncpg
import uvloop
from rich.table import Table

from bench.probes import percentile
from bench.report import console
from bench.throughput import remove_run, with_database
from examples.loans.loan import Application, Approval
from saga_orchestrator.cli.run_cmd import Services, exited_services, start_services, stop_services
from saga_orchestrator.client import SagaClient
from saga_orchestrator.client.event_feed import assign_from_beginning
from saga_orchestrator.infra.logging import configure_logging
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.orchestrator.bootstrap import prepare
from saga_orchestrator.participants.registry import participant_workers
from saga_orchestrator.participants.runner import worker_id
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.event_types import (
    TERMINAL_EVENTS,
    Event,
    SignalAwaited,
    SignalReceived,
    StepCommandSent,
    StepSucceeded,
)
from saga_orchestrator.schemas.registry import default_registry
from saga_orchestrator.schemas.topics import Topics
from saga_orchestrator.schemas.wire import EVENTS_NAMESPACE

APP = "examples.loans.loan:app"
SAGA_TYPE = "loan"
STEP = "hold_funds"  # a step's round trip: its command sent → its success recorded
AFTER_WAIT = "disburse"  # the step the approval lets go: its command sent ends the signal's round trip
WARMUP_S = 3.0
QUANTILES = (0.50, 0.90, 0.99)


class Approver:
    """Reads saga.events; approves each loan that waits (SignalAwaited), noting when; notes which loans ended."""

    def __init__(self, settings: Settings, client: SagaClient) -> None:
        self._consumer = settings.kafka().consumer(enable_auto_commit=False, group_id=None)
        self._topic = client.topics.events
        self._client = client
        registry = default_registry()
        self._awaited = registry.fingerprint(f"{EVENTS_NAMESPACE}.{SignalAwaited.__name__}")
        self._terminal = {registry.fingerprint(f"{EVENTS_NAMESPACE}.{kind.__name__}") for kind in TERMINAL_EVENTS}
        self.signalled_at: dict[str, int] = {}  # saga id → epoch ms just before its approval was published
        self.ended: dict[str, str] = {}  # saga id → its terminal event
        self._sending: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        await self._consumer.start()
        await assign_from_beginning(self._consumer, self._topic)

    async def stop(self) -> None:
        for task in self._sending:
            task.cancel()
        await self._consumer.stop()

    async def poll(self) -> None:
        """Take in what arrived; approve every loan that began to wait."""
        for records in (await self._consumer.getmany(timeout_ms=50, max_records=5000)).values():
            for record in records:
                if record.value is None:
                    continue
                kind = record.value[2:10]
                if kind == self._awaited:
                    saga_id = wire.decode_event(record.value).saga_id
                    if saga_id not in self.signalled_at:
                        task = asyncio.create_task(self._approve(saga_id))
                        self._sending.add(task)
                        task.add_done_callback(self._sending.discard)
                elif kind in self._terminal:
                    event = wire.decode_event(record.value)
                    self.ended.setdefault(event.saga_id, type(event).__name__)

    async def _approve(self, saga_id: str) -> None:
        self.signalled_at[saga_id] = time.time_ns() // 1_000_000
        await self._client.signal(saga_id, "Approval", Approval(approver="bench", limit_cents=10_000_00),
                                  signal_id=f"approval-{saga_id}", sender="bench")

    async def wait(self, saga_ids: Sequence[str], timeout_s: float, services: Services) -> bool:
        """Until every saga of ``saga_ids`` ended (True) or the time is up (False); raises when a service died."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            await self.poll()
            if all(saga_id in self.ended for saga_id in saga_ids):
                return True
            if dead := exited_services(services):
                raise RuntimeError(f"service(s) exited during the run: {', '.join(dead)}")
        return False


async def publish_loans(client: SagaClient, saga_ids: Sequence[str], rate: float) -> None:
    """A loan application for each of ``saga_ids``, paced at ``rate`` per second."""
    first = time.perf_counter()
    for index, saga_id in enumerate(saga_ids):
        delay = first + index / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        application = Application(loan_id=saga_id, applicant="bench", amount_cents=5_000_00)
        await client.publish(client.topics.start, saga_id, client.encode_start(SAGA_TYPE, saga_id, application),
                             saga_type=SAGA_TYPE)


async def follow(approver: Approver, client: SagaClient, saga_ids: Sequence[str], rate: float, timeout_s: float,
                 services: Services) -> bool:
    """Publish the loans while the approver approves them; whether every one ended within ``timeout_s``."""
    publisher = asyncio.create_task(publish_loans(client, saga_ids, rate))
    try:
        return await approver.wait(saga_ids, timeout_s, services)
    finally:
        await publisher


async def recorded(dsn: str, saga_ids: Sequence[str]) -> dict[str, list[Event]]:
    """Each saga's events from the store, in order."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT saga_id, body FROM saga.events WHERE saga_id = ANY($1::text[])"
                                " ORDER BY saga_id, seq", list(saga_ids))
    finally:
        await conn.close()
    found: dict[str, list[Event]] = {}
    for row in rows:
        found.setdefault(row["saga_id"], []).append(wire.decode_event(row["body"]))
    return found


def round_trips(events: dict[str, list[Event]], signalled_at: dict[str, int]) -> dict[str, list[int]]:
    """Milliseconds, sorted, of: the signal's round trip and its parts, the step's round trip (and every step's)."""
    found: dict[str, list[int]] = {"signal": [], "signal in": [], "step": [], "every step": [], "reaction": []}
    for saga_id, history in events.items():
        sent = {e.step: e.occurred_at for e in history if isinstance(e, StepCommandSent) and e.attempt == 1}
        done = {e.step: e.occurred_at for e in history if isinstance(e, StepSucceeded)}
        received = [e.occurred_at for e in history if isinstance(e, SignalReceived)]
        awaited = [e.occurred_at for e in history if isinstance(e, SignalAwaited)]
        published = signalled_at.get(saga_id)
        if published is not None and AFTER_WAIT in sent and received and awaited:
            found["signal"].append(sent[AFTER_WAIT] - published)
            found["signal in"].append(received[0] - published)
            found["reaction"].append(published - awaited[0])
        if STEP in sent and STEP in done:
            found["step"].append(done[STEP] - sent[STEP])
        found["every step"] += [done[step] - at for step, at in sent.items() if step in done]
    return {name: sorted(values) for name, values in found.items()}


def trips_table(trips: dict[str, list[int]]) -> Table:
    rows = (("signal", f"signal: published → {AFTER_WAIT} sent"),
            ("signal in", "  of which published → SignalReceived"),
            ("step", f"step: {STEP} sent → succeeded"),
            ("every step", "  every step of the loan, pooled"),
            ("reaction", "(bench: SignalAwaited → published)"))
    table = Table("round trip", "count", *(f"p{round(q * 100)} ms" for q in QUANTILES), title="signal against step")
    for key, label in rows:
        values = trips[key]
        table.add_row(label, f"{len(values):,}", *(f"{percentile(values, q):,.0f}" for q in QUANTILES))
    signal, step = trips["signal"], trips["step"]
    if signal and step:
        table.add_row("[bold]signal / step", "", *(f"[bold]{percentile(signal, q) / max(percentile(step, q), 1):.2f}"
                                                     for q in QUANTILES))
    return table


async def run(args: argparse.Namespace) -> None:
    """Create, measure, report, tear down."""
    run_id = uuid.uuid4().hex[:8]
    base = Settings()
    admin_dsn = args.admin_dsn or base.dsn()
    database = f"bench_{run_id}"
    settings = base.model_copy(update={"database_url": with_database(admin_dsn, database),
                                       "saga_topic_prefix": f"bench-{run_id}.", "saga_app": APP})
    admin = await asyncpg.connect(admin_dsn)
    await admin.execute(f'CREATE DATABASE "{database}"')
    log_dir = os.path.join(settings.saga_home, "logs", database)
    os.makedirs(log_dir, exist_ok=True)
    services: dict[str, subprocess.Popen[bytes]] = {}
    keep_logs = False
    topics = Topics(settings.saga_topic_prefix)
    participants: tuple[str, ...] = ("treasury", "notices")
    try:
        _, topics, participants = await prepare(settings)
        services.update(start_services(settings, log_dir))
        console.print(f"database {database}, topic prefix {settings.saga_topic_prefix!r}, services: "
                      f"{', '.join(services)}")
        async with SagaClient.from_settings(settings) as client:
            approver = Approver(settings, client)
            await approver.start()
            try:
                warmup = [f"warm-{run_id}-{n:04d}" for n in range(max(8, int(args.rate * WARMUP_S)))]
                with console.status(f"warming up with {len(warmup)} loans"):
                    if not await follow(approver, client, warmup, args.rate, 180, services):
                        raise TimeoutError("the warm-up loans did not end within 180 s: see the service logs")
                saga_ids = [f"loan-{run_id}-{n:05d}" for n in range(int(args.rate * args.seconds))]
                with console.status(f"{len(saga_ids)} loans at {args.rate:g}/s, each approved once it waits"):
                    began = time.monotonic()
                    if not await follow(approver, client, saga_ids, args.rate, args.seconds + args.timeout,
                                        services):
                        keep_logs = True
                        console.print(f"[red]{sum(s not in approver.ended for s in saga_ids)} loans did not end")
                    took = time.monotonic() - began
            finally:
                await approver.stop()
        outcomes = {approver.ended.get(saga_id, "not ended") for saga_id in saga_ids}
        console.print(f"{len(saga_ids)} loans in {took:.1f} s ({len(saga_ids) / took:.1f}/s), ended: "
                      f"{', '.join(sorted(outcomes))}")
        trips = round_trips(await recorded(settings.dsn(), saga_ids), approver.signalled_at)
        console.print(trips_table(trips))
    except BaseException:
        keep_logs = True
        raise
    finally:
        stop_services(services)
        # The app's participants are not this process's SAGA_APP: the workers' ids from their names.
        idents = [worker_id(worker, settings) for worker in participant_workers(settings)]
        await remove_run(admin, settings, database, log_dir, keep=args.keep, keep_logs=keep_logs,
                         topic_names=[*topics.all(participants), *(f"{i}-__assignor-__leader" for i in idents)],
                         idents=idents)
        await admin.close()


def main() -> None:
    """Command-line entry."""
    configure_logging("WARNING", "kv")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=15.0, help="loans started per second")
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds of loans at that rate")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the last loans to end")
    parser.add_argument("--admin-dsn", default=None, help="DSN allowed to CREATE DATABASE (default: DATABASE_URL)")
    parser.add_argument("--keep", action="store_true", help="keep the database, topics and logs")
    args = parser.parse_args()
    if args.rate <= 0 or args.seconds <= 0:
        parser.error("--rate and --seconds must be above 0")
    uvloop.run(run(args))


if __name__ == "__main__":
    main()
