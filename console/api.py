"""The console's HTTP API (JSON under ``/api/v1``; its OpenAPI document at ``/api/openapi.json``).

The same reads and actions as the pages: sagas listed and searched, one saga's state, history and effects, the
fleet, the definition versions with their sagas, wedged sagas, dead letters, parked outbox rows (requeued or
discarded), deferred commands, the audit, levers and bulk jobs.
Reads need what the console's identity mode asks (nothing, a proxy header, or HTTP Basic with a local login);
actions also need ``SAGA_CONSOLE_LEVERS=true``. Every action is audited.
"""

from __future__ import annotations

import base64
import dataclasses
from datetime import datetime
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
from pydantic import BaseModel, Field

from ..operations import bulk_jobs, inbox, paging, parked_rows
from ..operations.paging import Page
from ..operations.ports import AGE_BUCKETS
from ..operations.reads import SagaView
from ..operations.versions import RUNNING_STATUSES, DefinitionVersion
from ..orchestrator.domain.waits import waits
from ..orchestrator.ports import LetterFilter, SagaSummaryRow
from ..participants.kit.effects import read_effects
from ..participants.kit.outcome import Failed, Succeeded
from ..schemas.event_types import Event
from . import decisions, letter_replays, operating
from .context import Console, console_of
from .saga_paths import SAGA_PATH

router = APIRouter(prefix="/api/v1", tags=["sagas"])
T = TypeVar("T")
CURSOR_HELP = "The `X-Next-Cursor` of the previous page; the first page without."
MAX_WAIT_S = 10.0  # the longest a request waits for a lever's decision


class StepView(BaseModel):
    name: str
    participant: str | None
    status: str
    attempt: int
    compensation_attempt: int
    last_error_type: str | None
    last_error_message: str | None
    output: dict[str, Any] | None = Field(description="The step's output, decoded from Avro.")
    pivot: bool
    depends_on: list[str]
    waiting: str | None = Field(None, description="What the step waits for, since when, under which key and until "
                                                  "when (a signal, a person's answer, a worker, a participant).")


class EventView(BaseModel):
    seq: int
    type: str
    occurred_at_ms: int
    fields: dict[str, Any]


class SagaDetail(BaseModel):
    """One saga: its state folded from its events, its steps, live timers, unpublished rows, what applies."""

    saga_id: str
    saga_type: str | None
    definition_version: int | None
    status: str | None
    reason: str | None
    paused: bool
    fold_error: str | None = Field(description="Why its history does not fold here (a quarantined saga, say).")
    search_keys: dict[str, str]
    steps: list[StepView]
    timers: list[dict[str, Any]]
    unpublished: list[dict[str, Any]]
    actions: list[dict[str, Any]] = Field(description="The levers the orchestrator would apply now.")


class Fleet(BaseModel):
    buckets: list[str]
    counts: list[dict[str, Any]] = Field(description="One row per saga type and state: a count per age bucket.")
    by_status: dict[str, int]
    oldest: list[SagaSummaryRow]
    compensation_rate_hour: float | None
    compensation_rate_day: float | None
    ended_hour: int
    ended_day: int


class ShapeView(BaseModel):
    fingerprint: str | None = Field(description="The shape its sagas started on; null: not recorded.")
    running: int
    ended: int


class DefinitionView(BaseModel):
    """One version of a saga type: deployed here, or only named by sagas that started on it."""

    saga_type: str
    version: int | None = Field(description="null: sagas started before versions were recorded (`saga reproject`).")
    deployed: bool
    draining: bool = Field(description="Deployed but taking no new starts (SAGA_DRAINING): its sagas go on to "
                                       "their end.")
    input_schema: str | None
    fingerprint: str | None = Field(description="The deployed definition's shape.")
    running: int = Field(description=f"Sagas a decision may still move on: {', '.join(sorted(RUNNING_STATUSES))}.")
    ended: int = Field(description="Sagas in any other state.")
    shapes: list[ShapeView] = Field(description="The same counts per shape its sagas started on.")


def definition_view(version: DefinitionVersion) -> DefinitionView:
    definition, counts = version.definition, version.counts
    return DefinitionView(
        saga_type=version.saga_type, version=version.version, deployed=version.deployed, draining=version.draining,
        input_schema=definition.input_schema if definition else None,
        fingerprint=definition.fingerprint if definition else None,
        running=counts.running if counts else 0, ended=counts.ended if counts else 0,
        shapes=[ShapeView(fingerprint=s.fingerprint, running=s.running, ended=s.ended) for s in counts.shapes]
        if counts else [])


