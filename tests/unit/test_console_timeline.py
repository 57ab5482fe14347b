"""A saga page's timeline: live, a retry loop stays one row; paged, the pages put together are the whole."""

from __future__ import annotations

import asyncio

import pytest

from saga_orchestrator.console.pages import TimelinePage, continued, earlier_page, timeline, trailing_run
from saga_orchestrator.schemas.event_types import (
    Event,
    StepCommandSent,
    StepFailed,
    StepRetryScheduled,
    StepSucceeded,
    StepTimedOut,
)
from saga_orchestrator.schemas.registry import default_registry

SCHEMAS = default_registry()
Stamped = list[tuple[int, Event]]


def history(pattern: str) -> Stamped:
    """Events by letter: ``f``/``g`` an attempt of step a/b that failed (sent, failed, retry scheduled), ``t`` one
    of a that timed out (sent, timed out), ``x`` a failure of a not retried, ``s`` a step that went through."""
    events: list[Event] = []
    attempts: dict[str, int] = {}

    def add(kind: type[Event], **fields: object) -> None:
        seq = len(events) + 1
        events.append(kind(saga_id="s", seq=seq, definition_version=1, occurred_at=1000 * seq, **fields))

    for letter in pattern:
        if letter == "s":
            add(StepSucceeded, step=f"ok{len(events)}", attempt=1)
            continue
        step = "b" if letter == "g" else "a"
        attempt = attempts[step] = attempts.get(step, 0) + 1
        add(StepCommandSent, step=step, attempt=attempt, idempotency_key=f"s:{step}", message_id=f"m{len(events)}",
            timeout_at=0)
        if letter == "t":
            add(StepTimedOut, step=step, attempt=attempt)
        else:
            add(StepFailed, step=step, attempt=attempt, error_type="Busy", error_message=f"busy {attempt}",
                retryable=letter != "x")
        if letter in "fgt":
            add(StepRetryScheduled, step=step, attempt=attempt + 1, due_at=0)
    return [(event.occurred_at, event) for event in events]


PATTERNS = ["", "s", "f", "ff", "sffs", "sfsfffffsgg", "fgfgffgg", "sfffffffftttfs", "ssfsfxsfffgggs" * 3,
            "s" + "f" * 40 + "s" * 5 + "t" * 7]


def test_a_retry_loop_row_counts_its_attempts_and_says_its_last_error_and_time() -> None:
    rows = timeline(history("sffft"), SCHEMAS)
    [loop] = [row for row in rows if row["type"] == "RetryLoop"]
    assert loop["id"] == "loop-a-2" and loop["first"] == 2 and loop["seq"] == "2\u201313"
    assert loop["attempt"] == "1\u20134" and (loop["at"], loop["last_at"]) == (2000, 13000)
    assert loop["detail"] == "attempts 1\u20134, Busy, TimedOut; 4 failed in 12 events; last: TimedOut"
    assert timeline(history("sfff"), SCHEMAS)[-1]["detail"].endswith("last: Busy: busy 3")


@pytest.mark.parametrize("pattern", PATTERNS)
def test_the_timeline_splits_where_the_retry_loop_it_ends_in_begins(pattern: str) -> None:
    events = history(pattern)
    loop = trailing_run(events)
    assert timeline(events, SCHEMAS) == timeline(events[:loop], SCHEMAS) + timeline(events[loop:], SCHEMAS)
    assert all(event.step == events[-1][1].step for _, event in events[loop:])  # type: ignore[attr-defined]


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("batch", [1, 2, 5])
def test_a_live_timeline_is_the_timeline_of_its_history_at_every_step(pattern: str, batch: int) -> None:
    events = history(pattern)
    shown: list[dict[str, object]] = []  # the settled rows the page appended
    tail: Stamped = []
    for start in range(0, len(events), batch):
        settled, tail, tail_rows = continued(tail, events[start:start + batch], SCHEMAS)
        shown += settled
        assert shown + tail_rows == timeline(events[:start + batch], SCHEMAS)


def test_a_retry_loop_going_on_live_keeps_one_row_by_its_id() -> None:
    events = history("sfff")
    tail = events[trailing_run(events):]
    for more in range(4, 20):
        new = history("s" + "f" * more)[len(events):]
        settled, tail, rows = continued(tail, new, SCHEMAS)
        events += new
        assert settled == [] and [row["id"] for row in rows] == ["loop-a-2"]
        assert rows[0]["attempt"] == f"1\u2013{more}"
    settled, tail, rows = continued(tail, history("s" + "f" * 19 + "s")[len(events):], SCHEMAS)
    assert [row["id"] for row in settled] == ["loop-a-2", "ev-59"] and tail == [] and rows == []


def _pages(events: Stamped, limit: int, read: int) -> list[TimelinePage]:
    async def events_before(before_seq: int, count: int) -> Stamped:
        return [stamped for stamped in events if stamped[1].seq < before_seq][-count:]

    pages: list[TimelinePage] = []
    before: int | None = len(events) + 1
    while before is not None:
        pages.append(asyncio.run(earlier_page(events_before, before, SCHEMAS, limit, read)))
        before = pages[-1].earlier
        assert len(pages) <= len(events) + 1, "the pages do not go back"
    return pages


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize(("limit", "read"), [(1, 1), (2, 3), (3, 2), (5, 50), (200, 1000)])
def test_the_earlier_pages_put_together_are_the_whole_timeline(pattern: str, limit: int, read: int) -> None:
    events = history(pattern)
    pages = _pages(events, limit, read)
    assert [row for page in reversed(pages) for row in page.rows] == timeline(events, SCHEMAS)
    assert all(0 < len(page.rows) <= limit for page in pages if events)
    assert all(page.earlier == page.rows[0]["first"] for page in pages[:-1] if page.earlier is not None)
