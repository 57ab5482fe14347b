"""The console's pages: server-rendered (Jinja2), refreshed by htmx, a saga's timeline live over server-sent
events. No build step: htmx and its SSE extension are two files under ``static/``."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from html import escape
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, urlencode, urlsplit

from fastapi import APIRouter, Form, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from fastapi.templating import Jinja2Templates

from ..operations import bulk_jobs, inbox, parked_rows
from ..operations.paging import Page
from ..operations.ports import AGE_BUCKETS
from ..operations.reads import SagaView
from ..operations.sessions import SESSION_S
from ..orchestrator.domain.definition import SagaDefinition
from ..orchestrator.domain.model import StepStatus
from ..orchestrator.domain.state import SagaState, SagaStatus
from ..orchestrator.ports import LetterFilter
from ..participants.kit.outcome import Failed, Succeeded
from ..schemas.codec import WireError
from ..schemas.event_types import Event, StepCommandSent, StepFailed, StepRetryScheduled, StepTimedOut
from ..schemas.registry import SchemaRegistry
from . import decisions, letter_replays, operating
from .api import actor, detail, effects, inbox_query
from .context import Console, console_of
from .guard import Refused, caller_of
from .saga_paths import SAGA_PATH, saga_segment

TEMPLATES = Jinja2Templates(directory=Path(__file__).parent / "templates")
STREAM_POLL_S = 0.5  # how often a saga page's stream looks for new events
PAGE_ROWS = 500  # sagas a list page shows; a next link reads the following ones
AUDIT_ROWS = 200  # audit entries a page shows, the latest first; its next link reads older ones
PAGE_WAIT_S = 2.0  # how long a lever posted without htmx waits for its decision before the page comes back
DECISION_ASKS = 75  # how often a lever's flash asks for its decision (every 0.4 s: about half a minute)
_SHOWN_ELSEWHERE = frozenset({"saga_id", "seq", "occurred_at", "step", "attempt"})

router = APIRouter(include_in_schema=False)


def _when(epoch_ms: int | None) -> str:
    if epoch_ms is None:
        return ""
    return datetime.fromtimestamp(epoch_ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _heat(count: int) -> int:
    return 0 if count == 0 else 1 if count < 10 else 2 if count < 100 else 3 if count < 1000 else 4


def _percent(rate: float | None) -> str:
    return "none ended" if rate is None else f"{rate * 100:.1f} %"


TEMPLATES.env.filters.update(when=_when, heat=_heat, percent=_percent, segment=saga_segment)


def _page(request: Request, name: str, console: Console, **context: Any) -> HTMLResponse:
    caller = caller_of(request)
    return TEMPLATES.TemplateResponse(request, name, {
        "operator": console.identity.operator(request), "levers": console.levers,
        "csrf_token": caller.csrf if caller is not None else None,
        "identity_mode": console.identity.mode, "flash": request.query_params.get("flash"), **context})


SESSION_ENDED = "Your session ended; sign in again."


def on_site(path: str) -> str:
    """``path`` when it is a path of this console, else ``/``: a sign-in never sends anyone to another site
    (``//host``, ``/\\host`` and ``https:`` all lead off it)."""
    if not path.startswith("/") or path.startswith(("//", "/\\")) or any(c in path for c in "\r\n\\"):
        return "/"
    return path


def _viewer(request: Request, console: Console) -> Response | None:
    """A redirect to the login (or a 401 behind a proxy) when the console needs someone and nobody is known."""
    if console.identity.mode == "anonymous" or console.identity.operator(request) is not None:
        return None
    if console.identity.mode == "login":
        return _to_login(request, console)
    raise HTTPException(401, f"the proxy did not name the operator ({console.identity.header})")


def _to_login(request: Request, console: Console) -> Response:
    """Off to the login, which leads back to the page the operator was on, its query kept, and says so when the
    request's session cookie names a session that ended. From htmx (a fragment the page asked for) the page is
    its ``HX-Current-URL`` and the answer a 401 whose ``HX-Redirect`` sends the whole page."""
    current = request.headers.get("hx-current-url") if request.headers.get("hx-request") == "true" else None
    url = urlsplit(current) if current is not None else request.url
    place = on_site(url.path + (f"?{url.query}" if url.query else ""))
    ended = f"flash={quote(SESSION_ENDED)}&" if console.cookie in request.cookies else ""
    target = f"/login?{ended}next={quote(place, safe='')}"
    if current is not None:
        return Response(status_code=401, headers={"HX-Redirect": target})
    return RedirectResponse(target, status_code=303)


def timeline_line(event: Event, at_ms: int, schemas: SchemaRegistry) -> dict[str, Any]:
    """One row of a saga's timeline: the event, its step and attempt, its other fields (outputs decoded); ``id``
    (``ev-<seq>``) and ``first`` (its seq) name it on the page."""
    shown = []
    for item in dataclasses.fields(event):
        value = getattr(event, item.name)
        if item.name in _SHOWN_ELSEWHERE or value is None or value == "" or value == ():
            continue
        if isinstance(value, bytes):
            try:
                value = json.dumps(schemas.decode(value)[1], default=str)
            except WireError:
                value = f"<{len(value)} bytes>"
        shown.append(f"{item.name}: {value}")
    return {"id": f"ev-{event.seq}", "first": event.seq, "seq": event.seq, "at": at_ms, "type": type(event).__name__,
            "step": getattr(event, "step", "") or "", "attempt": getattr(event, "attempt", "") or "",
            "detail": "; ".join(shown)}


DASH = "\u2013"
COLLAPSED_FROM = 2  # failed attempts in a row of one step from which the timeline shows them as one row
TIMELINE_ROWS = 200  # timeline rows a saga's page shows, the newest; its "earlier" control reads those before
TIMELINE_READ = 1000  # events an earlier page of a timeline reads first (twice as many again while too few rows)


def _failure(event: Event) -> str | None:
    if isinstance(event, StepTimedOut):
        return "TimedOut"
    return event.error_type if isinstance(event, StepFailed) and event.retryable else None


def _in_loop(event: Event, step: str | None) -> bool:
    """Whether ``event`` goes on a retry loop of ``step``: its command sent, timed out, failed to be retried, or
    its retry scheduled."""
    if not isinstance(event, StepCommandSent | StepTimedOut | StepFailed | StepRetryScheduled) or event.step != step:
        return False
    return not isinstance(event, StepFailed) or event.retryable


def _run_end(events: list[tuple[int, Event]], start: int) -> int:
    """Where the run of events on a retry loop of the step of ``events[start]`` that begins there ends (the index
    after it; ``start`` when that event goes on no loop)."""
    step: str | None = getattr(events[start][1], "step", None)
    end = start
    while end < len(events) and _in_loop(events[end][1], step):
        end += 1
    return end


def trailing_run(events: list[tuple[int, Event]]) -> int:
    """Where the run of events on one retry loop that ends ``events`` begins (``len(events)`` when the last event
    goes on no loop). More events may lengthen that run, and so change its rows; the rows before it stay: the
    timeline of ``events`` is the timeline of those before this index followed by the timeline of the rest."""
    start = len(events)
    if events:
        step: str | None = getattr(events[-1][1], "step", None)
        while start > 0 and _in_loop(events[start - 1][1], step):
            start -= 1
    return start


def timeline(events: list[tuple[int, Event]], schemas: SchemaRegistry) -> list[dict[str, Any]]:
    """A saga's timeline rows (``timeline_line``), each retry loop of one step (its commands sent, failed or timed
    out and retried again, ``COLLAPSED_FROM`` failures or more in a row) shown as one row: "attempts 3 to 57,
    TimedOut" (``RetryLoop``, id ``loop-<step>-<first seq>``, with when its last event was stored and its last
    error).

    The rows are read from ``events`` left to right, a row's extent decided by the events from its first on only:
    the timeline of any part of a history that begins where a row of the whole one begins shows the same rows."""
    rows: list[dict[str, Any]] = []
    index = 0
    while index < len(events):
        end = _run_end(events, index)
        failures = [(getattr(event, "attempt", 0), failed, event) for _, event in events[index:end]
                    if (failed := _failure(event)) is not None]
        if len(failures) >= COLLAPSED_FROM:
            rows.append(_loop_row(events[index:end], failures))
            index = end
            continue
        at, first = events[index]
        rows.append(timeline_line(first, at, schemas))
        index += 1
    return rows


def _loop_row(loop: list[tuple[int, Event]], failures: list[tuple[int, str, Event]]) -> dict[str, Any]:
    (at, first), (last_at, last) = loop[0], loop[-1]
    step: str = getattr(first, "step", "")
    kinds = ", ".join(dict.fromkeys(kind for _, kind, _ in failures))
    attempts = f"{failures[0][0]}{DASH}{failures[-1][0]}"
    failed = failures[-1][2]
    error = (f"{failed.error_type}: {failed.error_message}" if isinstance(failed, StepFailed) and failed.error_message
             else failures[-1][1])
    return {"id": f"loop-{step}-{first.seq}", "first": first.seq, "seq": f"{first.seq}{DASH}{last.seq}", "at": at,
            "last_at": last_at, "type": "RetryLoop", "step": step, "attempt": attempts,
            "detail": f"attempts {attempts}, {kinds}; {len(failures)} failed in {len(loop)} events;"
                      f" last: {error}"}


def continued(tail: list[tuple[int, Event]], new: list[tuple[int, Event]], schemas: SchemaRegistry
              ) -> tuple[list[dict[str, Any]], list[tuple[int, Event]], list[dict[str, Any]]]:
    """A live timeline going on: ``new`` events after ``tail``, the events of the retry loop the page's timeline
    ends in (``trailing_run``; the page shows its rows last). Gives the rows that settle (shown before the tail
    from now on), the new tail, and its rows (in place of the old tail's). Settled rows, then the tail's rows,
    are the ``timeline`` of the whole history so far: a loop that goes on stays one row, its id kept."""
    events = tail + new
    loop = trailing_run(events)
    return timeline(events[:loop], schemas), events[loop:], timeline(events[loop:], schemas)


@dataclasses.dataclass(frozen=True)
class TimelinePage:
    """The rows of one page of a saga's timeline, oldest first, and the seq the page before it ends before (None
    when this page begins at the saga's first event)."""

    rows: list[dict[str, Any]]
    earlier: int | None


def timeline_page(events: list[tuple[int, Event]], schemas: SchemaRegistry, limit: int, *,
                  from_start: bool) -> TimelinePage | None:
    """The newest ``limit`` rows (at least one) of the ``timeline`` of ``events``: a stretch of a saga's history
    that ends where a row of the whole history begins (the saga's last event, or a page's ``earlier`` seq), and
    that begins at the saga's first event when ``from_start``.

    Pages show the rows of the whole history (``timeline``), a retry loop whole on one page: when not
    ``from_start``, the stretch's first events may be the end of a loop that began earlier, so the rows of the run
    of events on one loop it begins with are left off (the earlier page shows them). None when the rest makes
    fewer than ``limit`` rows: read more events before these and ask again."""
    limit = max(limit, 1)
    rows = timeline(events[0 if from_start or not events else _run_end(events, 0):], schemas)
    if not from_start and len(rows) < limit:
        return None
    shown = rows[max(len(rows) - limit, 0):]
    return TimelinePage(shown, shown[0]["first"] if shown and (len(rows) > limit or not from_start) else None)


async def earlier_page(events_before: Callable[[int, int], Awaitable[list[tuple[int, Event]]]], before: int,
                       schemas: SchemaRegistry, limit: int, read: int) -> TimelinePage:
    """The page of a saga's timeline that ends before seq ``before`` (a page's ``earlier``), ``limit`` rows at
    most: its events read backwards (``events_before(before_seq, limit)``), ``read`` at first, twice as many each
    time until they make the rows (a long retry loop is one row of many events)."""
    events: list[tuple[int, Event]] = []
    while True:
        found = await events_before(events[0][1].seq if events else before, read)
        events = found + events
        page = timeline_page(events, schemas, limit, from_start=len(found) < read)
        if page is None:
            read *= 2
            continue
        if events and page.earlier == events[0][1].seq and not await events_before(page.earlier, 1):
            return TimelinePage(page.rows, None)  # it begins at the saga's first event after all: no empty page
        return page


_FILL = {"SUCCEEDED": "#d5f2dc", "RUNNING": "#d8ecff", "PENDING": "#f4f5f7", "FAILED": "#ffd9d6",
         "COMPENSATED": "#fff0c9", "SKIPPED": "#fff0c9", "COMPENSATING": "#ffe2bf", "COMPENSATION_FAILED": "#ffd9d6"}


def dag_svg(definition: SagaDefinition | None, state: SagaState | None) -> str:
    """The saga's steps as a left-to-right graph (a column per depth), each box filled by its step's state."""
    if definition is None:
        return ""
    depth: dict[str, int] = {}
    for name in definition.order:
        depth[name] = 1 + max((depth[dep] for dep in definition.step(name).depends_on), default=-1)
    columns: dict[int, list[str]] = {}
    for name in definition.order:
        columns.setdefault(depth[name], []).append(name)
    width, height, gap_x, gap_y = 150, 34, 40, 16
    place = {name: (column * (width + gap_x) + 4, row * (height + gap_y) + 4)
             for column, names in columns.items() for row, name in enumerate(names)}
    total_w = len(columns) * (width + gap_x)
    total_h = max(len(names) for names in columns.values()) * (height + gap_y) + 8
    parts = [f'<svg class="dag" role="img" aria-label="steps of {escape(definition.saga_type)}" width="{total_w}" '
             f'height="{total_h}" viewBox="0 0 {total_w} {total_h}">']
    for name in definition.order:
        x, y = place[name]
        for dep in definition.step(name).depends_on:
            dx, dy = place[dep]
            parts.append(f'<line x1="{dx + width}" y1="{dy + height / 2}" x2="{x}" y2="{y + height / 2}" '
                         'stroke="#8896a5" stroke-width="1.5"/>')
    for name in definition.order:
        x, y = place[name]
        status = state.steps[name].status.value if state is not None and name in state.steps else "PENDING"
        step = definition.step(name)
        parts.append(f'<g data-step="{escape(name)}" data-status="{status}">'
                     f'<rect x="{x}" y="{y}" width="{width}" height="{height}" rx="6"'
                     f' fill="{_FILL.get(status, "#ffe2bf")}"'
                     f' stroke="{"#1d2733" if step.pivot else "#8896a5"}" stroke-width="{2 if step.pivot else 1}"/>'
                     f'<text x="{x + 8}" y="{y + 14}">{escape(name)}</text>'
                     f'<text x="{x + 8}" y="{y + 28}" fill="#555">{status.lower()}</text></g>')
    parts.append("</svg>")
    return "".join(parts)


@router.get("/", response_class=HTMLResponse)
async def fleet_page(request: Request) -> Response:
    console = console_of(request)
    return _viewer(request, console) or _page(request, "fleet.html", console, fleet=await console.reads.fleet(),
                                              buckets=[name for name, _ in AGE_BUCKETS])


@router.get("/fleet/body", response_class=HTMLResponse)
async def fleet_body(request: Request) -> Response:
    console = console_of(request)
    return _viewer(request, console) or _page(request, "fleet_body.html", console, fleet=await console.reads.fleet(),
                                              buckets=[name for name, _ in AGE_BUCKETS])


@router.get("/sagas", response_class=HTMLResponse)
async def sagas_page(request: Request, status: str | None = None, saga_type: str | None = None,
                     cursor: str | None = None) -> Response:
    console = console_of(request)
    if (denied := _viewer(request, console)) is not None:
        return denied
    try:
        selection = (bulk_jobs.Selection(saga_type=saga_type or None, statuses=(status,) if status else ())
                     if status or saga_type else None)
        page = await console.reads.saga_page(selection, PAGE_ROWS, cursor or None)
    except bulk_jobs.BulkJobError as refused:  # not a state, or a saga type not deployed
        raise HTTPException(400, str(refused)) from None
    heading = " ".join(part for part in (saga_type, status) if part) or "All sagas"
    return _page(request, "list.html", console, rows=page.rows, heading=heading, next_url=_next_url(request, page))


def _next_url(request: Request, page: Page[Any]) -> str | None:
    """The URL of the page after ``page``: this one's with the next cursor; None on the last page."""
    if page.next_cursor is None:
        return None
    following = request.url.include_query_params(cursor=page.next_cursor)
    return f"{following.path}?{following.query}"


@router.get("/search", response_class=HTMLResponse)
async def search_page(request: Request, q: str = "", tenant: str = "", started_after: str = "",
                      started_before: str = "") -> Response:
    console = console_of(request)
    if (denied := _viewer(request, console)) is not None:
        return denied
    try:
        after, before = (inbox.moment_ms(datetime.fromisoformat(text) if text else None)
                         for text in (started_after, started_before))
    except ValueError:
        raise HTTPException(400, "a start bound is not a date and time (2026-01-31T12:00)") from None
    rows = await console.reads.search(q, tenant=tenant.strip() or None, started_after_ms=after,
                                      started_before_ms=before)
    return _page(request, "search.html", console, rows=rows, query=q, tenant=tenant, started_after=started_after,
                 started_before=started_before, fields=console.reads.searchable_fields())


@router.get("/wedged", response_class=HTMLResponse)
async def wedged_page(request: Request, min_failures: int = 3) -> Response:
    console = console_of(request)
    return _viewer(request, console) or _page(request, "wedged.html", console, min_failures=min_failures,
                                              groups=await console.reads.wedged(max(1, min_failures)))


@router.get("/inbox", response_class=HTMLResponse)
async def inbox_page(request: Request, cursor: str | None = None, limit: int = inbox.DEFAULT_LIMIT,
                     saga_type: Annotated[str | None, Query(alias="type")] = None, kind: str | None = None,
                     stuck_after: str | None = None, stuck_before: str | None = None) -> Response:
    """What needs a human, stuck longest first, a page at a time ("next" carries the cursor and the filters)."""
    console = console_of(request)
    if (denied := _viewer(request, console)) is not None:
        return denied
    query = inbox_query(cursor, max(1, min(limit, inbox.MAX_LIMIT)), saga_type, [kind] if kind else None, stuck_after,
                        stuck_before)
    page = await inbox.inbox(console.reads, query, console.dead_letters, console.attendance.snapshot)
    filters = {"type": saga_type or "", "kind": kind or "", "stuck_after": stuck_after or "",
               "stuck_before": stuck_before or "", "limit": str(query.limit)}
    shown = {name: value for name, value in filters.items() if value}
    next_href = (f"/inbox?{urlencode({**shown, 'cursor': page.next_cursor})}" if page.next_cursor else None)
    return _page(request, "inbox.html", console, page=page, filters=filters, next_href=next_href,
                 kinds=[k.value for k in inbox.Kind],
                 saga_types=sorted(console.reads.definitions.types()))


@router.get("/inbox/count", response_class=HTMLResponse)
async def inbox_count_fragment(request: Request) -> Response:
    """The navigation's inbox badge (loaded by htmx, so no page waits on it)."""
    console = console_of(request)
    if _viewer(request, console) is not None:
        return HTMLResponse("")
    found = await inbox.count(console.reads, console.dead_letters, console.attendance.snapshot)
    return HTMLResponse(f'<span class="count" data-count="{found}">{found}</span>' if found.items else "")


@router.get("/definitions", response_class=HTMLResponse)
async def definitions_page(request: Request) -> Response:
    console = console_of(request)
    if (denied := _viewer(request, console)) is not None:
        return denied
    return _page(request, "definitions.html", console, versions=await console.reads.definition_versions())


@router.get("/quarantine", response_class=HTMLResponse)
async def quarantine_page(request: Request, cursor: str | None = None) -> Response:
    console = console_of(request)
    if (denied := _viewer(request, console)) is not None:
        return denied
    page = await console.reads.quarantined_page(PAGE_ROWS, cursor or None)
    return _page(request, "list.html", console, rows=page.rows, heading="Quarantined sagas",
                 note="Each waits for its cause to be fixed; release it from its page.",
                 next_url=_next_url(request, page))


@router.get("/audit", response_class=HTMLResponse)
async def audit_page(request: Request, cursor: str | None = None) -> Response:
    console = console_of(request)
    if (denied := _viewer(request, console)) is not None:
        return denied
    page = await console.audit.entry_page(AUDIT_ROWS, cursor or None)
    return _page(request, "audit.html", console, entries=page.rows, next_url=_next_url(request, page))


_IN_FLIGHT = frozenset(status.value for status in (
    StepStatus.RUNNING, StepStatus.TIMED_OUT, StepStatus.RETRY_SCHEDULED, StepStatus.WITHDRAWING,
    StepStatus.COMPENSATING, StepStatus.COMPENSATION_TIMED_OUT, StepStatus.COMPENSATION_RETRY_SCHEDULED))
"""A step's states while a command of it is sent or about to be sent again: it needs a worker."""


def _live(request: Request, console: Console, view: SagaView) -> dict[str, Any]:
    """What a saga's page shows that changes as the saga moves: status, steps and graph, levers, timers."""
    caller = caller_of(request)
    steps = detail(view, {}, console).steps
    unconsumed = console.attendance.snapshot.unconsumed(step.participant for step in steps
                                                        if step.status in _IN_FLIGHT)
    return {"view": view, "state": view.state, "steps": steps, "pending": _pending(view, steps),
            "unconsumed": unconsumed,
            "dag": dag_svg(view.definition, view.state),
            "offers": operating.offers(view.definition, view.state, console.now_ms()),
            "confirms": {action: operating.confirmation(view.definition, view.state, action)
                         for action in operating.DESTRUCTIVE},
            "operator": console.identity.operator(request), "levers": console.levers,
            "csrf_token": caller.csrf if caller is not None else None}


@router.get(SAGA_PATH, response_class=HTMLResponse)
async def saga_page(request: Request, saga_id: str) -> Response:
    console = console_of(request)
    denied = _viewer(request, console)
    if denied is not None:
        return denied
    view = await console.reads.saga(saga_id)
    if view is None:
        raise HTTPException(404, f"no saga {saga_id!r}")
    events = _stamped(view)
    # The rows of the retry loop the history ends in change as it goes on: the stream sends them again (``tail``).
    loop = trailing_run(events)
    tail = timeline(events[loop:], console.reads.schemas)
    page = timeline_page(events[:loop], console.reads.schemas, TIMELINE_ROWS - len(tail), from_start=True)
    assert page is not None  # a page from the start always has its rows
    return _page(request, "saga.html", console, **_live(request, console, view),
                 keys=await console.reads.search_keys(saga_id), timeline=page.rows, tail=tail,
                 earlier=page.earlier if page.rows else None, last_seq=view.events[-1].seq,
                 effects=await effects(saga_id, console, None))


def _stamped(view: SagaView) -> list[tuple[int, Event]]:
    """The saga's events, each with when it was stored."""
    return [(view.recorded_at_ms.get(event.seq, event.occurred_at), event) for event in view.events]


@router.get(f"{SAGA_PATH}/timeline", response_class=HTMLResponse)
async def timeline_fragment(request: Request, saga_id: str, before: int) -> Response:
    """The page of the saga's timeline before seq ``before`` (``earlier_page``) after its own "earlier" control
    when it does not begin at the saga's start: it takes the place of the control that asked for it."""
    console = console_of(request)
    denied = _viewer(request, console)
    if denied is not None:
        return denied
    page = await earlier_page(lambda seq, limit: console.reads.events_before(saga_id, seq, limit), before,
                              console.reads.schemas, TIMELINE_ROWS, TIMELINE_READ)
    return HTMLResponse(TEMPLATES.get_template("timeline_rows.html").render(
        saga_id=saga_id, timeline=page.rows, earlier=page.earlier))


PENDING = frozenset({"RUNNING", "TIMED_OUT", "RETRY_SCHEDULED", "WITHDRAWING", "AWAITING_SIGNAL", "COMPENSATING",
                     "COMPENSATION_TIMED_OUT", "COMPENSATION_RETRY_SCHEDULED"})


def _pending(view: SagaView, steps: list[Any]) -> list[dict[str, Any]]:
    """A card per step not settled yet: its participant, attempt, last error (a time-out too) and next retry."""
    if view.state is None:
        return []
    retries = {t.step: t.due_at_ms for t in view.timers if "RETRY" in t.kind}
    cards = []
    for step in steps:
        if step.status not in PENDING:
            continue
        error = (f"{step.last_error_type}{f': {step.last_error_message}' if step.last_error_message else ''}"
                 if step.last_error_type else None)
        if view.state.steps[step.name].outcome_unknown or step.status.endswith("TIMED_OUT"):
            error = "timed out: it may have taken effect" + (f" (before: {error})" if error else "")
        cards.append({"name": step.name, "participant": step.participant, "status": step.status,
                      "attempt": step.compensation_attempt if step.status.startswith("COMPENSATION")
                      or step.status == "COMPENSATING" else step.attempt,
                      "error": error, "next_retry_ms": retries.get(step.name), "waiting": step.waiting})
    return cards


LIVE_PARTS = {"status": "saga_status.html", "steps": "saga_steps.html", "levers": "saga_levers.html",
              "timers": "saga_timers.html"}
"""The parts of a saga's page its stream sends again after each new event, by part (``data-live-part``)."""


MAX_WATCHES = 50
"""The most saga pages one stream serves (one browser's tabs)."""


class _Watch:
    """What one open saga page shows, for the stream to send it what changed: ``watch`` (the page's number in its
    browser), the last seq it shows, the levers it offers (None: unknown), the events of the retry loop its
    timeline ends in and those rows as drawn."""

    def __init__(self, watch: str, saga_id: str, after: int) -> None:
        self.watch, self.saga_id, self.last = watch, saga_id, after
        self.shown: list[Any] | None = None
        self.tail: list[tuple[int, Event]] = []
        self.tail_html = ""

    async def open(self, console: Console) -> None:
        """Learn what the page shows: its levers are known only when nothing happened since it was drawn."""
        view = await console.reads.saga(self.saga_id)
        if view is None:
            return
        self.shown = (operating.offers(view.definition, view.state, console.now_ms())
                      if view.events[-1].seq == self.last else None)
        drawn = [stamped for stamped in _stamped(view) if stamped[1].seq <= self.last]
        self.tail = drawn[trailing_run(drawn):]
        self.tail_html = _rows_html(timeline(self.tail, console.reads.schemas))

    async def changes(self, request: Request, console: Console) -> list[tuple[str, str]]:
        """The parts of the page to draw again since the last call, in order (none when nothing happened):
        ``tail`` (the rows of the retry loop the history ends in: one row that counts on while a step keeps
        failing; sent before the rows that leave it, so none shows twice meanwhile), ``timeline`` (the new rows
        before it), then ``status``, ``steps`` (with the graph), ``levers`` (only when those that apply changed:
        a reason being typed is not wiped by each event) and ``timers``."""
        new = await console.reads.events_after(self.saga_id, self.last)
        if not new:
            return []
        self.last = new[-1][1].seq
        settled, self.tail, tail_rows = continued(self.tail, new, console.reads.schemas)
        parts: list[tuple[str, str]] = []
        rows = _rows_html(tail_rows)
        if rows != self.tail_html:
            parts.append(("tail", rows))
            self.tail_html = rows
        if settled:
            parts.append(("timeline", _rows_html(settled)))
        view = await console.reads.saga(self.saga_id)
        if view is not None:
            live = _live(request, console, view)
            parts += [(part, TEMPLATES.get_template(template).render(live)) for part, template in LIVE_PARTS.items()
                      if part != "levers" or live["offers"] != self.shown]
            self.shown = live["offers"]
        return parts


def _watches(request: Request) -> list[_Watch]:
    """The pages a stream serves: ``watch``, ``saga`` and ``after`` given once per page, in the same order;
    HTTPException 400 otherwise."""
    query = request.query_params
    watch, sagas, after = query.getlist("watch"), query.getlist("saga"), query.getlist("after")
    if not sagas or not len(watch) == len(sagas) == len(after) or len(sagas) > MAX_WATCHES:
        raise HTTPException(400, f"name 1 to {MAX_WATCHES} pages, each as watch=N&saga=ID&after=SEQ")
    if not all(seq.isdigit() for seq in after):
        raise HTTPException(400, "after is the last seq a page shows: a number")
    return [_Watch(*page[:2], int(page[2])) for page in zip(watch, sagas, after, strict=True)]


@router.get("/live")
async def live_stream(request: Request) -> Response:
    """Server-sent events for every saga page open in one browser: one stream per browser (a browser holds six
    connections per host; ``static/live.js`` shares this stream between its tabs). Each ``update`` event is JSON
    ``{"watch": N, "seq": LAST, "parts": [[PART, HTML], ...]}``: what one page draws again (``_Watch.changes``)."""
    console = console_of(request)
    denied = _viewer(request, console)
    if denied is not None:
        return denied
    watches = _watches(request)

    async def stream() -> AsyncIterator[str]:
        yield ": connected\n\n"
        for watch in watches:
            await watch.open(console)
        while not await request.is_disconnected():
            for watch in watches:
                parts = await watch.changes(request, console)
                if parts:
                    yield _sse("update", json.dumps({"watch": watch.watch, "seq": watch.last, "parts": parts}))
            await asyncio.sleep(STREAM_POLL_S)

    return StreamingResponse(stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


def _rows_html(rows: list[dict[str, Any]]) -> str:
    return "".join(TEMPLATES.get_template("timeline_row.html").render(line=line) for line in rows)


def _sse(event: str, data: str) -> str:
    lines = "".join(f"data: {line}\n" for line in data.splitlines() or [""])
    return f"event: {event}\n{lines}\n"


@router.post(f"{SAGA_PATH}/actions")
async def act_page(request: Request, saga_id: str, action: str = Form(...), step: str | None = Form(None),
                   reason: str | None = Form(None)) -> Response:
    """A lever from the saga's page: sent, audited, and answered with the orchestrator's decision (htmx: a flash
    that asks again until it is decided; else back to the page, after waiting briefly for it)."""
    console = console_of(request)
    operator = _form_actor(request, console)
    htmx = bool(request.headers.get("HX-Request"))
    try:
        pulled = await console.act(operator, saga_id, action, step or None, reason or None)
    except HTTPException as error:
        if htmx and error.status_code in (400, 404):
            return _refused(error)
        raise
    if htmx:
        return _decision_flash(pulled, await decisions.decision(console.reads, pulled), 0)
    found = await decisions.await_decision(console.reads, pulled, PAGE_WAIT_S)
    return RedirectResponse(f"/sagas/{saga_segment(saga_id)}?flash={quote(_said(pulled, found))}", status_code=303)


@router.get("/lever-decision", response_class=HTMLResponse)
async def decision_fragment(request: Request, saga_id: str, action_id: str, action: str, after_seq: int,
                            operator: str | None = None, asked: int = 0) -> Response:
    """A pulled lever's flash, asked again (htmx) until the orchestrator decided it."""
    console = console_of(request)
    if (denied := _viewer(request, console)) is not None:
        return denied
    pulled = decisions.Pulled(saga_id, action, None, operator, action_id, after_seq)
    return _decision_flash(pulled, await decisions.decision(console.reads, pulled), asked + 1)


def _said(pulled: decisions.Pulled, found: decisions.LeverDecision) -> str:
    lever = f"{pulled.action}{f' {pulled.step}' if pulled.step else ''}"
    return found.describe(lever) if found.decided else f"{found.describe(lever)} (sent for {pulled.operator})"


def _decision_flash(pulled: decisions.Pulled, found: decisions.LeverDecision, asked: int) -> HTMLResponse:
    """The flash of a lever: its decision, or (not decided yet) a line that asks again, for a while."""
    said = _said(pulled, found)
    data = f' data-outcome="{found.outcome}" data-action="{escape(pulled.action)}"'
    if found.decided:
        return _flash(said, error=found.outcome == decisions.REFUSED, data=data)
    if asked >= DECISION_ASKS:
        return _flash(said, "The page stopped asking; the timeline shows the decision when it comes.", data=data)
    again = urlencode({"saga_id": pulled.saga_id, "action_id": pulled.action_id, "action": pulled.action,
                       "after_seq": pulled.after_seq, "operator": pulled.operator or "", "asked": asked})
    return _flash(said, data=f'{data} hx-get="/lever-decision?{escape(again)}" hx-trigger="load delay:400ms"'
                             ' hx-swap="outerHTML"')


@router.post(f"{SAGA_PATH}/signals")
async def signal_page(request: Request, saga_id: str, signal: str = Form(...), payload: str = Form(...)) -> Response:
    """A signal from the saga's page: its payload (JSON) checked against the signal's record, sent, audited."""
    console = console_of(request)
    operator = _form_actor(request, console)
    try:
        fields = json.loads(payload)
    except json.JSONDecodeError as error:
        return _flash(f"the payload is not JSON: {error.msg} at line {error.lineno} column {error.colno}", error=True)
    if not isinstance(fields, dict):
        return _flash("the payload must be a JSON object, e.g. {\"approver\": \"ada\"}", error=True)
    try:
        sent = await console.signal(operator, saga_id, signal, fields, None)
    except HTTPException as error:
        return _refused(error)
    said = f"signal {signal} sent for {operator} (id {sent}); the timeline shows whether the saga took it"
    if request.headers.get("HX-Request"):
        return _flash(said)
    return RedirectResponse(f"/sagas/{saga_segment(saga_id)}?flash={quote(said)}", status_code=303)


async def _lever_form(request: Request) -> tuple[Console, str, Any]:
    """A lever form's console, its signed-in operator (``_form_actor``) and its fields."""
    console = console_of(request)
    return console, _form_actor(request, console), await request.form()


def _form_actor(request: Request, console: Console) -> str:
    """The operator of a page's form (``api.actor``: 401 or 403 when there is none); an htmx form of a login
    console that meets no session is also told (``HX-Redirect``) to send its whole page to the login."""
    if console.levers and console.identity.mode == "login" and console.identity.operator(request) is None:
        sent = _to_login(request, console)
        if "hx-redirect" in sent.headers:
            raise HTTPException(401, SESSION_ENDED, headers={"HX-Redirect": sent.headers["hx-redirect"]})
    return actor(request, console)


def _flash(*lines: str, error: bool = False, data: str = "") -> HTMLResponse:
    """What a lever form did, as the page's flash: ``lines`` escaped, ``data`` a trusted attribute."""
    return HTMLResponse(f'<p class="flash{" error" if error else ""}"{data}>'
                        + "<br>".join(escape(line) for line in lines) + "</p>")


def _refused(error: HTTPException | ValueError) -> HTMLResponse:
    return _flash(str(error.detail if isinstance(error, HTTPException) else error), error=True)


@router.get("/login", response_class=HTMLResponse)
async def login_page(request: Request, next: str = "/") -> Response:
    console = console_of(request)
    if console.identity.mode != "login":
        return RedirectResponse("/", status_code=303)
    return _page(request, "login.html", console, next=on_site(next))


@router.post("/login")
async def login(request: Request, name: str = Form(...), password: str = Form(...), next: str = Form("/")) -> Response:
    """Sign in: a session in Postgres, its random token in an HttpOnly, SameSite=Strict cookie (Secure and
    ``__Host-`` over TLS); throttled per name and address (429 with Retry-After)."""
    console = console_of(request)
    client = request.client.host if request.client else "?"
    try:
        accepted = console.identity.mode == "login" and await console.identity.sign_in(name, password, client)
    except Refused as refused:
        await console.audit.record(name or "?", "SignIn", "console", {"address": client}, f"refused: {refused.detail}")
        return RedirectResponse(f"/login?flash={quote(refused.detail)}&next={quote(on_site(next))}", status_code=303)
    if not accepted or console.identity.sessions is None:
        await console.audit.record(name or "?", "SignIn", "console", {"address": client}, "refused")
        return RedirectResponse(f"/login?flash=name or password not accepted&next={quote(on_site(next))}",
                                status_code=303)
    session = await console.identity.sessions.open(name)
    await console.audit.record(name, "SignIn", "console", {"address": client}, "signed in")
    response = RedirectResponse(on_site(next), status_code=303)
    response.set_cookie(console.cookie, session.token, max_age=SESSION_S, path="/", httponly=True,
                        samesite="strict", secure=console.cookie.startswith("__Host-"))
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    """Sign out: the session is deleted, so its cookie, kept or copied, signs nobody in again."""
    console = console_of(request)
    caller = caller_of(request)
    if caller is not None and caller.session_token is not None and console.identity.sessions is not None:
        await console.identity.sessions.close(caller.session_token)
        await console.audit.record(caller.operator or "?", "SignOut", "console", {}, "signed out")
    response = RedirectResponse("/", status_code=303)
    response.delete_cookie(console.cookie, path="/", httponly=True, samesite="strict",
                           secure=console.cookie.startswith("__Host-"))
    return response


def _selection(form: Any) -> bulk_jobs.Selection:
    minutes = str(form.get("older_than_min") or "").strip()
    try:
        return bulk_jobs.Selection(
            saga_type=form.get("saga_type") or None, statuses=tuple(form.getlist("statuses")),
            older_than_s=float(minutes) * 60 if minutes else None, tenant=form.get("tenant") or None,
            error=form.get("error") or None, participant=form.get("participant") or None)
    except ValueError as error:  # BulkJobError, or a number that is none
        raise HTTPException(400, str(error)) from None


@router.get("/bulk", response_class=HTMLResponse)
async def bulk_page(request: Request) -> Response:
    console = console_of(request)
    return _viewer(request, console) or _page(
        request, "bulk.html", console, jobs=await bulk_jobs.jobs(console.bulk_store),
        saga_types=sorted(console.reads.definitions.types()), statuses=[s.value for s in SagaStatus],
        actions=bulk_jobs.actions(), confirms={action: operating.bulk_confirmation(action)
                                               for action in bulk_jobs.actions()},
        rate=bulk_jobs.DEFAULT_RATE_PER_S)


@router.get("/bulk/jobs", response_class=HTMLResponse)
async def bulk_jobs_table(request: Request) -> Response:
    console = console_of(request)
    return _viewer(request, console) or _page(request, "bulk_jobs.html", console,
                                              jobs=await bulk_jobs.jobs(console.bulk_store))


@router.post("/bulk/count", response_class=HTMLResponse)
async def bulk_count_fragment(request: Request) -> Response:
    console = console_of(request)
    denied = _viewer(request, console)
    if denied is not None:
        return denied
    try:
        selection = _selection(await request.form())
        found = await bulk_jobs.count(console.bulk_store, selection, console.reads.definitions)
    except HTTPException as error:
        return HTMLResponse(f'<b class="error">{escape(str(error.detail))}</b>')
    except bulk_jobs.BulkJobError as error:
        return HTMLResponse(f'<b class="error">{escape(str(error))}</b>')
    return _page(request, "bulk_count.html", console, found=found, selection=selection.describe())


@router.post("/bulk/start", response_class=HTMLResponse)
async def bulk_start_fragment(request: Request) -> Response:
    console, operator, form = await _lever_form(request)
    expected = str(form.get("expected") or "")  # the hidden field the Count fragment leaves in the form
    try:
        rate = float(str(form.get("rate_per_s") or bulk_jobs.DEFAULT_RATE_PER_S))
        job = await console.start_job(operator, _selection(form), str(form.get("action") or ""),
                                      str(form.get("step") or "") or None, str(form.get("reason") or ""), rate,
                                      int(expected) if expected.isdigit() else None)
    except (HTTPException, ValueError) as error:
        return _refused(error)
    return _flash(f"bulk job {job.id} started for {operator}: {job.total} sagas, {job.rate_per_s:g} a second")


@router.get("/deferred", response_class=HTMLResponse)
async def deferred_page(request: Request) -> Response:
    console = console_of(request)
    return _viewer(request, console) or _page(request, "deferred.html", console,
                                              deferred=await console.reads.deferred())


@router.post("/deferred/answer", response_class=HTMLResponse)
async def answer_fragment(request: Request) -> Response:
    console, operator, form = await _lever_form(request)
    key = str(form.get("key") or "")
    if form.get("verdict") == "failed":
        error_type = str(form.get("error_type") or "").strip()
        if not error_type:
            return _flash("a failed answer needs its error type, e.g. Rejected", error=True)
        outcome: Succeeded | Failed = Failed(error_type, str(form.get("message") or ""))
    else:
        outcome = Succeeded(str(form.get("output") or "").encode())
    try:
        await console.answer(operator, str(form.get("participant") or ""), key, outcome,
                             str(form.get("detail") or "") or None)
    except HTTPException as error:
        return _refused(error)
    return _flash(f"answered {key} for {operator}")


@router.get("/parked", response_class=HTMLResponse)
async def parked_page(request: Request) -> Response:
    """The outbox rows the relay parked for good, each with its levers: Requeue, and Discard (which asks first)."""
    console = console_of(request)
    if (denied := _viewer(request, console)) is not None:
        return denied
    rows = sorted(await console.reads.parked(), key=lambda row: (row.created_at_ms, row.table, row.row_id))
    return _page(request, "parked.html", console, rows=[{
        "row": row, "saga_id": parked_rows.saga_of(row), "anchor": parked_rows.anchor(row.table, row.row_id),
        "why": parked_rows.why(row) or "",
        "confirm": parked_rows.discard_confirmation(row)} for row in rows])


@router.post("/parked/requeue", response_class=HTMLResponse)
async def requeue_fragment(request: Request) -> Response:
    """A parked row's Requeue form: moved back into its outbox for the signed-in operator, audited."""
    return await _parked_lever(request, requeue=True)


@router.post("/parked/discard", response_class=HTMLResponse)
async def discard_fragment(request: Request) -> Response:
    """A parked row's Discard form (confirmed on the page first): deleted for the signed-in operator, audited."""
    return await _parked_lever(request, requeue=False)


async def _parked_lever(request: Request, requeue: bool) -> Response:
    console, operator, form = await _lever_form(request)
    table, row_id = str(form.get("table") or ""), str(form.get("row_id") or "")
    if not row_id.isdigit():
        return _flash(f"no row {row_id!r} parked in {table!r}: not a row id", error=True)
    try:
        done = await console.handle_parked(operator, table, int(row_id), requeue,
                                           str(form.get("reason") or "") or None)
    except HTTPException as error:
        return _refused(error)
    return _flash(f"row {row_id} of {table} {done} (by {operator})", data=f' data-handled="{escape(row_id)}"')


@router.get("/dead-letters", response_class=HTMLResponse)
async def dead_letters_page(request: Request) -> Response:
    console = console_of(request)
    denied = _viewer(request, console)
    if denied is not None:
        return denied
    saga, position = request.query_params.get("saga") or None, request.query_params.get("position") or None
    try:
        found, unreadable = await letter_replays.letters(console, where=LetterFilter(saga_id=saga),
                                                         position=position), None
    except HTTPException as error:  # a position that is none: the page says so
        found, unreadable = [], str(error.detail)
    return _page(request, "dead_letters.html", console, shown=letter_replays.SHOWN, letters=found,
                 unreadable=unreadable, saga=saga, position=position)


@router.post("/dead-letters/replay", response_class=HTMLResponse)
async def replay_fragment(request: Request) -> Response:
    """A letter's Replay form: published for the signed-in operator, audited; what happened, as a flash."""
    console, operator, form = await _lever_form(request)
    try:
        done = await letter_replays.replay(console, operator, [str(p) for p in form.getlist("position")],
                                         str(form.get("reason") or "").strip() or None, bool(form.get("force")))
    except HTTPException as error:
        return _refused(error)
    said = [f"{item['position']} replayed to {item['topic']} by {operator}"
            + ("; its saga's history records it" if item["recorded"] else "") for item in done.replayed]
    said += [f"{item['position']} not replayed: {item['why']}" for item in done.refused]
    return _flash(*said, error=bool(done.refused), data=f' data-replayed="{len(done.replayed)}"')


@router.post("/dead-letters/dismiss", response_class=HTMLResponse)
async def dismiss_fragment(request: Request) -> Response:
    """A letter's Dismiss form: marked handled without a replay for the signed-in operator, audited; what
    happened, as a flash."""
    console, operator, form = await _lever_form(request)
    reason = str(form.get("reason") or "").strip()
    try:
        done = await letter_replays.dismiss(console, operator, [str(p) for p in form.getlist("position")], reason)
    except HTTPException as error:
        return _refused(error)
    return _flash(*(f"{position} dismissed by {operator}: {reason}; nothing re-sent" for position in done),
                  data=f' data-dismissed="{len(done)}"')