class ActionRequest(BaseModel):
    """A lever on one saga: ``action`` (RetryNow, Skip, ForceCompensate, Terminate, Pause, Unpause, Redrive, Cancel,
    Release, Resume), ``step`` for RetryNow and Skip, ``reason`` (needed by Skip, ForceCompensate, Terminate and
    Cancel). The operator is who the console knows is asking, never a field."""

    action: str
    step: str | None = None
    reason: str | None = None


class ActionResult(BaseModel):
    saga_id: str
    action: str
    operator: str
    published: bool = Field(description="Queued for saga.control; ``decision`` says whether it applied.")
    action_id: str = Field(description="The control command's message id.")
    after_seq: int = Field(description="The saga's last event when the lever was pulled: its decision comes after.")
    decision: dict[str, Any] = Field(description="What the orchestrator decided so far: outcome (applied, refused, "
                                                 "queued or sent), decided, reason (why refused), seq (the event "
                                                 "that decided it), followed (the events that came of it).")
    decision_url: str = Field(description="Where the decision is read again (GET).")


def event_view(event: Event) -> EventView:
    fields = {f.name: _plain(getattr(event, f.name)) for f in dataclasses.fields(event)
              if f.name not in ("saga_id", "seq", "occurred_at")}
    return EventView(seq=event.seq, type=type(event).__name__, occurred_at_ms=event.occurred_at, fields=fields)


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def detail(view: SagaView, keys: dict[str, str], console: Console) -> SagaDetail:
    state, definition = view.state, view.definition
    steps = []
    if state is not None:
        waiting = {wait.step: wait.describe() for wait in
                   (waits(definition, state, view.events, view.persons) if definition is not None else [])}
        for name, step in state.steps.items():
            declared = definition.step(name) if definition is not None else None
            steps.append(StepView(
                name=name, participant=declared.participant if declared else None, status=step.status.value,
                attempt=step.attempt, compensation_attempt=step.compensation_attempt,
                last_error_type=step.last_error_type, last_error_message=step.last_error_message,
                output=view.output_of(name, console.reads.schemas), pivot=bool(declared and declared.pivot),
                depends_on=list(declared.depends_on) if declared else [], waiting=waiting.get(name)))
    return SagaDetail(
        saga_id=view.saga_id, saga_type=state.saga_type if state else None,
        definition_version=state.definition_version if state else None,
        status=state.status.value if state else None, reason=state.reason if state else None,
        paused=bool(state and state.paused), fold_error=view.fold_error, search_keys=keys, steps=steps,
        timers=[dataclasses.asdict(t) for t in view.timers], unpublished=[dataclasses.asdict(o) for o in view.outbox],
        actions=[dataclasses.asdict(o) for o in operating.offers(definition, state, console.now_ms())])


ConsoleDep = Annotated[Console, Depends(console_of)]


def reader(request: Request, console: ConsoleDep) -> str | None:
    """Whoever may read: refused (401) where the identity mode needs someone and nobody is known."""
    operator = console.identity.operator(request)
    if operator is None and console.identity.mode != "anonymous":
        raise HTTPException(401, "sign in: a local login (HTTP Basic) or the operator header of the proxy",
                            headers={"WWW-Authenticate": 'Basic realm="saga console"'})
    return operator


def actor(request: Request, console: ConsoleDep) -> str:
    """The operator of an action: refused (403) while levers are off, (401) when nobody is known."""
    if not console.levers:
        raise HTTPException(403, "this console is read-only: SAGA_CONSOLE_LEVERS is off")
    operator = reader(request, console)
    if operator is None:
        raise HTTPException(401, "no operator: sign in")
    return operator


Reader = Annotated[str | None, Depends(reader)]
Actor = Annotated[str, Depends(actor)]


@router.get("/sagas", response_model=list[SagaSummaryRow],
            summary="List sagas (oldest started first): those a bulk job with these criteria would take, or all",
            description="Paged by cursor: when more sagas follow, the answer's `X-Next-Cursor` header holds the "
                        "cursor of the next page and its `Link` header (`rel=\"next\"`) the next page's URL.")
