"""The trip saga end to end: started through Kafka, outcome read from saga.events, effects from Postgres."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import random
import re
import socket
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from saga_orchestrator.cli.demo_cmd import cancel, drive
from saga_orchestrator.cli.run_cmd import health_port, service_commands, service_environment
from saga_orchestrator.client.event_feed import EventFeed
from saga_orchestrator.infra.health_server import fetch_health
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.orchestrator.audit import audit_all
from saga_orchestrator.participants.trip import PARTICIPANTS
from saga_orchestrator.participants.trip.effects import collect_effects
from saga_orchestrator.participants.trip.scenarios import COMPLETED_EFFECTS, SCENARIOS, effects, mismatches, observed
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.event_types import SagaCancelRefused, SagaRejected, SagaStarted, StepCommandSent
from saga_orchestrator.schemas.topics import Topics
from tests.chaos.crash_tools import started_and_warm
from tests.conftest import module_stack
from tests.e2e.harness import Stack, publish, read_topic, saga_cli, terminal_events, wait_for

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]

TIMEOUT_S = 60.0
TERMINAL_STATUS_OF = {"SagaCompleted": "COMPLETED", "SagaCompensated": "COMPENSATED", "SagaFailed": "FAILED",
                      "SagaCompensationFailed": "COMPENSATION_FAILED", "SagaCancelled": "CANCELLED",
                      "SagaCompletedWithFailures": "COMPLETED_WITH_FAILURES"}


@pytest.fixture(scope="module")
def stack(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    log_dir: Path = tmp_path_factory.mktemp("logs")
    # Health endpoints on: GET /metrics is part of what is checked.
    observed = settings.model_copy(update={"saga_health_port": _free_ports(len(service_commands(settings)))})
    yield from module_stack(started_and_warm(observed, log_dir), log_dir)


def _free_ports(count: int) -> int:
    """The first of ``count`` consecutive free ports (``saga run all`` counts up from it, one per service)."""
    for _ in range(100):
        base = random.randrange(20_000, 60_000)
        with contextlib.ExitStack() as probes:
            try:
                for port in range(base, base + count):
                    probes.enter_context(socket.socket()).bind(("127.0.0.1", port))
            except OSError:
                continue
        return base
    raise RuntimeError(f"no {count} consecutive free ports found")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def trip_run(stack: Stack) -> tuple[dict[str, str], dict[str, str]]:
    """One saga per scenario, all at once; returns planned (id → scenario) and ended (id → terminal event)."""
    run_id = uuid.uuid4().hex[:6]
    planned = {f"e2e-{run_id}-{name}": name for name in SCENARIOS}
    ended = await drive(stack.settings, planned, TIMEOUT_S)
    return planned, ended


async def _effects(settings: Settings, saga_id: str) -> dict[str, int]:
    pool = await asyncpg.create_pool(settings.dsn(), min_size=1, max_size=2)
    try:
        return observed(await collect_effects(pool, saga_id))
    finally:
        await pool.close()


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
async def test_each_trigger_ends_as_documented(scenario: str, trip_run: tuple[dict[str, str], dict[str, str]],
                                               stack: Stack) -> None:
    planned, ended = trip_run
    saga_id = next(saga for saga, name in planned.items() if name == scenario)
    assert SCENARIOS[scenario].problems(ended.get(saga_id), await _effects(stack.settings, saga_id)) == []


async def test_the_itinerary_names_the_bookings_and_the_charge_the_earlier_steps_made(
        trip_run: tuple[dict[str, str], dict[str, str]], stack: Stack) -> None:
    planned, _ = trip_run
    saga_id = next(saga for saga, name in planned.items() if name == "happy")
    conn = await asyncpg.connect(stack.settings.dsn())
    try:
        sent = json.loads(await conn.fetchval("SELECT itinerary FROM notification.sent WHERE saga_id = $1", saga_id))
        made = {step: await conn.fetchval(f"SELECT {column} FROM {table} WHERE saga_id = $1", saga_id)
                for step, table, column in (("book_flight", "flight.bookings", "booking_id"),
                                            ("book_hotel", "hotel.bookings", "booking_id"),
                                            ("charge_card", "payment.charges", "charge_id"))}
    finally:
        await conn.close()
    assert sent == {"book_flight": {"booking_id": made["book_flight"]},
                    "book_hotel": {"booking_id": made["book_hotel"]},
                    "charge_card": {"charge_id": made["charge_card"]}}


async def test_a_slow_charge_is_waited_for_not_sent_again_and_charged_once(
        trip_run: tuple[dict[str, str], dict[str, str]], stack: Stack) -> None:
    planned, _ = trip_run
    saga_id = next(saga for saga, name in planned.items() if name == "card_slow")
    feed = EventFeed(stack.settings.kafka(), Topics(stack.settings.saga_topic_prefix).events)
    await feed.start()
    try:
        await feed.read_to_end()
    finally:
        await feed.stop()
    history = feed.history(saga_id)
    charge_commands = [e for e in history if isinstance(e, StepCommandSent) and e.step == "charge_card"]
    assert len(charge_commands) == 1, "a worker picked the charge up in time: its late answer is waited for"
    assert any(type(e).__name__ == "StepTimedOut" for e in history)
    assert type(history[-1]).__name__ == "SagaCompleted"
    assert (await _effects(stack.settings, saga_id))["charged"] == 1


async def test_duplicate_start_starts_nothing_and_is_recorded(stack: Stack) -> None:
    topics = Topics(stack.settings.saga_topic_prefix)
    saga_id = f"e2e-dup-{uuid.uuid4().hex[:6]}"
    body = wire.encode_start(SCENARIOS["happy"].start(saga_id))
    await publish(stack.settings, topics.start, saga_id.encode(), body)
    await publish(stack.settings, topics.start, saga_id.encode(), body)
    feed = EventFeed(stack.settings.kafka(), topics.events)
    await feed.start()
    try:
        await feed.wait_terminal([saga_id], TIMEOUT_S)
        for _ in range(50):  # the rejection may land after the terminal event
            if any(isinstance(e, SagaRejected) for e in feed.history(saga_id)):
                break
            await feed.poll(200)
    finally:
        await feed.stop()
    history = feed.history(saga_id)
    assert type(feed.terminal[saga_id]).__name__ == "SagaCompleted"
    rejections = [e for e in history if isinstance(e, SagaRejected)]
    assert len(rejections) == 1 and "duplicate" in rejections[0].reason
    assert sum(type(e).__name__ == "SagaStarted" for e in history) == 1
    assert mismatches(COMPLETED_EFFECTS, await _effects(stack.settings, saga_id)) == []


async def test_cancel_after_the_pivot_is_refused_and_recorded(stack: Stack) -> None:
    topics = Topics(stack.settings.saga_topic_prefix)
    saga_id = f"e2e-late-cancel-{uuid.uuid4().hex[:6]}"
    ended = await drive(stack.settings, {saga_id: "happy"}, TIMEOUT_S)
    assert ended[saga_id] == "SagaCompleted"
    await cancel(stack.settings, saga_id, "too late")
    feed = EventFeed(stack.settings.kafka(), topics.events)
    await feed.start()
    try:
        refused: list[SagaCancelRefused] = []
        for _ in range(100):
            await feed.poll(200)
            refused = [e for e in feed.history(saga_id) if isinstance(e, SagaCancelRefused)]
            if refused:
                break
    finally:
        await feed.stop()
    assert refused, "the refused cancel must be recorded"
    assert "COMPLETED" in refused[0].reason
    assert (await _effects(stack.settings, saga_id))["refunded"] == 0


async def test_bad_input_goes_to_the_dead_letter_topic_and_the_consumer_keeps_going(stack: Stack) -> None:
    topics = Topics(stack.settings.saga_topic_prefix)
    garbage = b"\xc3\x01not-avro-at-all"
    await publish(stack.settings, topics.start, b"e2e-garbage", garbage)
    unknown_id = f"e2e-unknown-type-{uuid.uuid4().hex[:6]}"
    start = SCENARIOS["happy"].start(unknown_id)
    cruise = wire.encode_start(type(start)(saga_id=unknown_id, saga_type="cruise", tenant_id=None, input=start.input))
    await publish(stack.settings, topics.start, unknown_id.encode(), cruise)
    after_id = f"e2e-after-bad-{uuid.uuid4().hex[:6]}"
    ended = await drive(stack.settings, {after_id: "happy"}, TIMEOUT_S)
    assert ended[after_id] == "SagaCompleted", "a valid saga after bad input still completes"
    letters = [wire.decode_dead_letter(r.value) for r in await read_topic(stack.settings, topics.dlq)]
    by_value = {letter.original_value: letter for letter in letters}
    assert garbage in by_value and "undecodable" in by_value[garbage].reason
    assert cruise in by_value and "unknown saga_type 'cruise'" in by_value[cruise].reason
    assert by_value[cruise].saga_id == unknown_id
    assert not stack.exited(), f"services exited: {stack.exited()}"


def _docs_block(after: str, language: str) -> str:
    """The first ``language`` block of docs/starting.md after the words ``after``."""
    text = (ROOT / "docs" / "starting.md").read_text()
    assert after in text, f"docs/starting.md no longer says {after!r}"
    found = re.search(rf"```{language}\n(.*?)```", text.split(after, 1)[1], flags=re.DOTALL)
    assert found is not None, f"docs/starting.md has no {language} block after {after!r}"
    return found.group(1)


async def _run_docs_commands(stack: Stack, block: str, saga_id: str) -> str:
    """A block of the docs' shell commands run by bash as a user would (``saga`` on the PATH, the stack's
    settings in the environment, its example saga id ``trip-42`` replaced by ``saga_id``); what it printed."""
    env = {**service_environment(stack.settings), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = await asyncio.to_thread(subprocess.run, ["bash", "-e", "-c", block.replace("trip-42", saga_id)],
                                   cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


async def test_the_documented_commands_start_a_trip_and_follow_it_to_its_end(stack: Stack) -> None:
    saga_id = f"cli-doc-{uuid.uuid4().hex[:8]}"
    printed = await _run_docs_commands(stack, _docs_block("With the CLI:", "bash"), saga_id)
    assert "SagaCompleted" in printed and "COMPLETED" in printed.rsplit("SagaCompleted", 1)[1], printed
    assert await _effects(stack.settings, saga_id) == COMPLETED_EFFECTS


async def test_the_documented_client_without_this_project_starts_a_trip_that_completes(
        stack: Stack, tmp_path: Path) -> None:
    program = tmp_path / "outside_client.py"
    program.write_text(_docs_block("Without this project, a client that uses only `fastavro` and `aiokafka`", "python"))
    saga_id = f"outside-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "KAFKA_BOOTSTRAP_SERVERS": stack.settings.kafka_servers(),
           "SAGA_TOPIC_PREFIX": stack.settings.saga_topic_prefix}
    # Run from the project's root: the program reads the schema files as a user's copy of them.
    done = await asyncio.to_thread(subprocess.run, [sys.executable, str(program), saga_id], cwd=ROOT, env=env,
                                   capture_output=True, text=True, timeout=120)

    assert done.returncode == 0, done.stdout + done.stderr
    printed = [line.split() for line in done.stdout.splitlines()]
    assert printed[0] == ["1", "SagaStarted"] and printed[-1][1] == "SagaCompleted", done.stdout
    assert [line[0] for line in printed] == [str(seq) for seq in range(1, len(printed) + 1)], done.stdout
    ended = await terminal_events(stack.settings, [saga_id], TIMEOUT_S)
    assert type(ended[saga_id]).__name__ == "SagaCompleted"
    assert await _effects(stack.settings, saga_id) == COMPLETED_EFFECTS


async def _metrics(settings: Settings, label: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    # A worker busy with a batch on a loaded machine may take more than the probe's 2 s to answer: what is
    # checked here is what it counts, not how fast it says so.
    body = await fetch_health(settings.saga_health_host, health_port(settings, label), "/metrics", timeout_s=15)
    assert body is not None, f"{label} serves no /metrics"
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(body.decode()) for sample in family.samples}


def _sample(metrics: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return metrics.get((name, frozenset(labels.items())), 0.0)


def _lags(metrics: dict[tuple[str, frozenset[tuple[str, str]]], float], group: str) -> dict[str, float]:
    """``saga_consumer_lag`` of consumer group ``group``, by topic:partition."""
    return {f"{labels['topic']}:{labels['partition']}": value for (name, pairs), value in metrics.items()
            if name == "saga_consumer_lag" and (labels := dict(pairs))["group"] == group}


async def test_metrics_count_sagas_by_end_state_step_outcomes_commands_and_dead_letters(
        trip_run: tuple[dict[str, str], dict[str, str]], stack: Stack) -> None:
    settings = stack.settings
    _, ended = trip_run
    orchestrator = await _metrics(settings, "orchestrator")
    assert _sample(orchestrator, "saga_sagas_started_total", saga_type="trip") >= len(ended)
    for terminal, count in Counter(ended.values()).items():
        status = TERMINAL_STATUS_OF[terminal]
        assert _sample(orchestrator, "saga_sagas_ended_total", saga_type="trip", status=status) >= count, terminal
        assert _sample(orchestrator, "saga_duration_seconds_count", saga_type="trip", status=status) >= count
    # Atlantis: the hotel is sold out and the flight compensated.
    assert _sample(orchestrator, "saga_step_events_total", saga_type="trip", step="book_hotel", outcome="failed") >= 1
    assert _sample(orchestrator, "saga_step_events_total", saga_type="trip", step="book_flight",
                   outcome="compensated") >= 1
    hotel = await _metrics(settings, "hotel")
    assert _sample(hotel, "saga_participant_commands_total", participant="hotel", disposition="recorded") >= len(ended)
    # The signals to page on: each step timed, each consumer's lag known, the tables' gauges refreshed.
    assert _sample(orchestrator, "saga_step_duration_seconds_count", saga_type="trip", step="book_flight",
                   outcome="succeeded") >= 1
    assert _lags(orchestrator, f"{settings.saga_topic_prefix}saga-orchestrator")
    assert _lags(hotel, f"{settings.saga_topic_prefix}saga-participant-hotel")
    assert ("saga_outbox_oldest_age_seconds", frozenset({("table", "saga.outbox")})) in orchestrator
    assert ("saga_outbox_rows", frozenset({("table", "hotel.outbox")})) in hotel
    assert ("saga_timers_overdue", frozenset()) in orchestrator

    before = _sample(orchestrator, "saga_messages_dead_lettered_total")
    await publish(settings, Topics(settings.saga_topic_prefix).start, b"e2e-metrics-garbage", b"not avro")

    async def counted() -> bool:
        return _sample(await _metrics(settings, "orchestrator"), "saga_messages_dead_lettered_total") > before

    assert await wait_for(counted, 30), "the dead letter was not counted"


async def test_audit_agrees_with_the_store_and_detects_a_tampered_event(
        trip_run: tuple[dict[str, str], dict[str, str]], stack: Stack) -> None:
    differences, statuses, figures = await audit_all(stack.settings)
    assert differences == [], differences[:5]
    assert figures["events on the topic"] == figures["events in the store"] > 0
    assert statuses["COMPLETED"] >= 4
    planned, _ = trip_run
    victim = next(saga for saga, name in planned.items() if name == "happy")
    conn = await asyncpg.connect(stack.settings.dsn())
    try:
        original = wire.decode_event(
            await conn.fetchval("SELECT body FROM saga.events WHERE saga_id = $1 AND seq = 1", victim))
        assert isinstance(original, SagaStarted)
        forged = wire.encode_event(dataclasses.replace(original, tenant_id="forged"))
        await conn.execute("UPDATE saga.events SET body = $2 WHERE saga_id = $1 AND seq = 1", victim, forged)
    finally:
        await conn.close()
    differences, _, _ = await audit_all(stack.settings)
    assert [(d.saga_id, d.seq) for d in differences] == [(victim, 1)]
    conn = await asyncpg.connect(stack.settings.dsn())
    try:  # put it back: later tests audit the same store
        await conn.execute("UPDATE saga.events SET body = $2 WHERE saga_id = $1 AND seq = 1", victim,
                           wire.encode_event(original))
    finally:
        await conn.close()


async def test_a_compensation_failed_trip_resumed_after_a_waiver_ends_compensated_with_its_flight_cancelled(
        trip_run: tuple[dict[str, str], dict[str, str]], stack: Stack) -> None:
    planned, ended = trip_run
    saga_id = next(saga for saga, name in planned.items() if name == "uncancellable")
    assert ended[saga_id] == "SagaCompensationFailed"

    # The waiver and the resume, as docs/starting.md gives them; its last command follows the saga to its end.
    printed = await _run_docs_commands(stack, _docs_block("For `cust_uncancellable` the fix is", "bash"), saga_id)

    assert "SagaCompensated" in printed, printed
    assert await _effects(stack.settings, saga_id) == effects(flight=(1, 1))
    verified = await saga_cli(stack.settings, "verify", saga_id)
    assert verified.returncode == 0, verified.stdout + verified.stderr


async def test_start_wait_prints_the_saga_until_it_ends_and_exits_by_how_it_ended(stack: Stack) -> None:
    run_id = uuid.uuid4().hex[:6]
    outcomes = {}
    for scenario in ("happy", "atlantis"):
        saga_id = f"e2e-wait-{run_id}-{scenario}"
        trip = json.dumps(SCENARIOS[scenario].trip(saga_id))
        outcomes[scenario] = await saga_cli(stack.settings, "start", "trip", "--id", saga_id, "--input", trip,
                                            "--wait", timeout_s=TIMEOUT_S)
    happy, atlantis = outcomes["happy"], outcomes["atlantis"]
    assert happy.returncode == 0, happy.stdout + happy.stderr
    assert "StepSucceeded  step=charge_card" in happy.stdout
    assert happy.stdout.rstrip().endswith("ended: SagaCompleted")
    assert atlantis.returncode == 1, atlantis.stdout + atlantis.stderr
    assert "StepFailed  step=book_hotel  attempt=1  error=SoldOut" in atlantis.stdout
    assert atlantis.stdout.rstrip().endswith("ended: SagaCompensated")

    again = await saga_cli(stack.settings, "start", "trip", "--id", f"e2e-wait-{run_id}-happy", "--input",
                           json.dumps(SCENARIOS["happy"].trip("x")), "--wait")
    assert again.returncode == 2
    assert "already exists, so this start would be refused" in " ".join(again.stderr.split())
    without_wait = await saga_cli(stack.settings, "start", "trip", "--id", f"e2e-wait-{run_id}-happy", "--input",
                                  json.dumps(SCENARIOS["happy"].trip("x")))
    assert without_wait.returncode == 2 and "published" not in without_wait.stdout, without_wait.stdout
    assert "already exists, so this start would be refused" in " ".join(without_wait.stderr.split())
    forced = await saga_cli(stack.settings, "start", "trip", "--id", f"e2e-wait-{run_id}-happy", "--input",
                            json.dumps(SCENARIOS["happy"].trip("x")), "--force")
    assert forced.returncode == 0 and "published StartSaga" in forced.stdout, forced.stdout + forced.stderr


async def test_cancel_and_resume_refuse_what_the_event_store_says_cannot_apply(
        trip_run: tuple[dict[str, str], dict[str, str]], stack: Stack) -> None:
    planned, _ = trip_run
    happy = next(saga for saga, name in planned.items() if name == "happy")
    refusals = {
        ("resume", happy): f"saga '{happy}' is COMPLETED: only a COMPENSATION_FAILED saga can be resumed",
        ("cancel", happy, "--reason", "late"): f"saga '{happy}' already ended COMPLETED: there is nothing to cancel",
        ("cancel", "e2e-no-such-saga", "--reason", "x"): "no saga 'e2e-no-such-saga' in the event store",
    }
    for args, message in refusals.items():
        refused = await saga_cli(stack.settings, *args)
        assert refused.returncode == 2, refused.stdout
        assert message in " ".join(refused.stderr.split())
    forced = await saga_cli(stack.settings, "cancel", happy, "--reason", "late", "--force")
    assert forced.returncode == 0, forced.stderr  # published; the orchestrator refuses and records it

    async def refusal_recorded() -> bool:
        conn = await asyncpg.connect(stack.settings.dsn())
        try:
            return bool(await conn.fetchval("SELECT count(*) FROM saga.events WHERE saga_id = $1"
                                            " AND event_type = 'SagaCancelRefused'", happy))
        finally:
            await conn.close()

    assert await wait_for(refusal_recorded, TIMEOUT_S)


async def test_a_starts_trace_context_travels_on_every_message_of_its_saga(stack: Stack) -> None:
    topics = Topics(stack.settings.saga_topic_prefix)
    saga_id = f"e2e-trace-{uuid.uuid4().hex[:6]}"
    trace = f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"
    await publish(stack.settings, topics.start, saga_id.encode(), wire.encode_start(SCENARIOS["happy"].start(saga_id)),
                  headers=[("message_id", f"{saga_id}:start".encode()), ("traceparent", trace.encode())])
    ended = await terminal_events(stack.settings, [saga_id], TIMEOUT_S)
    assert type(ended[saga_id]).__name__ == "SagaCompleted"
    saga_topics = {topics.events, *(topics.commands(p) for p in PARTICIPANTS),
                   *(topics.results(p) for p in PARTICIPANTS)}
    seen: dict[str, set[bytes | None]] = {}
    for topic in saga_topics:
        for record in await read_topic(stack.settings, topic):
            if record.key == saga_id.encode():
                seen.setdefault(topic, set()).add(dict(record.headers).get("traceparent"))
    assert set(seen) == saga_topics
    assert set.union(*seen.values()) == {trace.encode()}


async def test_purged_sagas_still_agree_with_the_topic_and_still_refuse_a_second_start(
        trip_run: tuple[dict[str, str], dict[str, str]], stack: Stack) -> None:
    planned, _ = trip_run
    purged = await saga_cli(stack.settings, "purge", "--ended-before", "0s", "--operator", "e2e")
    assert purged.returncode == 0, purged.stdout + purged.stderr
    count = int(purged.stdout.split("purged ")[1].split()[0])
    assert count >= len(planned)
    conn = await asyncpg.connect(stack.settings.dsn())
    try:
        async def relayed() -> bool:
            return not await conn.fetchval("SELECT count(*) FROM saga.outbox")

        assert await wait_for(relayed, TIMEOUT_S)
        differences, statuses, figures = await audit_all(stack.settings)
        assert differences == [], differences[:5]
        assert figures["purged sagas"] == count and statuses["PURGED"] == count
        assert figures["purged sagas whose earlier events the topic no longer holds"] == 0

        happy = next(saga for saga, name in planned.items() if name == "happy")
        await publish(stack.settings, Topics(stack.settings.saga_topic_prefix).start, happy.encode(),
                      wire.encode_start(SCENARIOS["happy"].start(happy)))

        async def refused() -> bool:
            last = await conn.fetchval("SELECT event_type FROM saga.events WHERE saga_id = $1"
                                       " ORDER BY seq DESC LIMIT 1", happy)
            return bool(last == "SagaRejected")

        assert await wait_for(refused, TIMEOUT_S)
        kinds = [row["event_type"] for row in await conn.fetch(
            "SELECT event_type FROM saga.events WHERE saga_id = $1 ORDER BY seq", happy)]
        assert kinds == ["SagaPurged", "SagaRejected"]
    finally:
        await conn.close()
    verified = await saga_cli(stack.settings, "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
