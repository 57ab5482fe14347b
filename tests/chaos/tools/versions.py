"""A second version of the trip saga, for tests that deploy one version and then take it away."""

from __future__ import annotations

from dataclasses import replace

from saga_orchestrator.participants.trip.definition import TRIP

TRIP_V2 = replace(TRIP, version=2)
"""The trip saga as version 2: the same steps (a deployment that a rollback removes)."""
