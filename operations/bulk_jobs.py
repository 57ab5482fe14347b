"""Bulk operations: one lever pulled on every saga of a selection, as a recorded job the orchestrator runs.

An operator counts first what a ``Selection`` matches in the read model (``count``: the dry run, with a few of the
saga ids), then starts a job giving back the total seen (``start_counted``: a bulk start needs its count first, and
is refused when the selection matches another number now; ``counted_problem`` is that rule, the console's page, its
API and the command line all go through it), and ``start`` records it: a row of ``<schema>.bulk_jobs`` recording
who, why, the action, the selection, the rate and how many sagas matched then. The orchestrator runs the jobs, not
the operator's laptop: every instance runs the chore ``BulkRunner.chore``, which takes a RUNNING job that is due (a
row lock, SKIP LOCKED: one instance works one job at a time), the next sagas matching its selection after its
cursor in saga id order, and in ONE transaction queues one control command per saga in the orchestrator's outbox
(the relay publishes it on saga.control like any operator's) and moves the job's cursor, its done count and the
time its next batch may go. A restart goes on after the last saga handled, and no saga is sent a job's command
twice (each also carries a message id of its own, ``bulk_message_id``, which the orchestrator's inbox dedupes).

Each command names the operator as ``"<operator> (bulk job <id>)"`` with the job's reason, so each saga's own
history records who pulled the lever and why, or why it could not apply (``OperatorActionRefused``). The
selection is evaluated again for every batch: a saga that left it meanwhile (it ended, moved on) is passed
over, and a saga that started after the job is never in it. ``total`` stays what matched at the start.

Rate limit: a job sends at most ``rate`` sagas per second, in batches of a quarter second's worth (at least one
saga); a batch of ``n`` holds the job's next one back ``n / rate`` seconds, measured by the database's clock
(the outbox rows' ``created_at``), and kept across restarts (``not_before``).

The public functions take the store port (``operations.ports.BulkJobStore``: ``PostgresBulkJobs`` on the
orchestrator's database, ``MemoryBulkJobs`` for the test kit) and raise ``BulkJobError`` with a line an operator
can act on; the command line and the HTTP API call them.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..infra.chores import Chore
from ..orchestrator.domain.definition import DefinitionRegistry
from ..orchestrator.domain.model import SagaStatus
from ..outbox.table import OutboxMessage
from ..schemas import wire
from ..schemas.codec import WireError
from ..schemas.ids import bulk_message_id
from ..schemas.limits import MAX_TEXT_CHARS
from ..schemas.message_types import SAGA_ACTIONS, STEP_LEVERS, Lever, action_name, control_command
from ..schemas.topics import Topics
from .levers import control_row, control_shards
from .ports import BulkJobStore, SagaFilter

log = logging.getLogger("saga.orchestrator.bulk")

MAX_AGE_S = 100 * 365 * 86_400.0  # an age past this is a typo (and past what an interval holds: inf, 1e300)

DEFAULT_RATE_PER_S = 10.0
MAX_RATE_PER_S = 1_000.0
ROUND_S = 0.25
"""A batch is this long's worth of the job's rate (at least one saga)."""
MAX_BATCH = 250
SAMPLE = 10
"""How many saga ids a dry run shows."""
IDLE_POLL_S = 2.0
"""How often the runner looks for a job when none is running (a job starts within this long)."""
MIN_WAIT_S = 0.01


class BulkJobError(ValueError):
    """A selection, a job or an action that cannot be: the message says what to change."""


class NoSuchJob(BulkJobError):
    """The job asked for does not exist (a face answers it as not found)."""


class NotCounted(BulkJobError):
    """A job asked for without the count of its sagas (a face answers it 422: the request lacks the count)."""


class CountChanged(BulkJobError):
    """A job whose selection matches another number of sagas than its operator counted (a face answers it 409)."""


COUNT_FIRST = ("count the sagas first (the dry run: Count on the console's Bulk jobs page, POST /api/v1/bulk/count, "
               "or `saga bulk count`) and give the total you saw as `expected`: a job starts only once its operator "
               "saw how many sagas it takes")


def counted_problem(expected: int | None, now: int) -> BulkJobError | None:
    """The rule "a bulk start needs its count first": why a job whose operator saw ``expected`` sagas counted
    (None: saw no count) may not start while its selection matches ``now`` (None: it may)."""
    if expected is None:
        return NotCounted(COUNT_FIRST)
    if expected != now:
        return CountChanged(f"the selection matches {now} sagas now, not the {expected} counted: count again "
                            "and give the new total as `expected`")
    return None


def actions() -> tuple[str, ...]:
    """Every action a job may take: what an operator may pull on a saga (``message_types.SAGA_ACTIONS``), and
    Migrate (``saga definitions migrate``: with the version it moves to)."""
    return (*SAGA_ACTIONS, Lever.MIGRATE.value)


def action_named(name: str) -> str:
    """The action ``name`` stands for: its own spelling (``RetryNow``) or the command line's (``retry-now``)."""
    spelled = {action.lower(): action for action in actions()}
    found = spelled.get(name.replace("-", "").replace("_", "").lower())
    if found is None:
        raise BulkJobError(f"unknown action {name!r}; use one of {', '.join(kebab_name(a) for a in actions())}")
    return found


