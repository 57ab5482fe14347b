"""The console's dead letters on a real Kafka and Postgres: the newest letters listed with their sagas' states and
recorded replays, and a replay by the signed-in operator published with its headers, recorded for the saga's
history on saga.control, held back for an ended saga's step reply unless forced, and audited."""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from saga_orchestrator.console.app import console_app
from saga_orchestrator.console.identity import add_user
from saga_orchestrator.infra.db import create_pool
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.operations.dead_letters import Parked, read_parked
from saga_orchestrator.orchestrator.bootstrap import prepare
from saga_orchestrator.orchestrator.outbound import summary_of
from saga_orchestrator.orchestrator.ports import StoredEvent, Writes
from saga_orchestrator.orchestrator.store.postgres import PostgresStore, migrate
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.message_types import DeadLetter, Lever
from saga_orchestrator.schemas.topics import Topics
from saga_orchestrator.testing.history import SagaRun
from tests.e2e.harness import index_dead_letters, publish, read_topic

pytestmark = pytest.mark.integration
SIGNED = {"Authorization": "Basic " + base64.b64encode(b"anna:a long password").decode()}


def _letter(topics: Topics, saga_id: str, source_offset: int, failed_at: int, value: bytes | None) -> DeadLetter:
    return DeadLetter(source_topic=topics.results("flight"), source_partition=0, source_offset=source_offset,
                      consumer="orchestrator", reason="reply refused: no such attempt", failed_at=failed_at,
                      saga_id=saga_id, original_key=saga_id.encode(), original_value=value,
                      original_headers=(("message_id", b"m-original"), ("trace", b"t-1")))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def letters(settings: Settings) -> AsyncIterator[dict[str, Parked]]:
    """On saga.dlq, oldest first: a reply of a running saga, one of a completed saga, one whose value was not
    kept, a record that is no letter. The running saga's history records one earlier replay of its letter."""
    await prepare(settings)
    topics = Topics(settings.saga_topic_prefix)
    flight = topics.results("flight")
    now = time.time_ns() // 1_000_000
    for offset, (saga_id, value) in enumerate((("dl-running", b"reply-1"), ("dl-done", b"reply-2"), ("dl-big", None)),
                                              start=11):
        letter = _letter(topics, saga_id, offset, now - 5000 + offset * 100, value)
        await publish(settings, topics.dlq, saga_id.encode(), wire.encode_dead_letter(letter))
    await publish(settings, topics.dlq, b"junk", b"not a dead letter")
    parked = await read_parked(settings.kafka(), topics.dlq)
    found = {p.letter.saga_id if p.letter and p.letter.saga_id else "junk": p for p in parked}
    running, done = SagaRun(TRIP, saga_id="dl-running", now=now), SagaRun(TRIP, saga_id="dl-done", now=now)
    running.start()
    running.ok("book_flight")
    running.operate(Lever.DLQ_REPLAY, reason=f"letter {found['dl-running'].position} from {flight}"
                                             f" 0:11 to {flight}: first try")
    done.start()
    for step in ("book_flight", "book_hotel", "charge_card", "send_itinerary"):
        done.ok(step)
    pool = await create_pool(settings.dsn(), 2)
    await migrate(pool)
    await index_dead_letters(settings, pool, 4)  # what the orchestrator does: the console lists from the index
    async with PostgresStore(pool).begin() as uow:
        await uow.write(Writes(
            events=[StoredEvent(saga_id=e.saga_id, seq=e.seq, event_type=type(e).__name__, body=wire.encode_event(e),
                                recorded_at_ms=e.occurred_at) for run in (running, done) for e in run.events],
            summaries=[summary_of(run.saga) for run in (running, done)]))
    await pool.close()
    yield found


async def _client(settings: Settings, users: Path | None = None) -> AsyncIterator[httpx.AsyncClient]:
    if users is not None:
        add_user(users, "anna", "a long password")
        settings = settings.model_copy(update={"saga_console_levers": True, "saga_console_users": str(users)})
    app = console_app(settings)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://console", headers=SIGNED) as client:
        yield client


