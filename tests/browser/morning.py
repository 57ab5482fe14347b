"""The deployment of the operator's morning (test_console_morning.py): the trip in versions 1 and 2, and the
courier checkout, whose courier fails for good after its pivot for an unmapped address (a Redrive books it) and
waits for a person's answer for address "ask". ``ROLLED_BACK`` is the same without trip version 2: a rollback
that quarantines the trips running on it, and ``MORNING`` again is the fix."""

from __future__ import annotations

from pathlib import Path

from examples.shop.checkout import inventory, mail, payments, shipping
from saga_orchestrator.authoring import Participant, SagaApp
from saga_orchestrator.participants.kit.typed import ParticipantSpec
from saga_orchestrator.participants.trip import TRIP
from saga_orchestrator.participants.trip import app as trip_app
from tests.chaos.tools.versions import TRIP_V2
from tests.e2e.apps import courier, redrivable

_PARTICIPANTS: list[ParticipantSpec | Participant] = [
    *(trip_app.participant(name) for name in trip_app.participant_names()),
    inventory, payments, shipping, mail, courier]
_SCHEMAS = Path(__file__).resolve().parents[2] / "examples" / "shop" / "schemas"

MORNING = SagaApp(sagas=[TRIP, TRIP_V2, redrivable], participants=_PARTICIPANTS, schema_folder=_SCHEMAS)
ROLLED_BACK = SagaApp(sagas=[TRIP, redrivable], participants=_PARTICIPANTS, schema_folder=_SCHEMAS)
WORKERS = "notification,flight+hotel+payment+inventory+payments+shipping+mail+courier"
"""Notification alone in a worker (the participant that is down this morning); every other one in one more."""