def kebab_name(action: str) -> str:
    """How the command line spells ``action``: ``RetryNow`` -> ``retry-now``."""
    return action_name(action, "-")


# --- the selection ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """Which sagas a bulk operation takes, from the read model (``saga.saga_summary``); every criterion given
    must hold, and at least one must be given.

    ``statuses``: any of these; ``older_than_s``: not updated for this long; ``error``: the latest error type of
    the step the saga is stuck on (``last_error``; ``timeout`` for a timeout); ``participant``: the step it is
    stuck on or waits for (``current_step``) is that participant's, by the saga type's definitions;
    ``definition_version``: on that version of its type (needs the type).
    """

    saga_type: str | None = None
    statuses: tuple[str, ...] = ()
    older_than_s: float | None = None
    tenant: str | None = None
    error: str | None = None
    participant: str | None = None
    definition_version: int | None = None

    def __post_init__(self) -> None:
        statuses = tuple(sorted({status.strip().upper() for status in self.statuses}))
        known = {status.value for status in SagaStatus}
        for status in statuses:
            if status not in known:
                raise BulkJobError(f"{status!r} is not a saga state; use one of {', '.join(sorted(known))}")
        object.__setattr__(self, "statuses", statuses)
        if self.older_than_s is not None and not 0 < self.older_than_s <= MAX_AGE_S:
            raise BulkJobError(f"older than {self.older_than_s} s: an age must be positive and at most "
                               f"{MAX_AGE_S:g} s (100 years)")
        for name in ("saga_type", "tenant", "error", "participant"):
            value = getattr(self, name)
            if value is not None and not value.strip():
                raise BulkJobError(f"{name} must not be empty when given")
        if self.definition_version is not None and self.saga_type is None:
            raise BulkJobError("a definition version is one of a saga type: name the type too")
        if not (self.saga_type or statuses or self.older_than_s or self.tenant or self.error or self.participant):
            raise BulkJobError("a selection needs at least one of: saga type, state, age, tenant, error, participant")

    def to_json(self) -> dict[str, Any]:
        """The selection as a JSON object (what ``saga.bulk_jobs.selection`` holds), without what is not given."""
        values = {"saga_type": self.saga_type, "statuses": list(self.statuses) or None,
                  "older_than_s": self.older_than_s, "tenant": self.tenant, "error": self.error,
                  "participant": self.participant, "definition_version": self.definition_version}
        return {name: value for name, value in values.items() if value is not None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Selection:
        """The selection ``to_json`` wrote; BulkJobError for anything else."""
        try:
            return cls(saga_type=data.get("saga_type"), statuses=tuple(data.get("statuses") or ()),
                       older_than_s=data.get("older_than_s"), tenant=data.get("tenant"), error=data.get("error"),
                       participant=data.get("participant"), definition_version=data.get("definition_version"))
        except (TypeError, AttributeError) as error:
            raise BulkJobError(f"not a selection: {dict(data)!r} ({error})") from None

    def describe(self) -> str:
        """The selection in one line, e.g. ``type trip, state RUNNING, not updated for 7200 s``."""
        parts = [f"type {self.saga_type}" if self.saga_type else "",
                 f"version {self.definition_version}" if self.definition_version is not None else "",
                 f"state {' or '.join(self.statuses)}" if self.statuses else "",
                 f"not updated for {self.older_than_s:g} s" if self.older_than_s else "",
                 f"tenant {self.tenant}" if self.tenant else "", f"error {self.error}" if self.error else "",
                 f"stuck at participant {self.participant}" if self.participant else ""]
        return ", ".join(part for part in parts if part)


@dataclass(frozen=True)
class Criteria:
    """A selection resolved against the deployment's definitions, what a store evaluates: ``steps``, the (saga
    type, step) pairs its participant serves (None: no participant given)."""

    selection: Selection
    steps: tuple[tuple[str, str], ...] | None = None

    @property
    def filter(self) -> SagaFilter:
        """The read model's filter these criteria put (what a listing of the same selection takes)."""
        s = self.selection
        return SagaFilter(saga_type=s.saga_type, statuses=s.statuses, older_than_s=s.older_than_s, tenant=s.tenant,
                          error=s.error, steps=self.steps, definition_version=s.definition_version)


