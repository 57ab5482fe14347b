"""Moving the running sagas of a type from one definition version to another (``saga definitions migrate``), as
a bulk job of the Migrate lever.

``plan`` is the dry run: every saga of the type on the source version that has not ended (RUNNING, or
COMPENSATING), each with what the lever would do, decided by the same pure check the orchestrator applies
(``orchestrator.domain.migration.migration_problem``) on the saga's history from the event store: None (it would
move) or why it would be refused. ``start`` records the bulk job (``bulk_jobs.start``, action Migrate with the
target version): the orchestrator sends the lever to each saga still on the source version, in the saga's own
partition, where it is decided again against the saga as it stands then (applied: ``OperatorAction`` and
``SagaMigrated``; refused: ``OperatorActionRefused`` with the same line). ``outcome`` reads back, from the sagas'
histories, how many of the job's levers moved their saga and how many were refused.

Quarantined sagas are not selected: a quarantined saga takes no lever until it is released.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..orchestrator.domain.definition import DefinitionRegistry, SagaDefinition
from ..orchestrator.domain.errors import DomainError
from ..orchestrator.domain.migration import migration_problem
from ..orchestrator.domain.model import SagaStatus
from ..orchestrator.domain.state import fold
from ..schemas import event_types as ev
from ..schemas import wire
from ..schemas.codec import WireError
from ..schemas.message_types import Lever
from . import bulk_jobs
from .bulk_jobs import BulkJob, BulkJobError, Selection
from .ports import BulkJobStore, ReadsStore

MIGRATED_FROM = (SagaStatus.RUNNING.value, SagaStatus.COMPENSATING.value)
"""The statuses a migration job selects: the sagas that have not ended and take a lever (a COMPENSATING one is
refused: it follows the undos it started with)."""

MAX_PLANNED = 1_000_000
"""The most sagas a dry run lists."""


@dataclass(frozen=True)
class Planned:
    """One saga of a migration's dry run: ``problem`` is why the lever would be refused (None: it would move)."""

    saga_id: str
    problem: str | None


def selection(saga_type: str, from_version: int) -> Selection:
    """The sagas a migration of ``saga_type`` from ``from_version`` takes: on that version, not ended."""
    return Selection(saga_type=saga_type, statuses=MIGRATED_FROM, definition_version=from_version)


def target(registry: DefinitionRegistry, saga_type: str, from_version: int, to_version: int) -> SagaDefinition:
    """The definition the sagas move to; BulkJobError when either version is not deployed here, or they are the
    same."""
    if from_version == to_version:
        raise BulkJobError(f"the sagas already run on {saga_type} v{to_version}: name another version to move to")
    for version in (from_version, to_version):
        if version not in registry.versions(saga_type):
            deployed = ", ".join(f"v{v}" for v in registry.versions(saga_type)) or "none"
            raise BulkJobError(f"{saga_type} v{version} is not deployed (deployed: {deployed}); the orchestrator "
                               "decides each migration by the definitions it runs")
    return registry.get(saga_type, to_version)


async def plan(reads: ReadsStore, registry: DefinitionRegistry, saga_type: str, from_version: int,
               to_version: int) -> list[Planned]:
    """The dry run: each saga the migration selects now, in saga id order, with why it would be refused (None:
    it would move), decided on its stored history as the orchestrator decides the lever."""
    goal = target(registry, saga_type, from_version, to_version)
    rows = await reads.list_sagas(bulk_jobs.criteria(selection(saga_type, from_version), registry).filter,
                                  MAX_PLANNED)
    ids = sorted(row.saga_id for row in rows)
    stored = await reads.events_of(ids, ev.EVENT_TYPES)
    histories: dict[str, list[bytes]] = {saga_id: [] for saga_id in ids}
    for row in stored:
        histories[row.saga_id].append(row.body)
    return [Planned(saga_id, _problem(registry, bodies, goal)) for saga_id, bodies in histories.items()]


def _problem(registry: DefinitionRegistry, bodies: Sequence[bytes], goal: SagaDefinition) -> str | None:
    try:
        events = [wire.decode_event(body) for body in bodies]
        source = registry.for_history(events)
        if source is None:
            return "the saga never started"
        return migration_problem(fold(source, events), source, goal)
    except (WireError, DomainError) as error:
        return f"its history does not fold: {type(error).__name__}: {error}"


async def start(jobs: BulkJobStore, registry: DefinitionRegistry, saga_type: str, from_version: int,
                to_version: int, *, operator: str, reason: str,
                rate_per_s: float = bulk_jobs.DEFAULT_RATE_PER_S) -> BulkJob:
    """Record the bulk job that pulls Migrate to ``to_version`` on each saga of ``saga_type`` still on
    ``from_version`` (``selection``); BulkJobError when it cannot be, or nothing matches."""
    target(registry, saga_type, from_version, to_version)
    return await bulk_jobs.start(jobs, selection(saga_type, from_version), registry, action=Lever.MIGRATE,
                                 operator=operator, reason=reason, rate_per_s=rate_per_s,
                                 definition_version=to_version)


@dataclass(frozen=True)
class Outcome:
    """What a migration job's levers did so far: the sagas they moved and those that refused them, with why."""

    migrated: list[str]
    refused: list[tuple[str, str]]

    @property
    def answered(self) -> int:
        """How many of the job's levers were decided."""
        return len(self.migrated) + len(self.refused)


async def outcome(reads: ReadsStore, job: BulkJob, saga_ids: Sequence[str]) -> Outcome:
    """What ``job``'s levers did to ``saga_ids`` (the sagas it may have sent them to), read from their
    histories: each SagaMigrated or OperatorActionRefused of a Migrate pulled by the job."""
    operator = bulk_jobs.job_operator(job.operator, job.id)
    migrated: list[str] = []
    refused: list[tuple[str, str]] = []
    for row in await reads.events_of(saga_ids, (ev.SagaMigrated.__name__, ev.OperatorActionRefused.__name__)):
        event = wire.decode_event(row.body)
        if isinstance(event, ev.SagaMigrated) and event.operator == operator:
            migrated.append(event.saga_id)
        elif (isinstance(event, ev.OperatorActionRefused) and event.operator == operator
              and event.action == Lever.MIGRATE):
            refused.append((event.saga_id, event.reason))
    return Outcome(migrated, refused)
