"""``saga definitions migrate TYPE --from V --to W``: move the running sagas of a type to another deployed version,
as a bulk job of the Migrate lever the orchestrator decides saga by saga (``operations.definition_migration``).

``--dry-run`` lists each saga the job would take with ``would migrate`` or ``refused: why``, decided by the same
check the orchestrator applies, on the saga's stored history, and changes nothing. Without it the job is recorded,
its progress printed while the orchestrator sends the levers, and once each lever was decided (or ``--wait`` ran
out) the summary: "N migrated, M refused", each refusal with its saga and why. Exit code 0 when the job ran, also
when some sagas refused (their histories say why, and they go on on their version); 2 when it could not start.
"""

from __future__ import annotations

import asyncio
import time

import typer

from ..operations import bulk_jobs, definition_migration
from ..operations.bulk_jobs import BulkJobError
from ..operations.definition_migration import Outcome, Planned
from ..operations.postgres import bulk_job_store, reads_store
from .context import OPERATOR_HELP, console, database, deployed_definitions, fail, operator_or_login, run, settings

POLL_S = 0.5
"""How often the job's progress and its sagas' answers are read."""


def migrate(
    saga_type: str = typer.Argument(..., metavar="TYPE", help="The saga type whose sagas move."),
    from_version: int = typer.Option(..., "--from", help="The version the sagas run on now."),
    to_version: int = typer.Option(..., "--to", help="The deployed version they move to."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only say what each saga would do; change nothing."),
    operator: str | None = typer.Option(None, "--operator", help=OPERATOR_HELP),
    reason: str | None = typer.Option(None, "--reason", help="Why; recorded in every saga's history "
                                                             "(default: the versions moved between)."),
    rate: float = typer.Option(bulk_jobs.DEFAULT_RATE_PER_S, "--rate", help="At most this many sagas a second."),
    wait: float = typer.Option(60.0, "--wait", help="Seconds to wait for the sagas' answers after the job sent "
                                                    "its last lever."),
) -> None:
    """Move the sagas of TYPE that run on --from (RUNNING or COMPENSATING) to version --to, each decided by the
    orchestrator in the saga's own partition: a saga moves when what it did fits the target version, else it is
    refused (recorded, with why) and goes on on its version. Exit code 0 when the job ran, refusals included."""
    registry = deployed_definitions()
    if saga_type not in registry.types():
        fail(f"unknown saga type {saga_type!r}; known types: {', '.join(registry.types()) or 'none'}")
    who = operator_or_login(operator)
    why = reason or f"move from v{from_version} to v{to_version}"

    async def body() -> None:
        async with database(settings()) as pool:
            reads, jobs = reads_store(pool), bulk_job_store(pool)
            try:
                planned = await definition_migration.plan(reads, registry, saga_type, from_version, to_version)
                _print_plan(planned, saga_type, from_version, to_version)
                if dry_run or not planned:
                    return
                job = await definition_migration.start(jobs, registry, saga_type, from_version, to_version,
                                                       operator=who, reason=why, rate_per_s=rate)
            except BulkJobError as error:
                fail(str(error))
            console.print(f"bulk job [bold]{job.id}[/] started: {job.total} sagas; `saga bulk show {job.id}` "
                          "shows it too", highlight=False)
            ids = [item.saga_id for item in planned]
            shown = -1
            while job.status == "RUNNING":  # the orchestrator's runner sends the levers, at the job's rate
                await asyncio.sleep(POLL_S)
                found = await bulk_jobs.job(jobs, job.id)
                assert found is not None  # a job is never deleted
                job = found
                if job.done != shown:
                    console.print(f"sent {job.done} of {job.total}", highlight=False)
                    shown = job.done
            deadline = time.monotonic() + wait
            answered = await definition_migration.outcome(reads, job, ids)
            while answered.answered < job.done and time.monotonic() < deadline:
                await asyncio.sleep(POLL_S)
                answered = await definition_migration.outcome(reads, job, ids)
            _print_outcome(answered, job.done, job.status)

    run(body())


def _print_plan(planned: list[Planned], saga_type: str, from_version: int, to_version: int) -> None:
    movable = sum(1 for item in planned if item.problem is None)
    console.print(f"{len(planned)} sagas of {saga_type} run on v{from_version}: {movable} would migrate to "
                  f"v{to_version}, {len(planned) - movable} would be refused", highlight=False)
    for item in planned:
        said = "would migrate" if item.problem is None else f"refused: {item.problem}"
        console.print(f"  {item.saga_id}  {said}", highlight=False, soft_wrap=True, markup=False)


def _print_outcome(answered: Outcome, sent: int, status: str) -> None:
    for saga_id, why in sorted(answered.refused):
        console.print(f"  {saga_id}  refused: {why}", highlight=False, soft_wrap=True, markup=False)
    unanswered = sent - answered.answered
    console.print(f"{len(answered.migrated)} migrated, {len(answered.refused)} refused"
                  + (f", {unanswered} not answered yet (their histories will say)" if unanswered > 0 else "")
                  + ("" if status == "DONE" else f"; the job ended {status}"), highlight=False)
