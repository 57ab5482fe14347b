"""``saga definitions check`` on histories ``saga history --json`` wrote, and ``saga definitions diff``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from saga_orchestrator.cli import inspect_cmd
from saga_orchestrator.cli.main import app
from saga_orchestrator.participants.trip.definition import TRIP
from saga_orchestrator.schemas.event_types import Event
from saga_orchestrator.testing.history import SagaRun

runner = CliRunner()
CHANGES = "bench.trip_changes"


@pytest.fixture
def histories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Three trips exported with `saga history --json`: waiting on the bookings, past the charge, ended."""
    waiting = SagaRun(TRIP, saga_id="trip-waiting")
    waiting.start()
    waiting.ok("book_flight")
    charged = SagaRun(TRIP, saga_id="trip-charged")
    charged.start()
    for step in ("book_flight", "book_hotel", "charge_card"):
        charged.ok(step)
    ended = SagaRun(TRIP, saga_id="trip-ended")
    ended.start()
    for step in ("book_flight", "book_hotel", "charge_card", "send_itinerary"):
        ended.ok(step)
    recorded: dict[str, list[Event]] = {run.saga_id: run.events for run in (waiting, charged, ended)}

    async def load_history(saga_id: str) -> list[Event]:
        return recorded[saga_id]

    monkeypatch.setattr(inspect_cmd, "load_history", load_history)
    for saga_id in recorded:
        result = runner.invoke(app, ["history", saga_id, "--json"])
        assert result.exit_code == 0, result.output
        (tmp_path / f"{saga_id}.json").write_text(result.output)
    return tmp_path


def check(histories: Path, definitions: str, *more: str) -> tuple[int, str]:
    result = runner.invoke(app, ["definitions", "check", "--histories", str(histories), "--definitions", definitions,
                                 *more])
    return result.exit_code, result.stdout


def test_the_deployed_trip_decides_every_running_trip_the_same(histories: Path) -> None:
    code, output = check(histories, "saga_orchestrator.participants.trip:TRIP")
    assert code == 0, output
    assert output.splitlines() == ["trip-charged  same next decision", "trip-waiting  same next decision",
                                   "2 same next decision, 0 takes a patched path, 0 different next decision, "
                                   "0 would not fold, 1 skipped"]


def test_a_policy_change_passes_and_a_step_removed_fails(histories: Path) -> None:
    assert check(histories, f"{CHANGES}:PATIENT")[0] == 0
    code, output = check(histories, f"{CHANGES}:NO_CHARGE", "--json")
    assert code == 1
    found = json.loads(output)
    assert not found["ok"] and found["counts"]["SKIPPED"] == 1
    verdicts = {saga["saga_id"]: saga["verdict"] for saga in found["sagas"]}
    assert verdicts == {"trip-charged": "WOULD_NOT_FOLD", "trip-waiting": "DIFFERENT"}


def test_a_version_no_longer_deployed_would_not_fold(histories: Path) -> None:
    code, output = check(histories / "trip-waiting.json", f"{CHANGES}:FLIGHT_ONLY")
    assert code == 1
    assert "trip-waiting  would not fold: trip v1 not deployed (candidate has: v2)" in output


def test_the_candidate_must_be_named_once() -> None:
    result = runner.invoke(app, ["definitions", "check"])
    assert result.exit_code == 2


def test_diff_names_each_change_with_its_verdict() -> None:
    trip = "saga_orchestrator.participants.trip:TRIP"
    same = runner.invoke(app, ["definitions", "diff", trip, trip])
    assert same.exit_code == 0 and "0 changes: safe for running sagas" in same.stdout
    patient = runner.invoke(app, ["definitions", "diff", trip, f"{CHANGES}:PATIENT"])
    assert patient.exit_code == 0 and patient.stdout.startswith("SAFE")
    inserted = runner.invoke(app, ["definitions", "diff", trip, f"{CHANGES}:CHECK_BEFORE_CHARGE", "--json"])
    assert inserted.exit_code == 1 and json.loads(inserted.stdout)["verdict"] == "PATCH"
    removed = runner.invoke(app, ["definitions", "diff", trip, f"{CHANGES}:NO_CHARGE"])
    assert removed.exit_code == 3 and "VERSION  step 'charge_card' removed" in removed.stdout
    assert runner.invoke(app, ["definitions", "diff", trip, "no_such_module"]).exit_code == 2
