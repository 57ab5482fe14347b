"""``saga history --follow``: events are shown once each, in order, as they come, up to the saga's end (the latest
one, when a lever re-opened an ended saga)."""

from __future__ import annotations

import asyncio

from saga_orchestrator.cli.inspect_cmd import _line, follow_events
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.schemas.event_types import Event, SagaCompleted
from saga_orchestrator.testing.history import SagaRun


def _happy_trip() -> list[Event]:
    run = SagaRun(TRIP, saga_id="t-follow")
    run.start()
    for step in ("book_flight", "book_hotel", "charge_card", "send_itinerary"):
        run.ok(step)
    return run.events


def test_follow_shows_each_event_once_as_recorded_and_stops_at_the_terminal_one() -> None:
    history = _happy_trip()
    assert isinstance(history[-1], SagaCompleted)
    recorded: list[Event] = []
    arrivals = [[], history[:1], [], history[1:4], history[4:]]  # what is in the store at each poll
    asked: list[int] = []

    async def load_after(seq: int) -> list[Event]:
        asked.append(seq)
        if arrivals:
            recorded.extend(arrivals.pop(0))
        return [event for event in recorded if event.seq > seq]

    shown: list[Event] = []
    waited: list[None] = []
    ended = asyncio.run(follow_events(load_after, shown.append, poll_s=0, waiting=lambda: waited.append(None)))
    assert len(waited) == 1  # once, at the empty first read
    assert ended == history[-1]
    assert shown == history
    assert asked == [0, 0, 1, 1, 4]


def test_a_refusal_after_the_end_leaves_the_saga_ended() -> None:
    run = SagaRun(TRIP, saga_id="t-follow")
    run.start()
    for step in ("book_flight", "book_hotel", "charge_card", "send_itinerary"):
        run.ok(step)
    run.start()  # a second start of an ended saga: refused and recorded
    run.cancel()  # too late: refused and recorded

    async def load_after(seq: int) -> list[Event]:
        return [event for event in run.events if event.seq > seq]

    shown: list[Event] = []
    ended = asyncio.run(follow_events(load_after, shown.append, poll_s=0))
    assert type(ended).__name__ == "SagaCompleted" and shown == run.events
    assert [type(event).__name__ for event in shown[-2:]] == ["SagaRejected", "SagaCancelRefused"]


def test_a_saga_a_lever_reopened_is_followed_to_its_new_end() -> None:
    run = SagaRun(TRIP, saga_id="t-resumed")
    run.start()
    run.ok("book_flight")
    run.fail("book_hotel", error="SoldOut")
    run.comp_fail("book_flight", error="CancellationRefused")
    assert run.status().value == "COMPENSATION_FAILED"
    failed_at = run.events[-1].seq
    arrivals = [[], run.events[:]]  # the resume is recorded a poll after the follow started
    run.resume()
    run.comp_ok("book_flight")
    arrivals.append(run.events[failed_at:])
    recorded: list[Event] = []

    async def load_after(seq: int) -> list[Event]:
        if arrivals:
            recorded.extend(event for event in arrivals.pop(0) if event not in recorded)
        return [event for event in recorded if event.seq > seq]

    shown: list[Event] = []
    ended = asyncio.run(follow_events(load_after, shown.append, poll_s=0, after_seq=failed_at,
                                      lever="ResumeCompensation"))
    assert type(ended).__name__ == "SagaCompensated"
    assert shown == run.events[failed_at:] and shown[0].seq == failed_at + 1

    async def everything_after(seq: int) -> list[Event]:
        return [event for event in run.events if event.seq > seq]

    # From its start, with the first end and the resume in one read: the follow ends at the latest end.
    shown.clear()
    assert type(asyncio.run(follow_events(everything_after, shown.append, poll_s=0))).__name__ == "SagaCompensated"
    assert shown == run.events


def test_a_followed_event_is_one_line_naming_the_columns_that_may_be_empty() -> None:
    run = SagaRun(TRIP, saga_id="t-line")
    run.start()
    run.fail("book_hotel", error="SoldOut")
    failed = next(event for event in run.events if type(event).__name__ == "StepFailed")
    assert _line(failed) == (f"{failed.seq:>3}  1970-01-01 00:16:40.000  StepFailed  step=book_hotel  attempt=1  "
                             "error=SoldOut  error_message=book_hotel said SoldOut, retryable=False")


def test_a_start_refused_while_nothing_started_ends_the_follow_and_a_later_refusal_does_not() -> None:
    refused = SagaRun(None, saga_id="t-refused")
    refused.start(saga_type="cruise")  # no such type: SagaRejected, nothing started
    run = SagaRun(TRIP, saga_id="t-follow")
    run.start()
    run.start()  # a second start of a running saga: refused and recorded, the saga goes on
    for step in ("book_flight", "book_hotel", "charge_card", "send_itinerary"):
        run.ok(step)
    for history, last in ((refused.events, "SagaRejected"), (run.events, "SagaCompleted")):
        shown: list[Event] = []

        async def load_after(seq: int, history: list[Event] = history) -> list[Event]:
            return [event for event in history if event.seq > seq]

        ended = asyncio.run(follow_events(load_after, shown.append, poll_s=0))
        assert type(ended).__name__ == last
        assert shown == history
    assert "SagaRejected" in [type(event).__name__ for event in run.events]
