"""Apps that cannot work, each one way, for the start-up refusals: the shop checkout's parts put together wrong."""

from __future__ import annotations

from pathlib import Path

from examples.shop.checkout import Order, app, checkout, inventory, mail, payments, shipping
from saga_orchestrator.orchestrator.authoring import SagaApp, StepContext, participant

NOBODY_SHIPS = SagaApp(sagas=[checkout], participants=[inventory, payments, mail], schema_folder=app.schema_folder)
"""The checkout sends to participant shipping, which no participant of this app serves."""

shipping_elsewhere = participant("shipping")


@shipping_elsewhere.action
async def hand_over(step: StepContext, order: Order) -> None:
    return None


SHIPS_OTHERWISE = SagaApp(sagas=[checkout], participants=[inventory, payments, shipping_elsewhere, mail],
                          schema_folder=app.schema_folder)
"""The checkout names action create_shipment of participant shipping, which this shipping lacks."""

NOT_WRITTEN = SagaApp(sagas=[checkout], participants=[inventory, payments, shipping, mail],
                      schema_folder=Path(__file__).parent / "no_schemas_here")
"""Its records were never written to its schema folder."""