def criteria(selection: Selection, registry: DefinitionRegistry) -> Criteria:
    """``selection`` resolved; BulkJobError for a saga type or a participant ``registry`` does not know."""
    if selection.saga_type is not None and selection.saga_type not in registry.types():
        raise BulkJobError(f"unknown saga type {selection.saga_type!r}; known types: "
                           f"{', '.join(registry.types()) or 'none'}")
    steps = None if selection.participant is None else tuple(participant_steps(registry, selection.participant))
    return Criteria(selection, steps)


def participant_steps(registry: DefinitionRegistry, participant: str) -> list[tuple[str, str]]:
    """The (saga type, step) pairs whose step ``participant`` serves, in any registered version; BulkJobError
    naming the known participants when there is none."""
    pairs = sorted({(definition.saga_type, step.name) for definition in registry.definitions()
                    for step in definition.steps if step.participant == participant and not step.waits})
    if not pairs:
        known = sorted({step.participant for definition in registry.definitions() for step in definition.steps
                        if not step.waits})
        raise BulkJobError(f"no saga type has a step served by participant {participant!r}; "
                           f"known participants: {', '.join(known) or 'none'}")
    return pairs


# --- the commands ----------------------------------------------------------------------------------------


def job_operator(operator: str, job_id: int) -> str:
    """Who a job's commands name as the operator: the job's operator, and the job."""
    return f"{operator} (bulk job {job_id})"


def command_row(topics: Topics, job_id: int, saga_id: str, saga_type: str, value: bytes) -> OutboxMessage:
    """The outbox row that sends job ``job_id``'s command ``value`` to saga ``saga_id`` on saga.control."""
    return control_row(topics, saga_id, value, bulk_message_id(job_id, saga_id), f"bulk-job:{job_id}", saga_type)


def batch_size(rate_per_s: float) -> int:
    """How many sagas one batch of a job at ``rate_per_s`` takes: a quarter second's worth, at least one."""
    return max(1, min(MAX_BATCH, math.floor(rate_per_s * ROUND_S)))


def check_job(action: str, step: str | None, operator: str, reason: str, rate_per_s: float,
              definition_version: int | None = None) -> None:
    """BulkJobError unless a job with these may start: a known action (with its step when it acts on one, with
    the version it moves to for a Migrate and only then), an operator and a reason (each short enough to be
    recorded), and a rate in (0, MAX_RATE_PER_S]."""
    if action not in actions():
        raise BulkJobError(f"unknown action {action!r}; use one of {', '.join(actions())}")
    if action == Lever.MIGRATE and definition_version is None:
        raise BulkJobError(f"{Lever.MIGRATE} moves sagas to a version: `saga definitions migrate TYPE --from V --to W`")
    if action != Lever.MIGRATE and definition_version is not None:
        raise BulkJobError(f"only {Lever.MIGRATE} names a definition version, not {action}")
    if action in STEP_LEVERS and not (step and step.strip()):
        raise BulkJobError(f"{action} acts on one step: name it (--step)")
    if not operator.strip():
        raise BulkJobError("a bulk job needs an operator: who is acting, recorded in every saga's history")
    if not reason.strip():
        raise BulkJobError("a bulk job needs a reason, recorded in every saga's history")
    if len(reason) > MAX_TEXT_CHARS or len(job_operator(operator, 10**12)) > MAX_TEXT_CHARS:
        raise BulkJobError(f"the operator and the reason are recorded in each saga: at most {MAX_TEXT_CHARS} "
                           "characters each")
    if not 0 < rate_per_s <= MAX_RATE_PER_S:
        raise BulkJobError(f"rate {rate_per_s:g}/s: give a rate above 0 and at most {MAX_RATE_PER_S:g} sagas/s")


