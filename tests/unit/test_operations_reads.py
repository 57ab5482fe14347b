"""The operator's reads (``operations.reads``) run on the test kit's memory store: what the console shows of
sagas run in a ``SagaEnvironment``."""

from __future__ import annotations

from saga_orchestrator.operations import bulk_jobs
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.participants.trip.scenarios import SCENARIOS
from saga_orchestrator.testing import SagaEnvironment, fail, fail_transiently


async def test_the_consoles_reads_show_the_sagas_of_a_saga_environment() -> None:
    env = SagaEnvironment(TRIP)
    env.script(("payment", "charge_card"), fail_transiently(1))
    done = await env.start("trip", SCENARIOS["happy"].trip("t-1"))
    await env.result(done)  # after its retry's backoff
    env.script(("hotel", "book_hotel"), fail("NoRooms"))
    undone = await env.start("trip", SCENARIOS["happy"].trip("t-2"))
    await env.result(undone)

    listed = await env.reads.sagas()
    assert [row.saga_id for row in listed] == [done, undone]  # the oldest started first
    assert {row.saga_id: row.status for row in listed} == {done: "COMPLETED", undone: "COMPENSATED"}
    compensated = await env.reads.sagas(bulk_jobs.Selection(statuses=("COMPENSATED",)))
    assert [row.saga_id for row in compensated] == [undone]
    assert await env.reads.counts() == {"COMPENSATED": 1, "COMPLETED": 1}

    view = await env.reads.saga(undone)
    assert view is not None and view.state is not None and view.fold_error is None
    assert view.state.status.value == "COMPENSATED" and [e.seq for e in view.events] == list(
        range(1, len(view.events) + 1))
    assert await env.reads.saga("no-such-saga") is None
    assert [seq for seq, _ in await env.reads.encoded_events(done)] == [e.seq for e in env.history(done)]

    fleet = await env.reads.fleet()
    assert fleet.by_status() == {"COMPENSATED": 1, "COMPLETED": 1} and fleet.compensation_rate_hour == 0.5
    assert await env.reads.wedged(min_failures=1) == []  # both ended
