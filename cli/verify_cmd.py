"""``saga verify``: check the system's invariants over every saga (or the given ones); exit 1 on any problem.

Checks: every started saga reached a terminal state (else: where it waits — last event, pending timers,
rows still in an outbox); each saga's participant effects match how it ended (``cli/verify_rules.py``); no
business effect was recorded twice for one idempotency key; the saga_summary read model agrees with the fold
of the saga's events. Events, summaries, timers and outboxes are read in one snapshot.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Collection
from dataclasses import asdict, dataclass, field
from typing import Annotated, Any

import asyncpg
import typer
from rich.table import Table

from ..infra.db import create_pool, datetime_to_ms
from ..infra.settings import Settings
from ..orchestrator.bootstrap import definitions
from ..orchestrator.domain.definition import DefinitionRegistry
from ..orchestrator.domain.state import SagaState, SagaStatus, fold
from ..orchestrator.ports import SagaSummaryRow
from ..participants.effects import collect_effects, effects_by_idempotency_key_counts
from ..schemas import wire
from ..schemas.event_types import Event, SagaStarted
from .context import console, fail, run, settings
from .verify_rules import RULES, PendingTimer, effect_problems, summary_problems, why_not_terminal

EffectReader = Callable[[asyncpg.Pool, str], Awaitable[dict[str, dict[str, int]]]]

# How to read a saga type's effect counts (participant → count → n) when its participants are not the
# reference ones; register one next to the type's rules (``cli.verify_rules.register_rules``).
EFFECT_READERS: dict[str, EffectReader] = {}


async def reference_effects(pool: asyncpg.Pool, saga_id: str) -> dict[str, dict[str, int]]:
    """Effect counts from the reference participants' tables (flight, hotel, payment, notification)."""
    return (await collect_effects(pool, saga_id)).counts()


@dataclass(frozen=True)
class Violation:
    """One broken invariant of one saga."""

    saga_id: str
    problem: str


@dataclass(frozen=True)
class VerifyReport:
    """What ``verify_system`` found."""

    started: int  # sagas with a SagaStarted event
    terminal: dict[str, int]  # by status (REJECTED: ids whose every message was refused; not "started")
    not_terminal: list[tuple[str, str, str]]  # (saga_id, status, why)
    violations: list[Violation] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No violation and nothing unfinished."""
        return not self.violations and not self.not_terminal

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able view."""
        return {"ok": self.ok, "started": self.started, "terminal": dict(self.terminal),
                "not_terminal": [{"saga_id": s, "status": st, "why": why} for s, st, why in self.not_terminal],
                "violations": [asdict(v) for v in self.violations]}


@dataclass
class _Snapshot:
    events: dict[str, list[Event]]
    summaries: dict[str, SagaSummaryRow]
    timers: dict[str, list[PendingTimer]]
    outbox_rows: dict[str, dict[str, int]]  # saga id → outbox table → rows waiting
    now_ms: int


async def verify_system(settings: Settings, saga_ids: Collection[str] | None = None,
                        wait_s: float = 0) -> VerifyReport:
    """Check every saga (or ``saga_ids``); with ``wait_s`` re-check until all is terminal and consistent
    or the time is up, and return the last report."""
    registry = definitions(settings)
    wanted = None if saga_ids is None else set(saga_ids)
    deadline = time.monotonic() + wait_s
    pool = await create_pool(settings.dsn(), 4, connect_timeout_s=15)
    try:
        while True:
            report = await _check(pool, registry, wanted)
            remaining = deadline - time.monotonic()
            if report.ok or remaining <= 0:
                return report
            await asyncio.sleep(min(0.5, remaining))
    finally:
        await pool.close()


async def _check(pool: asyncpg.Pool, registry: DefinitionRegistry, wanted: set[str] | None) -> VerifyReport:
    snapshot = await _read_snapshot(pool, wanted)
    violations: list[Violation] = []
    not_terminal: list[tuple[str, str, str]] = []
    terminal: Counter[str] = Counter()
    started = 0
    states: dict[str, SagaState] = {}
    for saga_id in sorted(wanted if wanted is not None else snapshot.events):
        events = snapshot.events.get(saga_id)
        if not events:
            not_terminal.append((saga_id, "UNKNOWN", "no events recorded: its StartSaga was not handled (yet)"))
            continue
        try:
            state = fold(registry.for_history(events), events)
        except Exception as error:  # unknown definition, a gap, an illegal transition: all unfoldable
            violations.append(Violation(saga_id, f"cannot fold its events: {type(error).__name__}: {error}"))
            continue
        states[saga_id] = state
        started += any(isinstance(e, SagaStarted) for e in events)
        if state.is_terminal:
            terminal[state.status.value] += 1
        else:
            why = why_not_terminal(state, type(events[-1]).__name__, snapshot.timers.get(saga_id, []),
                                   snapshot.outbox_rows.get(saga_id, {}), snapshot.now_ms)
            not_terminal.append((saga_id, state.status.value, why))
        violations += [Violation(saga_id, p) for p in summary_problems(state, snapshot.summaries.get(saga_id))]
    violations += await _effect_violations(pool, states)
    violations += await _duplicate_violations(pool, wanted)
    return VerifyReport(started=started, terminal=dict(sorted(terminal.items())), not_terminal=not_terminal,
                        violations=violations)


