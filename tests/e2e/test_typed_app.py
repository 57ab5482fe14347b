"""A team's own saga as the README shows it (``examples/shop/checkout.py``: typed, one module, one app object), run
through the same services as ``saga run all`` starts them, named by SAGA_APP alone; and every way an app or the
settings can be wrong, refused at start in one line that names the setting."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from examples.shop.checkout import Order
from saga_orchestrator.cli.context import database
from saga_orchestrator.cli.demo_cmd import DEMO_TIMEOUT_S
from saga_orchestrator.cli.run_cmd import service_commands
from saga_orchestrator.client import SagaClient
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.schemas.event_types import SagaCompensated, SagaCompleted
from tests.chaos.crash_tools import started_and_ready
from tests.conftest import module_stack
from tests.e2e.harness import Stack, run_refused, saga_cli

pytestmark = pytest.mark.e2e

SHOP = "examples.shop.checkout:app"


@pytest.fixture(scope="module")
def shop_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"saga_app": SHOP, "saga_participants": ""})


@pytest.fixture(scope="module")
def stack(shop_settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    log_dir: Path = tmp_path_factory.mktemp("logs")
    yield from module_stack(started_and_ready(shop_settings, log_dir), log_dir)


def _order(saga_id: str, **changes: object) -> Order:
    base = Order(order_id=saga_id, sku="SKU-1", quantity=1, amount_cents=999, address="1 Main St",
                 email=f"{saga_id}@shop.test")
    return base.model_copy(update=changes)


def test_the_app_names_every_service_of_saga_run_all(shop_settings: Settings) -> None:
    assert list(service_commands(shop_settings)) == ["orchestrator", "inventory", "payments", "shipping", "mail"]


async def test_the_shop_checkout_runs_through_the_services(stack: Stack) -> None:
    run = uuid.uuid4().hex[:6]
    orders = {f"ok-{run}": _order(f"ok-{run}"), f"big-{run}": _order(f"big-{run}", quantity=50),
              f"bounce-{run}": _order(f"bounce-{run}", email="x@bounce.test")}
    async with SagaClient.from_settings(stack.settings) as client:
        handles = {saga_id: await client.start("checkout", saga_id, order) for saga_id, order in orders.items()}
        ended = {saga_id: await handle.result(timeout_s=DEMO_TIMEOUT_S) for saga_id, handle in handles.items()}
    assert isinstance(ended[f"ok-{run}"], SagaCompleted)
    assert isinstance(ended[f"big-{run}"], SagaCompensated)  # OutOfStock: payment voided or withdrawn
    assert isinstance(ended[f"bounce-{run}"], SagaCompleted)  # the mailbox was full twice
    history = await saga_cli(stack.settings, "history", f"bounce-{run}")
    # Piped, the table keeps whole cells: the event names are not cut to the 80 columns of no terminal.
    assert history.returncode == 0 and history.stdout.count("StepRetryScheduled") == 2, history.stdout
    assert "…" not in history.stdout


async def test_the_checkout_gets_saga_effects_and_saga_verify_from_its_declarations_alone(stack: Stack) -> None:
    run = uuid.uuid4().hex[:6]
    orders = {f"fx-ok-{run}": _order(f"fx-ok-{run}"), f"fx-big-{run}": _order(f"fx-big-{run}", quantity=50)}
    async with SagaClient.from_settings(stack.settings) as client:
        handles = [await client.start("checkout", saga_id, order) for saga_id, order in orders.items()]
        for handle in handles:
            await handle.result(timeout_s=DEMO_TIMEOUT_S)
    shown = await saga_cli(stack.settings, "effects", f"fx-big-{run}", "--json")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    counts = {name: found["counts"] for name, found in json.loads(shown.stdout)["participants"].items()}
    # The payment ran in parallel with the reservation that failed: authorised then voided, or withdrawn before
    # its participant took it (the fence); never authorised and left standing.
    payments = counts.pop("payments")
    assert payments in ({"done": 1, "undone": 1}, {"done": 0, "undone": 0}), payments
    assert counts == {"inventory": {"done": 0, "undone": 0}, "shipping": {"done": 0, "undone": 0},
                      "mail": {"done": 0, "undone": 0}}
    verified = await saga_cli(stack.settings, "verify", *orders)
    assert verified.returncode == 0, verified.stdout + verified.stderr

    # A payment voided behind the saga's back: verify sees the completed order's authorisation undone.
    async with database(stack.settings) as pool:
        await pool.execute("UPDATE payments.ledger SET state = 'released' WHERE saga_id = $1", f"fx-ok-{run}")
    broken = await saga_cli(stack.settings, "verify", "--json", *orders)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    problems = [v["problem"] for v in json.loads(broken.stdout)["violations"]]
    assert problems == ["authorise_payment (payments: done=1, undone=1): a COMPLETED saga must hold its effect "
                        "exactly once here"], problems


async def test_the_apps_records_are_written_and_checked(shop_settings: Settings) -> None:
    checked = await saga_cli(shop_settings, "schemas", "check")
    assert checked.returncode == 0 and "2 records up to date" in checked.stdout, checked.stdout + checked.stderr


@pytest.mark.parametrize(("app", "service", "expected"), [
    ("tests.e2e.apps:NOBODY_SHIPS", "orchestrator", "step create_shipment sends to participant shipping, which no "
                                                    "participant of the app serves"),
    ("tests.e2e.apps:SHIPS_OTHERWISE", "orchestrator", "step create_shipment names action create_shipment of "
                                                       "participant shipping, which has no such action"),
    ("tests.e2e.apps:SHIPS_OTHERWISE", "mail", "names action create_shipment of participant shipping"),
    ("tests.e2e.apps:NOT_WRITTEN", "orchestrator", "are missing or not what their pydantic models generate now: "
                                                   "run `saga schemas write`"),
    ("tests.e2e.apps:NOWHERE", "orchestrator", "SAGA_APP='tests.e2e.apps:NOWHERE': module tests.e2e.apps has no "
                                               "attribute NOWHERE"),
])
def test_an_app_that_cannot_work_is_refused_at_start(shop_settings: Settings, app: str, service: str,
                                                    expected: str) -> None:
    args = ["run", "orchestrator"] if service == "orchestrator" else ["run", "participant", service]
    line = run_refused(shop_settings, *args, SAGA_APP=app)
    assert f"SAGA_APP={app!r}" in line and expected in line


async def test_settings_that_disagree_between_processes_are_refused(stack: Stack) -> None:
    # The running services made their topics with SAGA_TOPIC_PARTITIONS=8; a worker started with 4 would put
    # sagas on other partitions than the orchestrator's timers and outbox shards expect.
    line = run_refused(stack.settings, "run", "participant", "mail", SAGA_TOPIC_PARTITIONS="4")
    assert "SAGA_TOPIC_PARTITIONS=4, but" in line and "every process of a deployment must use" in line