async def _replay(client: httpx.AsyncClient, status: int = 200, **body: Any) -> Any:
    answer = await client.post("/api/v1/dead-letters/replay", json=body)
    assert answer.status_code == status, answer.text
    return answer.json()


@pytest.mark.asyncio(loop_scope="module")
async def test_the_newest_letters_are_listed_with_their_sagas_and_recorded_replays(
        settings: Settings, letters: dict[str, Parked]) -> None:
    async for client in _client(settings):
        listed = (await client.get("/api/v1/dead-letters")).json()
        assert [(item["position"], item.get("saga_id"), item.get("saga_status")) for item in listed] == [
            (letters["junk"].position, None, None), (letters["dl-big"].position, "dl-big", None),
            (letters["dl-done"].position, "dl-done", "COMPLETED"),
            (letters["dl-running"].position, "dl-running", "RUNNING")]
        assert [r["operator"] for r in listed[3]["replays"]] == ["ops"]
        assert [item.get("held_unless_forced") for item in listed] == [False, False, True, False]
        assert [item["position"] for item in (await client.get("/api/v1/dead-letters?limit=1")).json()] == [
            letters["junk"].position]
        assert (await client.post("/api/v1/dead-letters/replay", json={"positions": ["0:0"]})).status_code == 403


@pytest.mark.asyncio(loop_scope="module")
async def test_a_replay_is_published_for_the_operator_recorded_held_back_when_ended_and_audited(
        settings: Settings, letters: dict[str, Parked], tmp_path: Path) -> None:
    topics = Topics(settings.saga_topic_prefix)
    flight = topics.results("flight")
    running, done, big = (letters[name].position for name in ("dl-running", "dl-done", "dl-big"))
    async for client in _client(settings, tmp_path / "users"):
        first = await _replay(client, positions=[running, done, big], reason="flight fixed")
        assert first["operator"] == "anna"
        assert [(r["position"], r["saga_id"], r["recorded"]) for r in first["replayed"]] == [
            (running, "dl-running", True)]
        why = {r["position"]: r["why"] for r in first["refused"]}
        assert why[done].startswith("saga dl-done ended COMPLETED, and a step's command or reply after its end")
        assert why[done].endswith("tick force to replay it anyway")
        assert why[big].startswith("the letter does not hold the original value")
        forced = await _replay(client, positions=[done], force=True)
        assert [(r["position"], r["topic"]) for r in forced["replayed"]] == [(done, flight)]
        assert "no dead letter at 7:99999" in (await _replay(client, 400, positions=["7:99999"]))["detail"]
        assert "not a dead-letter position" in (await _replay(client, 400, positions=["x"]))["detail"]
        audit = (await client.get("/api/v1/audit")).json()
        assert [(e["operator"], e["action"], e["target"], e["outcome"].split(":")[0]) for e in audit[:6]] == [
            ("anna", "DlqReplay", "dead letters x", "refused"),
            ("anna", "DlqReplay", "dead letters 7:99999", "refused"),
            ("anna", "DlqReplay", f"dead letter {done}", f"published to {flight}; recorded in saga "
                                                          "dl-done's history"),
            ("anna", "DlqReplay", f"dead letter {running}", f"published to {flight}; recorded in "
                                                             "saga dl-running's history"),
            ("anna", "DlqReplay", f"dead letter {done}", "refused"),
            ("anna", "DlqReplay", f"dead letter {big}", "refused")]
        assert audit[3]["detail"] == {"saga": "dl-running", "from": f"{flight} 0:11", "reason": "flight fixed",
                                      "force": False}
    published = await read_topic(settings, flight)
    replayed = {r.key: r for r in published}  # two keys, so two partitions maybe: no order between them
    assert len(published) == 2
    assert {key: r.value for key, r in replayed.items()} == {b"dl-running": b"reply-1", b"dl-done": b"reply-2"}
    headers = dict(replayed[b"dl-running"].headers)
    assert (headers["replayed_by"], headers["replayed_from"], headers["message_id"], headers["trace"]) == (
        b"anna", f"{topics.dlq}:{running}".encode(), f"dlq-replay:{topics.dlq}:{running}".encode(), b"t-1")
    notes = [wire.decode_operate(r.value) for r in await read_topic(settings, topics.control)]
    assert sorted((n.saga_id, n.action, n.operator, n.reason) for n in notes) == [
        ("dl-done", Lever.DLQ_REPLAY, "anna", f"letter {done} from {flight} 0:12 to {flight}"),
        ("dl-running", Lever.DLQ_REPLAY, "anna", f"letter {running} from {flight} 0:11 to {flight}: flight fixed")]


