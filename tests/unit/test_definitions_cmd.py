"""``saga definitions`` shows what the orchestrator runs, from the definitions themselves."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from saga_orchestrator.cli.main import app

runner = CliRunner()


def test_the_trip_is_shown_step_by_step_in_the_order_its_steps_can_run() -> None:
    result = runner.invoke(app, ["definitions", "--json"])
    assert result.exit_code == 0, result.output
    [trip] = [json.loads(line) for line in result.output.splitlines()]
    assert (trip["saga_type"], trip["version"], trip["input_schema"]) == ("trip", 1, "saga.v1.trip.TripRequest")
    steps = {step["name"]: step for step in trip["steps"]}
    assert list(steps) == ["book_flight", "book_hotel", "charge_card", "send_itinerary"]
    assert steps["charge_card"]["pivot"] and steps["charge_card"]["depends_on"] == ["book_flight", "book_hotel"]
    assert steps["send_itinerary"]["compensation"] is None
    assert steps["book_flight"]["compensation_retry"].startswith("unlimited")


def test_the_table_names_every_step_and_marks_the_pivot() -> None:
    result = runner.invoke(app, ["definitions", "trip"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "trip v1" in result.output and "charge_card (pivot)" in result.output
    for step in ("book_flight", "book_hotel", "send_itinerary"):
        assert step in result.output