async def list_sagas(request: Request, response: Response, console: ConsoleDep, _: Reader,
                     status: Annotated[list[str] | None, Query()] = None,
                     saga_type: str | None = None, tenant: str | None = None,
                     older_than_s: Annotated[float | None, Query(description="Not updated for this long.")] = None,
                     error: Annotated[str | None, Query(description="Its step fails with this error.")] = None,
                     participant: Annotated[str | None, Query(description="The step it is stuck on is this "
                                                                          "participant's.")] = None,
                     limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                     cursor: Annotated[str | None, Query(description=CURSOR_HELP)] = None) -> list[SagaSummaryRow]:
    criteria = SelectionRequest(saga_type=saga_type, statuses=status or [], older_than_s=older_than_s,
                                tenant=tenant, error=error, participant=participant)
    given = criteria.model_dump(exclude_defaults=True)
    try:
        page = await console.reads.saga_page(criteria.selection() if given else None, limit, cursor)
    except bulk_jobs.BulkJobError as refused:
        raise HTTPException(400, str(refused)) from None
    return paged(request, response, page)


def paged(request: Request, response: Response, page: Page[T]) -> list[T]:
    """``page``'s rows; its next cursor, when there is one, in ``response``'s ``X-Next-Cursor`` and ``Link``
    headers (the request's URL with that cursor)."""
    if page.next_cursor is not None:
        following = request.url.include_query_params(cursor=page.next_cursor)
        response.headers["X-Next-Cursor"] = page.next_cursor
        response.headers["Link"] = f'<{following.path}?{following.query}>; rel="next"'
    return page.rows


@router.get("/search", response_model=list[SagaSummaryRow],
            summary="Find sagas by id, or by the start of a searchable input field's value, whatever the case "
                    "(q=value, or q=field=value); exact matches first, then the newest")
