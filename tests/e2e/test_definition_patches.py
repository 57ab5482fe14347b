"""A fraud check added before the charge of trips already running, behind a patch marker, on the real orchestrator
over Kafka and Postgres: 200 trips run on v1, half past the point (their charge sent) and half before it (their
bookings sent). ``saga definitions check`` passes the patch and reports the same edit without its marker with the
ids of the trips it would break; the deploy starts; every trip past the point finishes on its path without the
check, every trip before it records the patch and is checked before its charge, new trips are checked too;
``check --patch`` says when the marker can go; ``saga audit`` and ``saga verify`` agree."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest

from bench.trip_changes import FRAUD_CHECK_PATCH, FRAUD_CHECKED
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.participants.trip import TRIP
from saga_orchestrator.schemas import event_types as ev
from saga_orchestrator.schemas import wire
from tests.chaos.crash_tools import wait_until_ready
from tests.e2e.harness import Stack, saga_cli, start_happy_trips, terminal_events, wait_for

pytestmark = pytest.mark.e2e

ORIGINAL = "saga_orchestrator.participants.trip:TRIP"
PATCHED = "bench.trip_changes:FRAUD_CHECKED"
UNMARKED = "bench.trip_changes:CHECK_BEFORE_CHARGE"
BOOKINGS, PAYING = "flight+hotel", "payment+notification"
PER_GROUP = 100


@pytest.fixture(scope="module")
def before(settings: Settings) -> Settings:
    return settings.model_copy(update={"saga_participants": f"{BOOKINGS},{PAYING}", "saga_definitions": ORIGINAL})


@pytest.fixture(scope="module")
def after(before: Settings) -> Settings:
    return before.model_copy(update={"saga_definitions": PATCHED})


@pytest.fixture(scope="module")
def stack(before: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    running = Stack(before, tmp_path_factory.mktemp("logs"))
    try:
        yield running
    finally:
        running.stop()


async def _histories(settings: Settings, saga_ids: list[str]) -> dict[str, list[ev.Event]]:
    conn = await asyncpg.connect(settings.dsn())
    try:
        rows = await conn.fetch("SELECT saga_id, body FROM saga.events WHERE saga_id = ANY($1) ORDER BY saga_id, seq",
                                saga_ids)
    finally:
        await conn.close()
    found: dict[str, list[ev.Event]] = defaultdict(list)
    for row in rows:
        found[row["saga_id"]].append(wire.decode_event(row["body"]))
    return found


async def _sent_steps(settings: Settings, saga_ids: list[str]) -> dict[str, list[str]]:
    """Each saga's forward steps in the order their first attempt was sent."""
    sent: dict[str, list[str]] = {}
    for saga_id, events in (await _histories(settings, saga_ids)).items():
        steps = [e.step for e in events if isinstance(e, ev.StepCommandSent)]
        sent[saga_id] = list(dict.fromkeys(steps))
    return sent


async def _check(settings: Settings, *args: str) -> tuple[int, dict[str, Any]]:
    result = await saga_cli(settings, "definitions", "check", *args, "--json", timeout_s=120)
    assert result.stdout.strip(), result.stderr[-3000:]
    return result.returncode, json.loads(result.stdout)


