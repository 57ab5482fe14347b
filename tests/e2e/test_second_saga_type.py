"""A saga type defined only in the tests runs through the same services, without engine changes."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from saga_orchestrator.cli.demo_cmd import DEMO_TIMEOUT_S
from saga_orchestrator.cli.dlq_cmd import read_parked
from saga_orchestrator.client import SagaClient, SagaInputError, StartRefused
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.event_types import StepFailed, StepSucceeded
from saga_orchestrator.schemas.message_types import StartSaga
from saga_orchestrator.schemas.registry import DEFAULT_SCHEMA_PATH, SchemaRegistry, load_tree
from saga_orchestrator.schemas.topics import Topics
from tests.chaos.crash_tools import restart, started_and_ready
from tests.chaos.tools.kafka_tools import wait_caught_up
from tests.conftest import module_stack
from tests.e2e.checkout import CHECKOUT_REQUEST, SCHEMA_DIR
from tests.e2e.harness import Stack, publish, run_refused, saga_cli, terminal_events, wait_for

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def checkout_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={
        "saga_definitions": "saga_orchestrator.participants.trip:TRIP,tests.e2e.checkout:CHECKOUT",
        "saga_participants": "tests.e2e.checkout:INVENTORY,tests.e2e.checkout:BILLING,tests.e2e.checkout:SHIPPING",
        "saga_schema_path": os.pathsep.join((DEFAULT_SCHEMA_PATH, str(SCHEMA_DIR))),
    })


@pytest.fixture(scope="module")
def stack(checkout_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    log_dir: Path = tmp_path_factory.mktemp("logs")
    yield from module_stack(started_and_ready(checkout_settings, log_dir), log_dir)


def _schemas() -> SchemaRegistry:
    base = SchemaRegistry.from_directory()
    return SchemaRegistry([*base.current_schemas(), *load_tree(SCHEMA_DIR).values()])


def _encode_order(order: dict[str, object]) -> bytes:
    return _schemas().encode(CHECKOUT_REQUEST, order)


async def _ledger(settings: Settings, saga_id: str) -> dict[str, list[str]]:
    conn = await asyncpg.connect(settings.dsn())
    try:
        found = {}
        for schema in ("inventory", "billing", "shipping"):
            rows = await conn.fetch(f"SELECT status FROM {schema}.ledger WHERE saga_id = $1 ORDER BY 1", saga_id)
            found[schema] = [row["status"] for row in rows]
        return found
    finally:
        await conn.close()


@pytest.mark.parametrize(("sku", "address", "terminal", "ledger"), [
    ("SKU-1", "1 Main St", "SagaCompleted",
     {"inventory": ["reserved"], "billing": ["authorized"], "shipping": ["shipped"]}),
    ("SKU-GONE", "1 Main St", "SagaCompensated", {"inventory": [], "billing": ["released"], "shipping": []}),
    ("SKU-1", "nowhere", "SagaCompensated", {"inventory": ["released"], "billing": ["released"], "shipping": []}),
])
async def test_checkout_runs_through_the_same_services(stack: Stack, sku: str, address: str, terminal: str,
                                                       ledger: dict[str, list[str]]) -> None:
    topics = Topics(stack.settings.saga_topic_prefix)
    saga_id = f"order-{uuid.uuid4().hex[:8]}"
    order = {"order_id": saga_id, "sku": sku, "quantity": 1, "amount_cents": 999, "address": address}
    start = StartSaga(saga_id=saga_id, saga_type="checkout", tenant_id="shop-1", input=_encode_order(order))
    await publish(stack.settings, topics.start, saga_id.encode(), wire.encode_start(start))
    ended = await terminal_events(stack.settings, [saga_id], DEMO_TIMEOUT_S)
    assert type(ended[saga_id]).__name__ == terminal
    assert await _ledger(stack.settings, saga_id) == ledger


async def test_the_python_client_starts_a_saga_follows_it_to_its_end_and_hears_of_a_refused_start(
        stack: Stack) -> None:
    settings = stack.settings
    client = SagaClient.from_settings(settings, schemas=_schemas())
    async with client:
        outcomes, results = {}, {}
        for sku in ("SKU-1", "SKU-GONE"):
            saga_id = f"client-{uuid.uuid4().hex[:8]}"
            order = {"order_id": saga_id, "sku": sku, "quantity": 1, "amount_cents": 999, "address": "1 Main St"}
            handle = await client.start("checkout", saga_id, order, tenant_id="shop-1")
            events = [event async for event in handle.events(timeout_s=DEMO_TIMEOUT_S)]
            assert [event.seq for event in events] == list(range(1, len(events) + 1))  # each once, in order
            assert await _event_types(settings, saga_id) == [type(event).__name__ for event in events]
            outcomes[sku] = type(events[-1]).__name__
            assert handle.outputs == {e.step: e.output for e in events if isinstance(e, StepSucceeded) and e.output}
            results[sku] = handle.outputs
            # Followed later, from the beginning of its partition: the same end.
            assert await client.handle(saga_id).result(timeout_s=30) == events[-1]
        assert outcomes == {"SKU-1": "SagaCompleted", "SKU-GONE": "SagaCompensated"}
        assert results["SKU-1"] == {"reserve_inventory": b"inventory:reserved", "authorize_payment":
                                    b"billing:authorized", "ship": b"shipping:shipped"}

        again = await client.start("checkout", saga_id, order)
        with pytest.raises(StartRefused, match="duplicate StartSaga"):
            await again.result(timeout_s=30)
        with pytest.raises(SagaInputError) as bad:
            await client.start("checkout", "client-bad", {**order, "quantity": "one"})
        assert bad.value.field == "saga_input" and "quantity" in bad.value.problem


async def test_a_deferred_answer_given_later_with_saga_answer_decides_the_step(stack: Stack) -> None:
    settings, topics = stack.settings, Topics(stack.settings.saga_topic_prefix)
    shipping = "tests.e2e.checkout:SHIPPING"
    sagas = {verdict: f"held-{uuid.uuid4().hex[:8]}" for verdict in ("shipped", "refused")}
    for saga_id in sagas.values():
        order = {"order_id": saga_id, "sku": "SKU-1", "quantity": 1, "amount_cents": 999, "address": "hold"}
        start = StartSaga(saga_id=saga_id, saga_type="checkout", tenant_id=None, input=_encode_order(order))
        await publish(settings, topics.start, saga_id.encode(), wire.encode_start(start))

    async def held() -> list[dict[str, object]]:
        listed = await saga_cli(settings, "awaiting", shipping, "--json")
        assert listed.returncode == 0, listed.stderr
        rows = [json.loads(line) for line in listed.stdout.splitlines()]
        return [row for row in rows if row["saga_id"] in sagas.values()]

    async def all_held() -> bool:
        return len(await held()) == len(sagas)

    assert await wait_for(all_held, DEMO_TIMEOUT_S), "shipping did not defer"
    assert {row["idempotency_key"] for row in await held()} == {f"{s}:ship" for s in sagas.values()}
    answered = await saga_cli(settings, "answer", shipping, f"{sagas['shipped']}:ship", "--output",
                              '{"tracking": "Z1"}')
    assert answered.returncode == 0, answered.stdout + answered.stderr
    refused = await saga_cli(settings, "answer", shipping, f"{sagas['refused']}:ship", "--fail", "NotApproved")
    assert refused.returncode == 0, refused.stdout + refused.stderr
    again = await saga_cli(settings, "answer", shipping, f"{sagas['refused']}:ship", "--output", "{}")
    assert again.returncode == 2 and f"{sagas['refused']}:ship was answered already (FAILED at" in again.stderr

    ended = await terminal_events(settings, list(sagas.values()), DEMO_TIMEOUT_S)
    assert {verdict: type(ended[saga_id]).__name__ for verdict, saga_id in sagas.items()} == {
        "shipped": "SagaCompleted", "refused": "SagaCompensated"}
    assert await _ledger(settings, sagas["refused"]) == {"inventory": ["released"], "billing": ["released"],
                                                        "shipping": ["held"]}


async def _event_types(settings: Settings, saga_id: str) -> list[str]:
    conn = await asyncpg.connect(settings.dsn())
    try:
        rows = await conn.fetch("SELECT event_type FROM saga.events WHERE saga_id = $1 ORDER BY seq", saga_id)
        return [row["event_type"] for row in rows]
    finally:
        await conn.close()


async def test_a_start_rejected_before_its_type_was_deployed_runs_when_its_dead_letter_is_replayed(
        stack: Stack) -> None:
    settings, topics = stack.settings, Topics(stack.settings.saga_topic_prefix)
    saga_id = f"order-{uuid.uuid4().hex[:8]}"
    order = {"order_id": saga_id, "sku": "SKU-1", "quantity": 1, "amount_cents": 999, "address": "1 Main St"}
    start = StartSaga(saga_id=saga_id, saga_type="checkout", tenant_id=None, input=_encode_order(order))

    async def dead_lettered() -> bool:
        return any(p.letter and p.letter.saga_id == saga_id for p in await read_parked(settings))

    await restart(stack, "orchestrator",
                  extra_env={"SAGA_DEFINITIONS": "saga_orchestrator.participants.trip:TRIP"})
    try:
        await publish(settings, topics.start, saga_id.encode(), wire.encode_start(start))
        assert await wait_for(dead_lettered, 30), "the start of an unknown saga type was not dead-lettered"
    finally:
        await restart(stack, "orchestrator")  # checkout is deployed again
    assert await _event_types(settings, saga_id) == ["SagaRejected"]

    async def indexed() -> bool:  # the orchestrator indexes saga.dlq within about a second
        listed = await saga_cli(settings, "dlq", "list", "--saga", saga_id, "--json")
        assert listed.returncode == 0, listed.stderr
        return bool(listed.stdout.strip())

    assert await wait_for(indexed, 30, 0.5), "the letter was not indexed"
    listed = await saga_cli(settings, "dlq", "list", "--saga", saga_id, "--json")
    letter = json.loads(listed.stdout)
    assert (letter["source_topic"], letter["consumer"]) == (topics.start, "orchestrator")
    assert "unknown saga_type 'checkout'" in letter["reason"]

    replayed = await saga_cli(settings, "dlq", "replay", letter["position"], "--operator", "ana")
    assert replayed.returncode == 0, replayed.stderr
    assert f"{letter['position']} published to {topics.start} (saga {saga_id}); recorded in its history" in " ".join(
        replayed.stdout.split())
    ended = await terminal_events(settings, [saga_id], DEMO_TIMEOUT_S)
    assert type(ended[saga_id]).__name__ == "SagaCompleted"
    assert await _ledger(settings, saga_id) == {"inventory": ["reserved"], "billing": ["authorized"],
                                                "shipping": ["shipped"]}

    # The same letter replayed again is the same message: the orchestrator's inbox drops it. Each replay is
    # recorded in the saga's history (OperatorAction DlqReplay, from saga.control), which is all that grows.
    history = await _event_types(settings, saga_id)
    again = await saga_cli(settings, "dlq", "replay", "--saga", saga_id, "--operator", "ana")
    assert again.returncode == 0, again.stderr
    lagging = await wait_caught_up(settings, {f"{topics.prefix}saga-orchestrator": [topics.start, topics.control]}, 60)
    assert not lagging, f"the orchestrator did not read the second replay: {lagging}"
    after = await _event_types(settings, saga_id)
    saga_events = [name for name in history if name != "OperatorAction"]
    assert [name for name in after if name != "OperatorAction"] == saga_events
    assert after.count("OperatorAction") == 2 and saga_events[:2] == ["SagaRejected", "SagaStarted"]


# -- a deployment whose settings cannot work: refused at start with the setting named, or answered ---------------

def test_an_orchestrator_that_cannot_read_an_input_record_refuses_to_start(checkout_settings: Settings) -> None:
    line = run_refused(checkout_settings, "run", "orchestrator", SAGA_SCHEMA_PATH=DEFAULT_SCHEMA_PATH)
    assert f"saga type checkout (version 1) reads {CHECKOUT_REQUEST}" in line
    assert f"SAGA_SCHEMA_PATH='{DEFAULT_SCHEMA_PATH}'" in line


def test_a_participant_that_cannot_read_its_input_record_refuses_to_start(checkout_settings: Settings) -> None:
    line = run_refused(checkout_settings, "run", "participant", "tests.e2e.checkout:INVENTORY",
                       SAGA_SCHEMA_PATH=DEFAULT_SCHEMA_PATH)
    assert f"participant inventory reads {CHECKOUT_REQUEST}" in line and "SAGA_SCHEMA_PATH=" in line


@pytest.mark.parametrize(("env", "expected"), [
    ({"SAGA_SCHEMA_PATH": DEFAULT_SCHEMA_PATH}, f"saga type checkout reads {CHECKOUT_REQUEST}, which no schema "
                                                "folder of SAGA_SCHEMA_PATH="),
    ({"SAGA_SCHEMA_PATH": "no.such.package"}, "SAGA_SCHEMA_PATH names 'no.such.package', which is neither a folder"),
    ({"SAGA_DEFINITIONS": "no_such_module:CHECKOUT"}, "SAGA_DEFINITIONS='no_such_module:CHECKOUT': cannot import"),
])
def test_the_command_line_names_the_setting_in_one_line(checkout_settings: Settings, env: dict[str, str],
                                                         expected: str) -> None:
    order = {"order_id": "o-1", "sku": "SKU-1", "quantity": 1, "amount_cents": 999, "address": "1 Main St"}
    line = run_refused(checkout_settings, "start", "checkout", "--id", "o-1", "--input", json.dumps(order), **env)
    assert expected in line


async def test_a_command_whose_input_a_worker_cannot_read_is_answered_unprocessable_and_dead_lettered(
        stack: Stack, tmp_path: Path) -> None:
    # The orchestrator runs a newer CheckoutRequest (a field added, with a default) than the workers have: it
    # passes their start-up check (they know the record by name), and still they cannot read its bytes.
    settings, topics = stack.settings, Topics(stack.settings.saga_topic_prefix)
    newer = tmp_path / "checkout_v2"
    (newer / "inputs").mkdir(parents=True)
    schema = json.loads((SCHEMA_DIR / "inputs" / "checkout_request.avsc").read_text())
    schema["fields"].append({"name": "gift_wrap", "type": "boolean", "default": False})
    (newer / "inputs" / "checkout_request.avsc").write_text(json.dumps(schema))
    newer_path = os.pathsep.join((DEFAULT_SCHEMA_PATH, str(newer)))
    schemas = SchemaRegistry([*SchemaRegistry.from_directory().current_schemas(), *load_tree(newer).values()])
    saga_id = f"order-{uuid.uuid4().hex[:8]}"
    order = {"order_id": saga_id, "sku": "SKU-1", "quantity": 1, "amount_cents": 999, "address": "1 Main St",
             "gift_wrap": True}
    start = StartSaga(saga_id=saga_id, saga_type="checkout", tenant_id=None,
                      input=schemas.encode(CHECKOUT_REQUEST, order))
    await restart(stack, "orchestrator", extra_env={"SAGA_SCHEMA_PATH": newer_path})
    try:
        await publish(settings, topics.start, saga_id.encode(), wire.encode_start(start))
        ended = await terminal_events(settings, [saga_id], DEMO_TIMEOUT_S)
    finally:
        await restart(stack, "orchestrator")
    # Both first steps failed for good before anything took effect: the saga turned back with nothing to undo
    # (the dead letters ask an operator to act, not the saga).
    assert type(ended[saga_id]).__name__ == "SagaCompensated"
    failures = await _step_failures(settings, saga_id)
    assert failures == {"reserve_inventory": "Unprocessable", "authorize_payment": "Unprocessable"}

    letters = [parked.letter for parked in await read_parked(settings)
               if parked.letter is not None and parked.letter.saga_id == saga_id]
    assert {letter.consumer for letter in letters} == {"participant-inventory", "participant-billing"}
    assert all("SAGA_SCHEMA_PATH" in letter.reason and "UnknownFingerprint" in letter.reason for letter in letters)


async def _step_failures(settings: Settings, saga_id: str) -> dict[str, str]:
    conn = await asyncpg.connect(settings.dsn())
    try:
        rows = await conn.fetch("SELECT body FROM saga.events WHERE saga_id = $1 AND event_type = 'StepFailed'",
                                saga_id)
    finally:
        await conn.close()
    events = [wire.decode_event(row["body"]) for row in rows]
    return {event.step: event.error_type for event in events if isinstance(event, StepFailed)}