async def search(console: ConsoleDep, _: Reader, q: str,
                 tenant: Annotated[str | None, Query(description="Only this tenant's sagas.")] = None,
                 started_after: Annotated[datetime | None, Query(description="Started at or after (ISO 8601; UTC "
                                                                              "when no zone).")] = None,
                 started_before: Annotated[datetime | None, Query(description="Started before.")] = None,
                 limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> list[SagaSummaryRow]:
    return await console.reads.search(q, limit, tenant=tenant, started_after_ms=inbox.moment_ms(started_after),
                                      started_before_ms=inbox.moment_ms(started_before))


@router.get("/search/fields", response_model=dict[str, list[str]],
            summary="The input fields each deployed saga type is found by (q=field=value)")
async def search_fields(console: ConsoleDep, _: Reader) -> dict[str, list[str]]:
    return {saga_type: list(names) for saga_type, names in console.reads.searchable_fields().items()}


@router.get(SAGA_PATH, response_model=SagaDetail, summary="One saga's state")
async def get_saga(saga_id: str, console: ConsoleDep, _: Reader) -> SagaDetail:
    view = await console.reads.saga(saga_id)
    if view is None:
        raise HTTPException(404, f"no saga {saga_id!r}")
    return detail(view, await console.reads.search_keys(saga_id), console)


@router.get(f"{SAGA_PATH}/history", response_model=list[EventView], summary="One saga's events")
async def history(saga_id: str, console: ConsoleDep, _: Reader, after_seq: int = 0) -> list[EventView]:
    found = await console.reads.events_after(saga_id, after_seq)
    if not found and after_seq == 0:
        raise HTTPException(404, f"no saga {saga_id!r}")
    return [event_view(event) for _, event in found]


@router.get(f"{SAGA_PATH}/events",
            summary="One saga's events as recorded: Avro single-object encoded, base64")
async def encoded_events(saga_id: str, console: ConsoleDep, _: Reader) -> list[dict[str, Any]]:
    found = await console.reads.encoded_events(saga_id)
    if not found:
        raise HTTPException(404, f"no saga {saga_id!r}")
    return [{"seq": seq, "avro": base64.b64encode(body).decode()} for seq, body in found]


@router.get(f"{SAGA_PATH}/effects", summary="Each participant's business records of the saga")
async def effects(saga_id: str, console: ConsoleDep, _: Reader) -> dict[str, dict[str, int]]:
    declaring = [p for p in console.reads.participants if p.effects is not None]
    if not declaring:
        return {}
    found = await read_effects(console.pool, declaring, saga_id)
    return {name: dict(counts) for name, counts in found.counts().items()}


@router.get("/fleet", response_model=Fleet, summary="Sagas by type, state and age; the compensation rate")
async def fleet(console: ConsoleDep, _: Reader) -> Fleet:
    found = await console.reads.fleet()
    return Fleet(buckets=[name for name, _ in AGE_BUCKETS],
                 counts=[{"saga_type": t, "status": s, **counts} for (t, s), counts in found.counts().items()],
                 by_status=found.by_status(), oldest=found.oldest,
                 compensation_rate_hour=found.compensation_rate_hour, compensation_rate_day=found.compensation_rate_day,
                 ended_hour=found.ended_hour, ended_day=found.ended_day)


@router.get("/definitions", response_model=list[DefinitionView],
            summary="Each definition version deployed, and each version sagas started on, with how many run and ended")
async def definitions(console: ConsoleDep, _: Reader) -> list[DefinitionView]:
    return [definition_view(version) for version in await console.reads.definition_versions()]


@router.get("/wedged", summary="Unfinished sagas whose current step failed at least min_failures times, grouped")
async def wedged(console: ConsoleDep, _: Reader, min_failures: Annotated[int, Query(ge=1)] = 3) -> list[dict[str, Any]]:
    return [dataclasses.asdict(group) for group in await console.reads.wedged(min_failures)]


@router.get("/quarantined", response_model=list[SagaSummaryRow], summary="Quarantined sagas",
            description="Paged by cursor as `/sagas`.")
async def quarantined(request: Request, response: Response, console: ConsoleDep, _: Reader,
                      limit: Annotated[int, Query(ge=1, le=1000)] = 200,
                      cursor: Annotated[str | None, Query(description=CURSOR_HELP)] = None) -> list[SagaSummaryRow]:
    return paged(request, response, await console.reads.quarantined_page(limit, cursor))


@router.get("/parked", summary="Outbox rows the broker refused for good, in every outbox")
async def parked(console: ConsoleDep, _: Reader) -> list[dict[str, Any]]:
    return [dataclasses.asdict(row) for row in await console.reads.parked()]


class ParkedRequest(BaseModel):
    """A lever on a parked outbox row: ``reason`` (what was fixed, or why the row may go; needed by a discard),
    recorded with the operator. The operator is who the console knows is asking, never a field."""

    reason: str | None = None


class ParkedResult(BaseModel):
    table: str
    row_id: int
    action: str
    operator: str
    done: str = Field(description="What became of the row.")


PARKED_PATH = "/parked/{table}/{row_id}"
PARKED_404 = "no such row parked in an outbox of this deployment: nothing done"


@router.post(f"{PARKED_PATH}/requeue", response_model=ParkedResult, tags=["parked"],
             summary="Put a parked outbox row back into its outbox (its id kept: published again, ahead of its "
                     "saga's later rows); audited",
             description="`table` and `row_id` as `GET /parked` lists them (`saga.outbox_parked`, 7).",
             responses={404: {"description": PARKED_404}})
async def requeue_parked(table: str, row_id: int, console: ConsoleDep, operator: Actor,
                         request: ParkedRequest | None = None) -> ParkedResult:
    done = await console.handle_parked(operator, table, row_id, True, request.reason if request else None)
    return ParkedResult(table=table, row_id=row_id, action=parked_rows.REQUEUE, operator=operator, done=done)


@router.post(f"{PARKED_PATH}/discard", response_model=ParkedResult, tags=["parked"],
             summary="Delete a parked outbox row for good (never published; its saga's later rows go on); audited",
             description="`table` and `row_id` as `GET /parked` lists them; `reason` is needed. Nothing undoes it, "
                         "and it undoes nothing the saga did.",
             responses={404: {"description": PARKED_404}})
async def discard_parked(table: str, row_id: int, request: ParkedRequest, console: ConsoleDep,
                         operator: Actor) -> ParkedResult:
    done = await console.handle_parked(operator, table, row_id, False, request.reason)
    return ParkedResult(table=table, row_id=row_id, action=parked_rows.DISCARD, operator=operator, done=done)


@router.get("/deferred", summary="Commands whose participant deferred its answer")
async def deferred(console: ConsoleDep, _: Reader) -> list[dict[str, Any]]:
    return [dataclasses.asdict(row) for row in await console.reads.deferred()]


def inbox_query(cursor: str | None, limit: int, saga_type: str | None, kind: list[str] | None,
                stuck_after: str | None, stuck_before: str | None) -> inbox.InboxQuery:
    """The inbox query of the API's and the page's parameters (times: ISO 8601, UTC when no offset is given);
    HTTPException 400 for a kind, time or cursor that is none."""
    try:
        query = inbox.InboxQuery(kinds=inbox.kinds_of([n for k in kind or [] for n in k.split(",")]),
                                 saga_type=saga_type or None,
                                 since_ms=inbox.parse_moment_ms(stuck_after),
                                 before_ms=inbox.parse_moment_ms(stuck_before),
                                 cursor=cursor or None, limit=limit)
        if query.cursor:
            paging.decode_cursor(query.cursor)
    except ValueError as error:  # InboxError, BadCursor, or a time that is none
        raise HTTPException(400, str(error)) from None
    return query


@router.get("/inbox", summary="What needs a human, stuck longest first (paged: pass next_cursor as cursor)")
async def inbox_items(console: ConsoleDep, _: Reader, cursor: str | None = None,
                      limit: Annotated[int, Query(ge=1, le=inbox.MAX_LIMIT)] = inbox.DEFAULT_LIMIT,
                      saga_type: Annotated[str | None, Query(alias="type")] = None,
                      kind: Annotated[list[str] | None, Query()] = None, stuck_after: str | None = None,
                      stuck_before: str | None = None) -> dict[str, Any]:
    query = inbox_query(cursor, limit, saga_type, kind, stuck_after, stuck_before)
    page = await inbox.inbox(console.reads, query, console.dead_letters, console.attendance.snapshot)
    return {"items": [dataclasses.asdict(item) for item in page.items], "next_cursor": page.next_cursor}


@router.get("/inbox/count", summary="How many items the inbox lists, every kind (counted up to 500: more is "
                                    "`more` true)")
async def inbox_count(console: ConsoleDep, _: Reader) -> dict[str, int | bool]:
    found = await inbox.count(console.reads, console.dead_letters, console.attendance.snapshot)
    return {"count": found.items, "more": found.more}


@router.get("/audit", summary="What operators did through the console, newest first",
            description="Paged by cursor as `/sagas`.")
async def audit(request: Request, response: Response, console: ConsoleDep, _: Reader,
                limit: Annotated[int, Query(ge=1, le=1000)] = 200,
                cursor: Annotated[str | None, Query(description=CURSOR_HELP)] = None) -> list[dict[str, Any]]:
    page = await console.audit.entry_page(limit, cursor)
    return [dataclasses.asdict(entry) for entry in paged(request, response, page)]


@router.post(f"{SAGA_PATH}/actions", response_model=ActionResult, status_code=202,
             summary="Pull a lever on one saga (published on saga.control; the orchestrator decides it); 404 for "
                     "a saga that does not exist, nothing published")
async def act(saga_id: str, request: ActionRequest, console: ConsoleDep, operator: Actor,
              wait_s: Annotated[float, Query(ge=0, le=MAX_WAIT_S, description="Wait up to this long for the "
                                                                              "orchestrator's decision.")] = 0
              ) -> ActionResult:
    pulled = await console.act(operator, saga_id, request.action, request.step, request.reason)
    found = await decisions.await_decision(console.reads, pulled, wait_s)
    return ActionResult(saga_id=saga_id, action=request.action, operator=operator, published=True,
                        action_id=pulled.action_id, after_seq=pulled.after_seq, decision=found.to_json(),
                        decision_url=f"/api/v1/sagas/{pulled.path()}")


@router.get(f"{SAGA_PATH}/actions/{{action_id}}",
            summary="What the orchestrator decided about a lever (as its POST answered: decision_url)")
async def action_decision(saga_id: str, action_id: str, action: str, after_seq: int, console: ConsoleDep,
                          _: Reader, operator: str | None = None,
                          wait_s: Annotated[float, Query(ge=0, le=MAX_WAIT_S)] = 0) -> dict[str, Any]:
    pulled = decisions.Pulled(saga_id, action, None, operator, action_id, after_seq)
    found = await decisions.await_decision(console.reads, pulled, wait_s)
    return {"saga_id": saga_id, "action": action, "action_id": action_id, **found.to_json(),
            "said": found.describe(action)}


class SignalRequest(BaseModel):
    """A signal for one saga: ``signal`` as its saga type declares it, ``payload`` its record as a JSON object
    (checked against the record), ``signal_id`` to send it again without effect (default: a fresh one). The sender
    is who the console knows is asking."""

    signal: str
    payload: dict[str, Any]
    signal_id: str | None = None


class SignalResult(BaseModel):
    saga_id: str
    signal: str
    signal_id: str
    sender: str
    published: bool


@router.post(f"{SAGA_PATH}/signals", response_model=SignalResult, status_code=202,
             summary="Send a signal to one saga (published on saga.control; the saga takes it once per id)")
async def send_signal(saga_id: str, request: SignalRequest, console: ConsoleDep, operator: Actor) -> SignalResult:
    sent = await console.signal(operator, saga_id, request.signal, request.payload, request.signal_id)
    return SignalResult(saga_id=saga_id, signal=request.signal, signal_id=sent, sender=operator, published=True)


class SelectionRequest(BaseModel):
    """Which sagas: every criterion given must hold, at least one given (``operations.bulk_jobs.Selection``)."""

    saga_type: str | None = None
    statuses: list[str] = Field(default_factory=list)
    older_than_s: float | None = Field(default=None, description="Not updated for this long, in seconds.")
    tenant: str | None = None
    error: str | None = Field(default=None, description="The error type of the step it is stuck on ('timeout').")
    participant: str | None = Field(default=None, description="The step it is stuck on is this participant's.")

    def selection(self) -> bulk_jobs.Selection:
        try:
            return bulk_jobs.Selection(saga_type=self.saga_type or None, statuses=tuple(self.statuses),
                                       older_than_s=self.older_than_s, tenant=self.tenant or None,
                                       error=self.error or None, participant=self.participant or None)
        except bulk_jobs.BulkJobError as error:
            raise HTTPException(400, str(error)) from None


class JobRequest(SelectionRequest):
    """A bulk job: ``action`` on every saga the selection matches, at most ``rate_per_s`` a second."""

    action: str
    step: str | None = None
    reason: str
    rate_per_s: float = bulk_jobs.DEFAULT_RATE_PER_S
    expected: int | None = Field(default=None, ge=0, description="The `total` POST /bulk/count answered for this "
                                 "selection: a job starts only once counted (422 without it), and only while the "
                                 "selection still matches that many (409: count again).")


class CountResult(BaseModel):
    total: int
    sample: list[str]
    selection: str


@router.post("/bulk/count", response_model=CountResult, tags=["bulk jobs"],
             summary="The dry run: how many sagas a selection matches now, and some of their ids")
async def bulk_count(request: SelectionRequest, console: ConsoleDep, _: Reader) -> CountResult:
    selection = request.selection()
    try:
        found = await bulk_jobs.count(console.bulk_store, selection, console.reads.definitions)
    except bulk_jobs.BulkJobError as error:
        raise HTTPException(400, str(error)) from None
    return CountResult(total=found.total, sample=found.sample, selection=selection.describe())


@router.post("/bulk/jobs", status_code=201, tags=["bulk jobs"],
             summary="Start a bulk job counted first (run by the orchestrator; recorded with the operator)",
             description="Count first (POST /bulk/count) and give its `total` as `expected`: without it the start is "
                         "refused 422, and 409 when the selection matches another number of sagas now.")
async def bulk_start(request: JobRequest, console: ConsoleDep, operator: Actor) -> dict[str, Any]:
    job = await console.start_job(operator, request.selection(), request.action, request.step, request.reason,
                                  request.rate_per_s, request.expected)
    return job.to_json()


@router.get("/bulk/jobs", tags=["bulk jobs"], summary="The latest bulk jobs, newest first, with their progress")
async def bulk_list(console: ConsoleDep, _: Reader) -> list[dict[str, Any]]:
    return [job.to_json() for job in await bulk_jobs.jobs(console.bulk_store)]


@router.get("/bulk/jobs/{job_id}", tags=["bulk jobs"], summary="One bulk job and its progress")
async def bulk_job(job_id: int, console: ConsoleDep, _: Reader) -> dict[str, Any]:
    found = await bulk_jobs.job(console.bulk_store, job_id)
    if found is None:
        raise HTTPException(404, f"no bulk job {job_id}")
    return found.to_json()


@router.post("/bulk/jobs/{job_id}/cancel", tags=["bulk jobs"], summary="Stop a running bulk job")
async def bulk_cancel(job_id: int, console: ConsoleDep, operator: Actor) -> dict[str, Any]:
    return (await console.cancel_job(operator, job_id)).to_json()


class AnswerRequest(BaseModel):
    """The answer to a deferred command: ``output`` (UTF-8 text) when the step succeeded, else ``error_type`` (and
    ``message``) when it failed for good; ``detail``: why, recorded with the operator."""

    output: str | None = None
    error_type: str | None = None
    message: str = ""
    detail: str | None = None

    def outcome(self) -> Succeeded | Failed:
        if (self.output is None) == (self.error_type is None):
            raise HTTPException(400, "give exactly one of output (the step succeeded) or error_type (it failed)")
        if self.error_type is not None and not self.error_type.strip():
            raise HTTPException(400, "error_type must not be empty")
        return Succeeded(self.output.encode()) if self.output is not None else Failed(str(self.error_type),
                                                                                      self.message)


@router.post("/deferred/{participant}/{key}/answer", status_code=202, tags=["deferred"],
             summary="Answer a deferred command (the saga's history records the operator)")
async def answer(participant: str, key: str, request: AnswerRequest, console: ConsoleDep,
                 operator: Actor) -> dict[str, str]:
    await console.answer(operator, participant, key, request.outcome(), request.detail)
    return {"answered": key, "operator": operator}


class ReplayRequest(BaseModel):
    """Dead letters to publish again to their source topics: ``positions`` on saga.dlq (PARTITION:OFFSET, as
    listed), ``reason`` (what was fixed; recorded with each replay), ``force``: replay a step's command or reply of
    a saga that has ended too (it could redo what the saga undid). The operator is who the console knows is
    asking, never a field."""

    positions: list[str]
    reason: str | None = None
    force: bool = False


class ReplayResult(BaseModel):
    operator: str
    replayed: list[dict[str, Any]] = Field(description="Published: position, topic, saga_id, and whether the replay "
                                                       "is recorded in the saga's history (it has one).")
    refused: list[dict[str, str]] = Field(description="Not replayed: position and why.")


class DismissRequest(BaseModel):
    """Dead letters to mark handled without a replay (nothing is published; they leave the inbox): ``positions`` on
    saga.dlq (PARTITION:OFFSET, as listed) and ``reason``, required: why they must never be sent again. The
    operator is who the console knows is asking, never a field."""

    positions: list[str]
    reason: str | None = None


class DismissResult(BaseModel):
    operator: str
    dismissed: list[str] = Field(description="The positions dismissed.")


@router.get("/dead-letters", tags=["dead letters"],
            summary="The newest dead letters on saga.dlq (newest first, from the index the orchestrator keeps), with"
                    " the replays their sagas record")
async def list_dead_letters(console: ConsoleDep, _: Reader, limit: Annotated[
        int, Query(ge=1, le=letter_replays.MOST_SHOWN)] = letter_replays.SHOWN,
        saga: Annotated[str | None, Query(description="Only the letters of this saga id.")] = None,
        source: Annotated[str | None, Query(description="Only the letters from this topic.")] = None,
        reason: Annotated[str | None, Query(description="Only the letters whose reason contains this.")] = None,
        position: Annotated[str | None, Query(description="Only the letter at PARTITION:OFFSET.")] = None,
) -> list[dict[str, Any]]:
    where = LetterFilter(saga_id=saga or None, source=source or None, reason=reason or None)
    return [view.to_json() for view in await letter_replays.letters(console, limit, where, position)]


@router.post("/dead-letters/replay", response_model=ReplayResult, tags=["dead letters"],
             summary="Replay dead letters (recorded in their sagas' histories with the operator, and audited)")
async def replay_dead_letters(request: ReplayRequest, console: ConsoleDep, operator: Actor) -> ReplayResult:
    done = await letter_replays.replay(console, operator, request.positions, request.reason or None, request.force)
    return ReplayResult(operator=done.operator, replayed=done.replayed, refused=done.refused)


@router.post("/dead-letters/dismiss", response_model=DismissResult, tags=["dead letters"],
             summary="Dismiss dead letters: handled without a replay, with a required reason (audited)")
async def dismiss_dead_letters(request: DismissRequest, console: ConsoleDep, operator: Actor) -> DismissResult:
    done = await letter_replays.dismiss(console, operator, request.positions, request.reason)
    return DismissResult(operator=operator, dismissed=done)