# --- the jobs --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Count:
    """What a selection matches now: how many sagas, and the first few ids (in saga id order)."""

    total: int
    sample: list[str]


@dataclass(frozen=True)
class BulkJob:
    """One bulk job as recorded (times in epoch ms). ``done``: sagas sent the command; ``failed``: sagas matched
    whose command could not be written; ``refused``: sagas sent the command that refused it (the lever did not
    apply as the saga stood: its history says why); ``last_saga_id``: the last saga handled (sagas go in id
    order)."""

    id: int
    operator: str
    reason: str
    action: str
    step: str | None
    selection: Selection | None  # None: the row holds no selection this version reads (the job FAILED on it)
    rate_per_s: float
    status: str
    total: int
    done: int
    failed: int
    refused: int
    last_saga_id: str
    error: str | None
    created_at_ms: int
    updated_at_ms: int
    finished_at_ms: int | None
    cancelled_by: str | None
    definition_version: int | None = None  # the version a Migrate job moves its sagas to

    def to_json(self) -> dict[str, Any]:
        """The job as a JSON object (the selection as ``Selection.to_json``)."""
        values = dict(self.__dict__)
        values["selection"] = None if self.selection is None else self.selection.to_json()
        return values


@dataclass(frozen=True)
class NewJob:
    """A job as an operator asks for it (checked by ``check_job``)."""

    action: str
    step: str | None
    operator: str
    reason: str
    rate_per_s: float
    definition_version: int | None = None  # a Migrate's target version


async def count(store: BulkJobStore, selection: Selection, registry: DefinitionRegistry,
                sample: int = SAMPLE) -> Count:
    """The dry run: how many sagas ``selection`` matches now, and the first ``sample`` of their ids."""
    return await store.count(criteria(selection, registry), sample)


async def start(store: BulkJobStore, selection: Selection, registry: DefinitionRegistry, *, action: str,
                operator: str, reason: str, step: str | None = None,
                rate_per_s: float = DEFAULT_RATE_PER_S, definition_version: int | None = None) -> BulkJob:
    """Record a RUNNING job that pulls ``action`` (``actions()``) on every saga ``selection`` matches, at most
    ``rate_per_s`` a second; ``total`` is the count at this moment (in the same transaction). The orchestrator's
    runner takes it within ``IDLE_POLL_S``. BulkJobError when the job cannot be, or nothing matches.
    ``definition_version``: the version a Migrate moves the sagas to."""
    check_job(action, step, operator, reason, rate_per_s, definition_version)
    started = await store.create(NewJob(action, step, operator, reason, rate_per_s, definition_version),
                                 criteria(selection, registry))
    if started is None:
        raise BulkJobError(f"no saga matches ({selection.describe()}): there is nothing to do")
    log.info("bulk job started", extra={"job": started.id, "operator": operator, "action": action,
                                        "selection": selection.describe(), "total": started.total})
    return started


async def start_counted(store: BulkJobStore, selection: Selection, registry: DefinitionRegistry, *,
                        expected: int | None, action: str, operator: str, reason: str, step: str | None = None,
                        rate_per_s: float = DEFAULT_RATE_PER_S) -> BulkJob:
    """``start``, for an operator who counted the selection first (``count``) and saw ``expected`` sagas:
    NotCounted when ``expected`` is None, CountChanged when the selection matches another number now
    (``counted_problem``). The count is taken again just before the job is recorded."""
    check_job(action, step, operator, reason, rate_per_s)
    found = await count(store, selection, registry, sample=0)
    problem = counted_problem(expected, found.total)
    if problem is not None:
        raise problem
    return await start(store, selection, registry, action=action, operator=operator, reason=reason, step=step,
                       rate_per_s=rate_per_s)


async def jobs(store: BulkJobStore, limit: int = 50) -> list[BulkJob]:
    """The latest ``limit`` jobs, newest first."""
    return await store.jobs(limit)


async def job(store: BulkJobStore, job_id: int) -> BulkJob | None:
    """Job ``job_id`` as it stands, or None when there is no such job."""
    return await store.job(job_id)


