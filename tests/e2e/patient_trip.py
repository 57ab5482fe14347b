"""The trip saga with step timeouts longer than a participant worker's failover.

The demo's trip times a step out after 2 s (three attempts: about 6 s); a participant worker killed -9 keeps its
partitions for the 10 s of its group session before another worker takes them, so with the demo's timeouts a
worker crash compensates the sagas it had in hand. Production timeouts are longer than a failover: these are.
The services load it as ``SAGA_DEFINITIONS=tests.e2e.patient_trip:PATIENT_TRIP`` (with the repository on
``PYTHONPATH``).
"""

from __future__ import annotations

from dataclasses import replace

from saga_orchestrator.participants.trip.definition import TRIP

STEP_TIMEOUT_MS = 15_000

PATIENT_TRIP = replace(TRIP, steps=tuple(replace(step, timeout_ms=STEP_TIMEOUT_MS,
                                                 compensation_timeout_ms=STEP_TIMEOUT_MS) for step in TRIP.steps))
