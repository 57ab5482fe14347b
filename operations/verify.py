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

from ..infra.db import create_pool
from ..infra.settings import Settings
from ..orchestrator.bootstrap import definitions
from ..orchestrator.domain.definition import DefinitionRegistry, SagaDefinition
from ..orchestrator.domain.state import SagaState, SagaStatus, fold
from ..orchestrator.invariants import effect_problems, step_effects, summary_problems, why_not_terminal
from ..participants.kit.participant import Participant
from ..participants.registry import deployment_participants
from ..schemas import wire
from ..schemas.event_types import SagaStarted
from .ports import VerifyStore
from .postgres import verify_store


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
            report = await check(verify_store(pool), registry, declaring, wanted)
            remaining = deadline - time.monotonic()
            if report.ok or remaining <= 0:
                return report
            await asyncio.sleep(min(0.5, remaining))
    finally:
        await pool.close()


async def check(store: VerifyStore, registry: DefinitionRegistry, participants: Sequence[Participant],
                wanted: Collection[str] | None = None) -> VerifyReport:
    """One round of checks of every saga in ``store`` (or ``wanted``), folding with ``registry``; effects are read
    from ``participants`` (those that declare them)."""
    snapshot = await store.snapshot(wanted)
    violations: list[Violation] = []
    not_terminal: list[tuple[str, str, str]] = []
    terminal: Counter[str] = Counter()
    started = 0
    states: dict[str, tuple[SagaDefinition | None, SagaState]] = {}
    for saga_id in sorted(wanted if wanted is not None else snapshot.events):
        events = [wire.decode_event(row.body) for row in snapshot.events.get(saga_id, [])]
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
    violations += await _effect_violations(store, participants, states)
    violations += await _duplicate_violations(store, participants, wanted)
    return VerifyReport(started=started, terminal=dict(sorted(terminal.items())), not_terminal=not_terminal,
                        violations=violations)


async def _effect_violations(store: VerifyStore, participants: Sequence[Participant],
                             states: dict[str, tuple[SagaDefinition | None, SagaState]]) -> list[Violation]:
    slots = asyncio.Semaphore(3)
    declared = {p.name: p.effects.actions for p in participants if p.effects is not None}

    async def one(saga_id: str, definition: SagaDefinition | None, state: SagaState) -> list[Violation]:
        effects = {} if definition is None else step_effects(definition, declared)
        if state.status in (SagaStatus.REJECTED, SagaStatus.PURGED) or not effects:
            return []  # nothing started, its steps were purged, or no step with a declared effect
        used = {effect.participant for effect in effects.values()}
        async with slots:
            counts = await store.count_effects([p for p in participants if p.name in used], saga_id)
        return [Violation(saga_id, p) for p in effect_problems(state, counts, effects)]

    found = await asyncio.gather(*(one(saga_id, *pair) for saga_id, pair in states.items()))
    return [violation for saga in found for violation in saga]


async def _duplicate_violations(store: VerifyStore, participants: Sequence[Participant],
                                wanted: Collection[str] | None) -> list[Violation]:
    violations = []
    for table, keys in (await store.duplicate_effects(participants)).items():
        for key, rows in sorted(keys.items()):
            saga_id = key.rpartition(":")[0]
            if wanted is None or saga_id in wanted:
                violations.append(Violation(saga_id, f"{table}: {rows} rows for idempotency key {key}"))
    return violations
