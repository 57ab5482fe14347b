"""The saga types of the console's repair tests (test_console_repairs.py): the trip in two versions, and the same
steps deployed as a second type, ``holiday``, which a test takes away from the orchestrator and then deploys."""

from __future__ import annotations

from dataclasses import replace

from saga_orchestrator.participants.trip.definition import TRIP

HOLIDAY = replace(TRIP, saga_type="holiday")
"""The trip's steps as saga type ``holiday`` (its input is a trip request)."""

TRIP_V1 = "saga_orchestrator.participants.trip:TRIP"
BOTH_VERSIONS = f"{TRIP_V1},tests.chaos.tools.versions:TRIP_V2"
DEPLOYED = f"{BOTH_VERSIONS},tests.browser.repairs_trip:HOLIDAY"
"""Everything: the stack's and the console's. A test takes a part away from the orchestrator (a restart), and
brings it back as the fix."""