async def _effect_violations(pool: asyncpg.Pool, states: dict[str, SagaState]) -> list[Violation]:
    slots = asyncio.Semaphore(3)

    async def one(saga_id: str, state: SagaState) -> list[Violation]:
        if state.status in (SagaStatus.REJECTED, SagaStatus.PURGED) or state.saga_type not in RULES:
            return []  # nothing started, its steps were purged, or a saga type with the generic checks only
        async with slots:
            counts = await EFFECT_READERS.get(state.saga_type, reference_effects)(pool, saga_id)
        return [Violation(saga_id, p) for p in effect_problems(state, counts)]

    found = await asyncio.gather(*(one(saga_id, state) for saga_id, state in states.items()))
    return [violation for saga in found for violation in saga]


async def _duplicate_violations(pool: asyncpg.Pool, wanted: set[str] | None) -> list[Violation]:
    violations = []
    for table, keys in (await effects_by_idempotency_key_counts(pool, only_duplicates=True)).items():
        for key, rows in sorted(keys.items()):
            saga_id = key.rpartition(":")[0]
            if wanted is None or saga_id in wanted:
                violations.append(Violation(saga_id, f"{table}: {rows} rows for idempotency key {key}"))
    return violations


async def _read_snapshot(pool: asyncpg.Pool, wanted: set[str] | None) -> _Snapshot:
    args: list[object] = [] if wanted is None else [sorted(wanted)]
    where, key_where = ("WHERE saga_id = ANY($1)", "WHERE message_key = ANY($1)") if args else ("", "")
    events: dict[str, list[Event]] = {}
    summaries: dict[str, SagaSummaryRow] = {}
    timers: dict[str, list[PendingTimer]] = {}
    outbox_rows: dict[str, dict[str, int]] = {}
    async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
        now_ms = datetime_to_ms(await conn.fetchval("SELECT now()"))
        if not await conn.fetchval("SELECT to_regclass('saga.events') IS NOT NULL"):
            return _Snapshot(events, summaries, timers, outbox_rows, now_ms)  # nothing ran here yet
        for row in await conn.fetch(f"SELECT saga_id, body FROM saga.events {where} ORDER BY saga_id, seq",
                                    *args):
            events.setdefault(row["saga_id"], []).append(wire.decode_event(row["body"]))
        for row in await conn.fetch(f"SELECT * FROM saga.saga_summary {where}", *args):
            summaries[row["saga_id"]] = SagaSummaryRow(
                saga_id=row["saga_id"], saga_type=row["saga_type"], tenant_id=row["tenant_id"],
                status=row["status"], started_at_ms=datetime_to_ms(row["started_at"]),
                updated_at_ms=datetime_to_ms(row["updated_at"]), last_seq=row["last_seq"],
                failed_step=row["failed_step"], reason=row["reason"])
        for row in await conn.fetch(f"SELECT * FROM saga.timers {where} ORDER BY due_at", *args):
            timers.setdefault(row["saga_id"], []).append(
                PendingTimer(row["kind"], row["step"], row["attempt"], datetime_to_ms(row["due_at"])))
        # Every outbox: the orchestrator's and each participant's (same table shape, one per schema).
        outboxes = await conn.fetch("SELECT table_schema FROM information_schema.tables"
                                    " WHERE table_name = 'outbox' ORDER BY 1")
        for schema in (row["table_schema"] for row in outboxes):
            for row in await conn.fetch(f'SELECT message_key, count(*) AS n FROM "{schema}".outbox {key_where}'
                                        " GROUP BY 1", *args):
                outbox_rows.setdefault(row["message_key"], {})[f"{schema}.outbox"] = row["n"]
    return _Snapshot(events, summaries, timers, outbox_rows, now_ms)


def verify(
    saga_ids: Annotated[list[str] | None, typer.Argument(help="Only these sagas (default: every saga).")] = None,
    wait: float = typer.Option(0.0, "--wait", min=0, help="Wait up to this many seconds for sagas to finish."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Check every saga ended and its effects match how it ended; exit 1 on any violation or unfinished saga."""
    try:
        report = run(verify_system(settings(), saga_ids or None, wait))
    except (OSError, asyncpg.PostgresError, TimeoutError) as error:
        fail(f"cannot reach Postgres ({error}); run `saga infra up` or set DATABASE_URL")
    if as_json:
        console.print_json(json.dumps(report.to_dict()))
    else:
        _print(report)
    if not report.ok:
        raise typer.Exit(1)


def _print(report: VerifyReport) -> None:
    summary = Table("figure", "value")
    summary.add_row("sagas started", str(report.started))
    for status, count in report.terminal.items():
        summary.add_row(f"ended {status}", str(count))
    summary.add_row("not terminal", str(len(report.not_terminal)))
    summary.add_row("violations", str(len(report.violations)))
    console.print(summary)
    if report.not_terminal:
        table = Table("saga", "state", "why", title="not terminal")
        for saga_id, status, why in report.not_terminal[:50]:
            table.add_row(saga_id, status, why)
        console.print(table)
    if report.violations:
        table = Table("saga", "problem", title="violations")
        for violation in report.violations[:100]:
            table.add_row(violation.saga_id, violation.problem)
        console.print(table)
    console.print("[green]verify: every saga ended and every invariant holds[/]" if report.ok
                  else "[red]verify: problems found[/]")
