"""``saga bulk``: count a selection of sagas, then pull a lever on all of them as a job the orchestrator runs."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import typer
from rich.table import Table

from ..operations import bulk_jobs
from ..operations.bulk_jobs import DEFAULT_RATE_PER_S, BulkJob, BulkJobError, Selection
from ..operations.ports import BulkJobStore
from ..operations.postgres import bulk_job_store
from .context import console, database, deployed_definitions, fail, print_json, run, settings
from .inspect_cmd import parse_duration, when

T = TypeVar("T")

JSON_TIMES = "times as epoch milliseconds (*_ms), the selection as the job records it."

bulk_app = typer.Typer(no_args_is_help=True, help="Bulk operations: count a selection of sagas, then pull a lever "
                                                  "on all of them as a job the orchestrator runs, at a rate.")

TYPE = typer.Option(None, "--type", help="Only sagas of this type.")
STATE = typer.Option(None, "--state", help="Only sagas in this state (repeat for several), e.g. RUNNING.")
OLDER_THAN = typer.Option(None, "--older-than", help="Not updated for this long: 90s, 15m, 2h, 7d.")
TENANT = typer.Option(None, "--tenant", help="Only this tenant's sagas.")
ERROR = typer.Option(None, "--error", help="Only sagas whose current step last failed with this error type "
                                           "('timeout' for a timeout).")
PARTICIPANT = typer.Option(None, "--participant", help="Only sagas whose current step this participant serves.")


def _selection(saga_type: str | None, states: list[str] | None, older_than: str | None, tenant: str | None,
               error: str | None, participant: str | None) -> Selection:
    age_s = parse_duration(older_than) / 1000 if older_than is not None else None
    return _checked(lambda: Selection(saga_type=saga_type, statuses=tuple(states or ()), older_than_s=age_s,
                                      tenant=tenant, error=error, participant=participant))


def _checked(make: Callable[[], T]) -> T:
    try:
        return make()
    except BulkJobError as error:
        fail(str(error))


def _with_store(work: Callable[[BulkJobStore], Awaitable[T]]) -> T:
    async def body() -> T:
        async with database(settings()) as pool:
            try:
                return await work(bulk_job_store(pool))
            except BulkJobError as error:
                fail(str(error))

    return run(body())


@bulk_app.command("count")
def count(saga_type: str | None = TYPE, state: list[str] | None = STATE, older_than: str | None = OLDER_THAN,
          tenant: str | None = TENANT, error: str | None = ERROR, participant: str | None = PARTICIPANT,
          as_json: bool = typer.Option(False, "--json", help="As one JSON object: the selection, the total and the "
                                                             "first ids.")) -> None:
    """The dry run: how many sagas the selection matches now, and the first few ids. Changes nothing."""
    selection = _selection(saga_type, state, older_than, tenant, error, participant)
    registry = deployed_definitions()
    found = _with_store(lambda store: bulk_jobs.count(store, selection, registry))
    if as_json:
        print_json({"selection": selection.to_json(), "total": found.total, "sample": found.sample})
        return
    console.print(f"{found.total} sagas match ({selection.describe()})")
    if found.sample:
        more = f" and {found.total - len(found.sample)} more" if found.total > len(found.sample) else ""
        console.print(f"  {', '.join(found.sample)}{more}", highlight=False, soft_wrap=True)


@bulk_app.command("start")
def start(
    action: str = typer.Argument(..., help="The action: "
                                           + ", ".join(bulk_jobs.kebab_name(name) for name in bulk_jobs.actions())
                                           + "."),
    saga_type: str | None = TYPE, state: list[str] | None = STATE, older_than: str | None = OLDER_THAN,
    tenant: str | None = TENANT, error: str | None = ERROR, participant: str | None = PARTICIPANT,
    operator: str = typer.Option(..., "--operator", help="Who is acting; recorded with the job and in every saga."),
    reason: str = typer.Option(..., "--reason", help="Why; recorded with the job and in every saga."),
    step: str | None = typer.Option(None, "--step", help="The step, for retry-now and skip."),
    rate: float = typer.Option(DEFAULT_RATE_PER_S, "--rate", help="At most this many sagas a second."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Start without asking (after printing the count)."),
) -> None:
    """Count the selection, ask, then record a job the orchestrator runs: the lever pulled on each saga that
    still matches, in saga id order, at most --rate a second; refused when the selection matches another number
    of sagas by then (count again). `saga bulk show ID` follows it."""
    selection = _selection(saga_type, state, older_than, tenant, error, participant)
    lever = _checked(lambda: bulk_jobs.action_named(action))
    _checked(lambda: bulk_jobs.check_job(lever, step, operator, reason, rate))
    registry = deployed_definitions()
    found = _with_store(lambda store: bulk_jobs.count(store, selection, registry))
    if not found.total:
        fail(f"no saga matches ({selection.describe()}): there is nothing to do", code=1)
    console.print(f"{found.total} sagas match ({selection.describe()}); {lever}"
                  f"{' ' + step if step else ''} on each, at most {rate:g} a second, as {operator}")
    if not yes and not typer.confirm("start the bulk job?"):
        raise typer.Exit(1)
    started = _with_store(lambda store: bulk_jobs.start_counted(store, selection, registry, expected=found.total,
                                                                action=lever, operator=operator, reason=reason,
                                                                step=step, rate_per_s=rate))
    console.print(f"bulk job [bold]{started.id}[/] started: {started.total} sagas; `saga bulk show {started.id}` "
                  "shows its progress")


@bulk_app.command("list")
def list_jobs(limit: int = typer.Option(20, "--limit", min=1, help="At most this many jobs, newest first."),
              as_json: bool = typer.Option(False, "--json", help="One JSON object per job; " + JSON_TIMES)) -> None:
    """The latest bulk jobs: who started them, on what, and how far they got."""
    found = _with_store(lambda store: bulk_jobs.jobs(store, limit))
    if as_json:
        for job in found:
            print_json(job.to_json())
        return
    table = Table("job", "status", "action", "selection", "done", "total", "refused", "operator", "started (UTC)")
    for job in found:
        table.add_row(str(job.id), job.status, _action(job), _selected(job), str(job.done), str(job.total),
                      str(job.refused), job.operator, when(job.created_at_ms))
    console.print(table if found else "no bulk jobs")


@bulk_app.command("show")
def show(job_id: int = typer.Argument(..., help="The job's id (`saga bulk list`)."),
         as_json: bool = typer.Option(False, "--json", help="As one JSON object; " + JSON_TIMES)) -> None:
    """One bulk job: what it does, to which selection, who started it, and its progress."""
    found = _with_store(lambda store: bulk_jobs.job(store, job_id))
    if found is None:
        fail(f"no bulk job {job_id} (`saga bulk list` shows the jobs)")
    if as_json:
        print_json({**found.to_json(), "recorded_as": bulk_jobs.job_operator(found.operator, found.id)})
        return
    console.print(f"bulk job [bold]{found.id}[/]: [bold]{found.status}[/] — {_action(found)} on {_selected(found)}")
    console.print(f"started {when(found.created_at_ms)} by {found.operator}: {found.reason}", highlight=False)
    console.print(f"done {found.done} of {found.total}" + (f", {found.failed} failed" if found.failed else "")
                  + (f", {found.refused} refused by their saga" if found.refused else "")
                  + f"; at most {found.rate_per_s:g} a second; last saga {found.last_saga_id or '-'}",
                  highlight=False)
    if found.finished_at_ms is not None:
        console.print(f"ended {when(found.finished_at_ms)}"
                      + (f", cancelled by {found.cancelled_by}" if found.cancelled_by else "")
                      + (f": {found.error}" if found.error else ""), highlight=False)
    console.print(f"each saga's history records it as {bulk_jobs.job_operator(found.operator, found.id)!r}, "
                  "or why it could not apply", style="dim")


@bulk_app.command("cancel")
def cancel(job_id: int = typer.Argument(..., help="A RUNNING job."),
           operator: str = typer.Option(..., "--operator", help="Who is acting; recorded with the job.")) -> None:
    """Stop a running job: no further saga is sent its command (those sent stay sent)."""
    cancelled = _with_store(lambda store: bulk_jobs.cancel(store, job_id, operator))
    console.print(f"bulk job [bold]{job_id}[/] cancelled after {cancelled.done} of {cancelled.total} sagas")


def _action(job: BulkJob) -> str:
    return f"{job.action} {job.step}" if job.step else job.action


def _selected(job: BulkJob) -> str:
    return job.selection.describe() if job.selection is not None else "(a selection this version cannot read)"
