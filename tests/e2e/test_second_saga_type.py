"""A saga type defined only in the tests runs through the same services, without engine changes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from cli.demo_cmd import DEMO_TIMEOUT_S
from cli.feed import EventFeed
from infra.settings import Settings
from orchestrator import wire
from orchestrator.domain.messages import StartSaga
from schemas.registry import SchemaRegistry, load_tree
from schemas.topics import Topics
from tests.chaos.crash_tools import wait_until_ready
from tests.conftest import module_stack
from tests.e2e.checkout import CHECKOUT_REQUEST, SCHEMA_DIR
from tests.e2e.harness import Stack, publish, start_stack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def checkout_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={
        "saga_definitions": "orchestrator.sagas.trip:TRIP,tests.e2e.checkout:CHECKOUT",
        "saga_participants": "tests.e2e.checkout:INVENTORY,tests.e2e.checkout:BILLING,tests.e2e.checkout:SHIPPING",
        "saga_schema_path": str(SCHEMA_DIR),
    })


@pytest.fixture(scope="module")
def stack(checkout_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    log_dir: Path = tmp_path_factory.mktemp("logs")
    yield from module_stack(_started(checkout_settings, log_dir), log_dir)


async def _started(settings: Settings, log_dir: Path) -> Stack:
    stack = await start_stack(settings, log_dir)
    await wait_until_ready(stack, stack.labels)
    return stack


def _encode_order(order: dict[str, object]) -> bytes:
    base = SchemaRegistry.from_directory()
    registry = SchemaRegistry([*base.current_schemas(), *load_tree(SCHEMA_DIR).values()])
    return registry.encode(CHECKOUT_REQUEST, order)


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
    feed = EventFeed(stack.settings.kafka_servers(), topics.events)
    await feed.start()
    try:
        ended = await feed.wait_terminal([saga_id], DEMO_TIMEOUT_S)
    finally:
        await feed.stop()
    assert type(ended[saga_id]).__name__ == terminal
    assert await _ledger(stack.settings, saga_id) == ledger