async def test_a_fraud_check_added_behind_a_marker_reaches_only_the_trips_before_it(
        stack: Stack, before: Settings, after: Settings) -> None:
    # 100 trips past the point: bookings answered, their charge sent, no payment worker to answer it.
    stack.start("orchestrator", BOOKINGS)
    await wait_until_ready(stack, ["orchestrator", BOOKINGS])
    past = await start_happy_trips(before, "past", PER_GROUP)

    async def charges_sent() -> bool:
        return all("charge_card" in steps for steps in (await _sent_steps(before, past)).values()) and len(
            await _sent_steps(before, past)) == PER_GROUP
    assert await wait_for(charges_sent, 120, interval_s=1)
    stack.stop()
    # 100 trips before it: the orchestrator alone, their bookings sent and unanswered.
    stack.start("orchestrator")
    await wait_until_ready(stack, ["orchestrator"])
    ahead = await start_happy_trips(before, "ahead", PER_GROUP)

    async def bookings_sent() -> bool:
        sent = await _sent_steps(before, ahead)
        return len(sent) == PER_GROUP and all(set(s) == {"book_flight", "book_hotel"} for s in sent.values())
    assert await wait_for(bookings_sent, 120, interval_s=1)
    stack.stop()

    # Before the deploy: the patched trip passes the check; the same edit without its marker breaks the 100
    # trips past the point, each named.
    code, patched = await _check(before, "--definitions", PATCHED)
    assert code == 0 and patched["ok"], patched
    code, unmarked = await _check(before, "--definitions", UNMARKED)
    assert code == 1 and not unmarked["ok"]
    broken = {s["saga_id"] for s in unmarked["sagas"] if s["verdict"] == "DIFFERENT"}
    assert broken == set(past), sorted(broken ^ set(past))[:5]
    code, old_path = await _check(after, "--patch", FRAUD_CHECK_PATCH)
    assert (code, old_path["running_on_old_path"]) == (1, 2 * PER_GROUP), old_path

    # The deploy: the patched trip starts (its v1 keeps the trips' shape), with every participant.
    stack.start("orchestrator", BOOKINGS, PAYING, extra_env={"SAGA_DEFINITIONS": PATCHED})
    await wait_until_ready(stack, ["orchestrator", BOOKINGS, PAYING])
    new = await start_happy_trips(after, "new", 20)
    ended = await terminal_events(after, [*past, *ahead, *new], 240)
    assert {type(event).__name__ for event in ended.values()} == {"SagaCompleted"}
    assert len(ended) == 2 * PER_GROUP + 20

    histories = await _histories(after, [*past, *ahead, *new])
    sent = {saga_id: list(dict.fromkeys(e.step for e in events if isinstance(e, ev.StepCommandSent)))
            for saga_id, events in histories.items()}
    taken = {saga_id for saga_id, events in histories.items() if any(isinstance(e, ev.PatchTaken) for e in events)}
    checked_first = ["book_flight", "book_hotel", "fraud_check", "charge_card", "send_itinerary"]
    assert all(sorted(sent[s][:2]) == ["book_flight", "book_hotel"] for s in sent)
    assert {s for s in past if "fraud_check" in sent[s]} == set()  # past the point: kept their path
    assert all(any(isinstance(e, ev.StepSkipped) and e.step == "fraud_check" for e in histories[s]) for s in past)
    assert {s for s in ahead if sent[s][2:] != checked_first[2:]} == set()  # before it: checked, then charged
    assert taken == set(ahead)  # ... and each recorded that it took the patch; new trips needed no record
    assert {s for s in new if sent[s][2:] != checked_first[2:]} == set()
    started = {e.definition_fingerprint for s in new for e in histories[s] if isinstance(e, ev.SagaStarted)}
    assert started == {FRAUD_CHECKED.fingerprint} != {TRIP.fingerprint}

    # After: nothing runs on the old path, so the marker can go; the check and the audits agree.
    code, old_path = await _check(after, "--patch", FRAUD_CHECK_PATCH)
    assert (code, old_path["running_on_old_path"]) == (0, 0), old_path
    code, still = await _check(after, "--definitions", PATCHED)
    assert code == 0 and still["ok"], still
    audited = await saga_cli(after, "audit", timeout_s=180)
    assert audited.returncode == 0, audited.stdout[-3000:] + audited.stderr[-3000:]
    verified = await saga_cli(after, "verify", *past[:10], *ahead[:10], *new[:10], timeout_s=180)
    assert verified.returncode == 0, verified.stdout[-3000:] + verified.stderr[-3000:]
