"""``saga verify``'s checks over the whole system: every saga (or the given ones) ended, and what it left
behind is what how it ended says.

Checks: every started saga reached a terminal state (else: where it waits — last event, pending timers, rows
still in an outbox); each saga's participant effects match how it ended (``invariants``, where each step's
effect shows as its participant declares it); no business effect was recorded twice for one step; the saga_summary read
model agrees with the fold of the saga's events. Events, summaries, timers and outboxes are read in one
snapshot.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import asyncpg

from ..infra.db import create_pool, datetime_to_ms
from ..infra.settings import Settings
from ..participants.kit.effects import count_effects, duplicate_effects
from ..participants.kit.participant import Participant
from ..participants.registry import deployment_participants
from ..schemas import wire
from ..schemas.event_types import Event, SagaStarted
from .bootstrap import definitions
from .domain.definition import DefinitionRegistry, SagaDefinition
from .domain.state import SagaState, SagaStatus, fold
from .invariants import PendingTimer, effect_problems, step_effects, summary_problems, why_not_terminal
from .ports import SagaSummaryRow


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


async def verify_system(settings: Settings, saga_ids: Collection[str] | None = None, wait_s: float = 0,
                        participants: Sequence[Participant] | None = None) -> VerifyReport:
    """Check every saga (or ``saga_ids``); with ``wait_s`` re-check until all is terminal and consistent
    or the time is up, and return the last report. Effects are read from ``participants`` (default: the
    deployment's, ``participants.registry.deployment_participants``)."""
    registry = definitions(settings)
    declaring = [p for p in (deployment_participants(settings) if participants is None else participants)
                 if p.effects is not None]
    wanted = None if saga_ids is None else set(saga_ids)
    deadline = time.monotonic() + wait_s
    pool = await create_pool(settings.dsn(), 4, connect_timeout_s=15)
    try:
        while True:
            report = await _check(pool, registry, declaring, wanted)
            remaining = deadline - time.monotonic()
            if report.ok or remaining <= 0:
                return report
            await asyncio.sleep(min(0.5, remaining))
    finally:
        await pool.close()


async def _check(pool: asyncpg.Pool, registry: DefinitionRegistry, participants: Sequence[Participant],
                 wanted: set[str] | None) -> VerifyReport:
    snapshot = await _read_snapshot(pool, wanted)
    violations: list[Violation] = []
    not_terminal: list[tuple[str, str, str]] = []
    terminal: Counter[str] = Counter()
    started = 0
    states: dict[str, tuple[SagaDefinition | None, SagaState]] = {}
    for saga_id in sorted(wanted if wanted is not None else snapshot.events):
        events = snapshot.events.get(saga_id)
        if not events:
            not_terminal.append((saga_id, "UNKNOWN", "no events recorded: its StartSaga was not handled (yet)"))
            continue
        try:
            definition = registry.for_history(events)
            state = fold(definition, events)
        except Exception as error:  # unknown definition, a gap, an illegal transition: all unfoldable
            violations.append(Violation(saga_id, f"cannot fold its events: {type(error).__name__}: {error}"))
            continue
        states[saga_id] = definition, state
        started += any(isinstance(e, SagaStarted) for e in events)
        if state.is_terminal:
            terminal[state.status.value] += 1
        else:
            why = why_not_terminal(state, type(events[-1]).__name__, snapshot.timers.get(saga_id, []),
                                   snapshot.outbox_rows.get(saga_id, {}), snapshot.now_ms)
            not_terminal.append((saga_id, state.status.value, why))
        violations += [Violation(saga_id, p) for p in summary_problems(state, snapshot.summaries.get(saga_id))]
    violations += await _effect_violations(pool, participants, states)
    violations += await _duplicate_violations(pool, participants, wanted)
    return VerifyReport(started=started, terminal=dict(sorted(terminal.items())), not_terminal=not_terminal,
                        violations=violations)


async def _effect_violations(pool: asyncpg.Pool, participants: Sequence[Participant],
                             states: dict[str, tuple[SagaDefinition | None, SagaState]]) -> list[Violation]:
    slots = asyncio.Semaphore(3)
    declared = {p.name: p.effects.actions for p in participants if p.effects is not None}

    async def one(saga_id: str, definition: SagaDefinition | None, state: SagaState) -> list[Violation]:
        effects = {} if definition is None else step_effects(definition, declared)
        if state.status in (SagaStatus.REJECTED, SagaStatus.PURGED) or not effects:
            return []  # nothing started, its steps were purged, or no step with a declared effect
        used = {effect.participant for effect in effects.values()}
        async with slots:
            counts = await count_effects(pool, [p for p in participants if p.name in used], saga_id)
        return [Violation(saga_id, p) for p in effect_problems(state, counts, effects)]

    found = await asyncio.gather(*(one(saga_id, *pair) for saga_id, pair in states.items()))
    return [violation for saga in found for violation in saga]


async def _duplicate_violations(pool: asyncpg.Pool, participants: Sequence[Participant],
                                wanted: set[str] | None) -> list[Violation]:
    violations = []
    for table, keys in (await duplicate_effects(pool, participants)).items():
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
                failed_step=row["failed_step"], reason=row["reason"], current_step=row["current_step"],
                step_failures=row["step_failures"], last_error=row["last_error"])
        for row in await conn.fetch(f"SELECT * FROM saga.timers {where} ORDER BY due_at", *args):
            timers.setdefault(row["saga_id"], []).append(
                PendingTimer(row["kind"], row["step"], row["attempt"], datetime_to_ms(row["due_at"])))
        # Every outbox: the orchestrator's and each participant's (same table shape, one per schema).
        # Their parked rows too (refused by the broker: the saga's later rows wait behind them).
        outboxes = await conn.fetch("SELECT table_schema, table_name FROM information_schema.tables"
                                    " WHERE table_name IN ('outbox', 'outbox_parked') ORDER BY 1, 2")
        for schema, table in ((row["table_schema"], row["table_name"]) for row in outboxes):
            for row in await conn.fetch(f'SELECT message_key, count(*) AS n FROM "{schema}".{table} {key_where}'
                                        " GROUP BY 1", *args):
                outbox_rows.setdefault(row["message_key"], {})[f"{schema}.{table}"] = row["n"]
    return _Snapshot(events, summaries, timers, outbox_rows, now_ms)
