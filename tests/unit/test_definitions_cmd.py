"""``saga definitions`` shows what the orchestrator runs, from the definitions themselves, and beside each version
how many sagas run and ended on it (versions no longer deployed too) when the database answers."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from saga_orchestrator.cli import definitions_cmd
from saga_orchestrator.cli.main import app
from saga_orchestrator.operations.versions import ShapeCounts, VersionCounts

# No database answers here (nothing listens on port 1): the definitions are shown without their counts.
runner = CliRunner(env={"DATABASE_URL": "postgresql://saga@127.0.0.1:1/saga"})
COUNTED = [VersionCounts("trip", None, 1, 4, (ShapeCounts(None, 1, 4),)),
           VersionCounts("trip", 0, 2, 7, (ShapeCounts("0ld", 2, 7),)),
           VersionCounts("trip", 1, 3, 5, (ShapeCounts("aa", 3, 4), ShapeCounts("bb", 0, 1)))]


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> None:
    async def counts() -> tuple[list[VersionCounts] | None, str | None]:
        return COUNTED, None

    monkeypatch.setattr(definitions_cmd, "version_counts_or_why", counts)


def test_the_trip_is_shown_step_by_step_in_the_order_its_steps_can_run() -> None:
    result = runner.invoke(app, ["definitions", "--json"])
    assert result.exit_code == 0, result.output
    [trip] = [json.loads(line) for line in result.stdout.splitlines()]
    assert trip["deployed"] and trip["sagas"] is None  # not counted: no database
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


def test_without_a_database_the_counts_are_said_unavailable_in_one_line() -> None:
    result = runner.invoke(app, ["definitions"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "trip v1" in result.stdout and "running" not in result.stdout
    [line] = result.stderr.splitlines()
    assert line.startswith("counts unavailable: cannot reach Postgres") and "Traceback" not in result.output


def test_each_version_shows_its_running_and_ended_sagas_and_those_not_deployed(counted: None) -> None:
    result = runner.invoke(app, ["definitions", "trip"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    lines = [" ".join(line.split()) for line in result.stdout.splitlines()]
    assert "trip, version unrecorded: 1 running, 4 ended (started before versions were recorded; `saga reproject`" \
           " records them)" in lines
    assert "trip v0: not deployed; 2 running, 7 ended" in lines
    assert any(line.startswith("trip v1 (") and line.endswith(": 3 running, 5 ended") for line in lines)
    assert "shape bb: 0 running, 1 ended" in lines  # v1's sagas started on two shapes
    assert result.stderr == ""


def test_the_json_has_the_counts_of_every_version(counted: None) -> None:
    result = runner.invoke(app, ["definitions", "--json"])
    assert result.exit_code == 0, result.output
    shown = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(v["version"], v["deployed"], v["sagas"]["running"], v["sagas"]["ended"]) for v in shown] == [
        (None, False, 1, 4), (0, False, 2, 7), (1, True, 3, 5)]
    assert shown[2]["steps"] and shown[2]["sagas"]["shapes"] == [{"fingerprint": "aa", "running": 3, "ended": 4},
                                                                 {"fingerprint": "bb", "running": 0, "ended": 1}]
    assert [v["draining"] for v in shown] == [False, False, False]


def test_a_version_the_orchestrator_drains_is_marked_draining(counted: None) -> None:
    drained = {"SAGA_DRAINING": "trip:1", "COLUMNS": "200"}
    shown = runner.invoke(app, ["definitions", "--json"], env=drained).stdout
    [*_, v1] = [json.loads(line) for line in shown.splitlines()]
    assert (v1["version"], v1["deployed"], v1["draining"]) == (1, True, True)
    table = runner.invoke(app, ["definitions", "trip"], env=drained).stdout
    lines = [" ".join(line.split()) for line in table.splitlines()]
    assert any(line.startswith("trip v1, draining: no new starts (") for line in lines)