def _inbox_letters(items: list[dict[str, Any]]) -> set[str]:
    """The positions (P:O) of the dead letters among inbox items."""
    return {":".join(str(int(part)) for part in item["item_id"].split(":")[1:]) for item in items
            if item["kind"] == "dead_letter"}


@pytest.mark.asyncio(loop_scope="module")
async def test_a_dismissal_needs_a_reason_takes_the_letter_out_of_the_inbox_and_is_audited(
        settings: Settings, letters: dict[str, Parked], tmp_path: Path) -> None:
    junk, big = letters["junk"].position, letters["dl-big"].position
    async for client in _client(settings, tmp_path / "users"):
        inbox = (await client.get("/api/v1/inbox", params={"kind": "dead_letter", "limit": 500})).json()
        assert {junk, big} <= _inbox_letters(inbox["items"])
        for body, said in (({"positions": [junk]}, "a reason is required"),
                           ({"positions": [junk], "reason": " "}, "a reason is required"),
                           ({"positions": ["7:99999"], "reason": "garbage"}, "no dead letter at 7:99999")):
            answer = await client.post("/api/v1/dead-letters/dismiss", json=body)
            assert answer.status_code == 400 and said in answer.json()["detail"], answer.text
        done = await client.post("/api/v1/dead-letters/dismiss",
                                 json={"positions": [junk], "reason": "garbage nobody can read"})
        assert done.status_code == 200 and done.json() == {"operator": "anna", "dismissed": [junk]}
        page = await client.get("/dead-letters")
        assert "Dismiss</button>" in page.text and "Nothing is re-sent" in page.text
        assert "dismissed by anna: garbage nobody can read" in page.text
        fragment = await client.post("/dead-letters/dismiss", data={"position": big, "reason": "value not kept"})
        assert f"{big} dismissed by anna: value not kept; nothing re-sent" in fragment.text
        refused = await client.post("/dead-letters/dismiss", data={"position": big, "reason": ""})
        assert 'class="flash error"' in refused.text and "a reason is required" in refused.text
        inbox = (await client.get("/api/v1/inbox", params={"kind": "dead_letter", "limit": 500})).json()
        assert not {junk, big} & _inbox_letters(inbox["items"])
        listed = {item["position"]: item for item in (await client.get("/api/v1/dead-letters")).json()}
        assert listed[junk]["dismissed"]["operator"] == "anna"
        assert listed[junk]["dismissed"]["reason"] == "garbage nobody can read"
        assert listed[letters["dl-running"].position]["dismissed"] is None
        audit = (await client.get("/api/v1/audit")).json()
        assert [(e["operator"], e["action"], e["target"], e["outcome"].split(":")[0]) for e in audit[:5]] == [
            ("anna", "DlqDismiss", f"dead letters {big}", "refused"),
            ("anna", "DlqDismiss", f"dead letter {big}", "dismissed; nothing re-sent"),
            ("anna", "DlqDismiss", f"dead letter {junk}", "dismissed; nothing re-sent"),
            ("anna", "DlqDismiss", "dead letters 7:99999", "refused"),
            ("anna", "DlqDismiss", f"dead letters {junk}", "refused")]
        assert audit[2]["detail"] == {"saga": None, "reason": "garbage nobody can read"}
    async for client in _client(settings):  # a read-only console dismisses nothing
        assert (await client.post("/api/v1/dead-letters/dismiss",
                                  json={"positions": [junk], "reason": "x"})).status_code == 403
