"""The project's own deploy check: trips recorded mid-flight (tests/histories/trip, exported as `saga history
--json` writes them) must be decided the same way by the trip as it is now. An edit of the trip that would change
the path of trips already running fails here, before any deploy."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from saga_orchestrator.cli.main import app

RECORDED = Path(__file__).parent.parent / "histories" / "trip"
TRIP = "saga_orchestrator.participants.trip:TRIP"


def test_every_recorded_running_trip_is_decided_the_same_by_the_trip_of_today() -> None:
    result = CliRunner().invoke(app, ["definitions", "check", "--histories", str(RECORDED), "--definitions", TRIP],
                                env={"SAGA_DEFINITIONS": TRIP, "SAGA_APP": ""})
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1] == (
        "6 same next decision, 0 takes a patched path, 0 different next decision, 0 would not fold, 0 skipped")


def test_the_recorded_trips_would_catch_an_edit_in_place() -> None:
    edited = "bench.trip_changes:CHECK_BEFORE_CHARGE"
    result = CliRunner().invoke(app, ["definitions", "check", "--histories", str(RECORDED), "--definitions", edited],
                                env={"SAGA_DEFINITIONS": edited, "SAGA_APP": ""})
    assert result.exit_code == 1, result.output
    assert result.stdout.splitlines()[-1] == (
        "0 same next decision, 0 takes a patched path, 0 different next decision, 6 would not fold, 0 skipped")