async def cancel(store: BulkJobStore, job_id: int, operator: str) -> BulkJob:
    """Stop a RUNNING job, recording ``operator`` as who did: no batch after this one is sent (a batch being
    sent right now is finished first). NoSuchJob for an unknown job, BulkJobError for one that already ended."""
    if not operator.strip():
        raise BulkJobError("cancelling a bulk job needs an operator: who is acting, recorded with the job")
    cancelled = await store.cancel(job_id, operator)
    if cancelled is None:
        found = await store.job(job_id)
        if found is None:
            raise NoSuchJob(f"no bulk job {job_id} (`saga bulk list` shows the jobs)")
        raise BulkJobError(f"bulk job {job_id} already ended {found.status}: there is nothing to cancel")
    log.info("bulk job cancelled", extra={"job": job_id, "operator": operator, "done": cancelled.done})
    return cancelled


# --- the runner ------------------------------------------------------------------------------------------


class BulkRunner:
    """Works the RUNNING jobs, a batch per transaction (see the module's docstring); any number of instances
    may run one each. ``topic_partitions``: the partition count of saga.control, which puts each command in its
    saga's outbox shard (None: shard 0); ``on_queued``: told after a batch queued commands (an in-process
    relay's ``wake``). It is the ``BatchWork`` its store calls inside the batch's transaction."""

    def __init__(self, store: BulkJobStore, registry: DefinitionRegistry, topics: Topics,
                 topic_partitions: int | None = None, on_queued: Callable[[], None] | None = None) -> None:
        self._store = store
        self._registry = registry
        self._topics = topics
        self._partitions = tuple(range(topic_partitions)) if topic_partitions else None
        self._on_queued = on_queued
        self._next_round_s = IDLE_POLL_S

    def chore(self) -> Chore:
        """The chore that runs the jobs: a round works every due job, the next round comes when the earliest
        running job is due (at most ``IDLE_POLL_S`` later)."""
        return Chore("bulk jobs", self.work, IDLE_POLL_S, next_round_s=lambda: self._next_round_s)

    async def work(self) -> int:
        """Send one batch of each job that is due, again until none is; how many sagas were sent commands."""
        sent = 0
        while (batch := await self.run_batch()) is not None:
            sent += batch
        wait_s = await self._store.seconds_to_next()
        self._next_round_s = IDLE_POLL_S if wait_s is None else min(IDLE_POLL_S, max(MIN_WAIT_S, wait_s))
        return sent

    async def run_batch(self) -> int | None:
        """Send the next batch of one job that is due, in one transaction; how many sagas were sent its command
        (None: no job was due)."""
        sent = await self._store.run_batch(self)
        if sent and self._on_queued is not None:
            self._on_queued()
        return sent

    def criteria(self, job: BulkJob) -> Criteria:
        """What ``job`` selects, resolved; BulkJobError fails the job (the store records it)."""
        if job.selection is None:
            raise BulkJobError(f"bulk job {job.id} holds a selection this version cannot read")
        return criteria(job.selection, self._registry)

    def size(self, job: BulkJob) -> int:
        """How many sagas ``job``'s next batch takes."""
        return batch_size(job.rate_per_s)

    def commands(self, job: BulkJob, sagas: Sequence[tuple[str, str]]) -> list[OutboxMessage]:
        """The outbox rows of ``job``'s command to each of ``sagas`` ((saga id, saga type)); a saga whose command
        cannot be written is passed over (and counted failed)."""
        operator = job_operator(job.operator, job.id)
        messages = []
        for saga_id, saga_type in sagas:
            try:
                value = wire.encode_control(control_command(job.action, saga_id, job.step, operator, job.reason,
                                                            job.definition_version))
            except WireError as error:
                log.warning("bulk job passed a saga over: its command cannot be written",
                            extra={"job": job.id, "saga_id": saga_id, "error": str(error)})
                continue
            messages.append(command_row(self._topics, job.id, saga_id, saga_type, value))
        return messages

    def shards(self, messages: Sequence[OutboxMessage]) -> list[int]:
        """The outbox shard of each command (its saga's partition of saga.control)."""
        return control_shards(messages, self._partitions)

    def ended(self, job: BulkJob, error: str | None) -> None:
        """Told when a batch ended ``job`` (DONE, or FAILED with ``error``), for the log."""
        if error is not None:
            log.warning("bulk job failed", extra={"job": job.id, "error": error})
        else:
            log.info("bulk job done", extra={"job": job.id, "done": job.done, "failed": job.failed,
                                             "total": job.total})
