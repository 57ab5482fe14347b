"""The one deployment loader: an app, or the 0.1 settings adapted to the same deployment; nothing written to the
environment; nothing named, nothing run."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from saga_orchestrator.authoring import SagaApp
from saga_orchestrator.cli.main import app
from saga_orchestrator.infra.deployment import NOTHING_NAMED, load_deployment
from saga_orchestrator.infra.misconfigured import Misconfigured
from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.orchestrator.bootstrap import registry_of
from saga_orchestrator.participants import trip
from saga_orchestrator.participants.registry import deployment_participants, participant_workers

TRIP_FOLDER = str(Path(trip.__file__).parent.resolve())


def test_a_01_deployment_is_its_definitions_participants_and_schema_path() -> None:
    deployment = load_deployment(Settings(
        saga_app=None, saga_definitions="saga_orchestrator.participants.trip:TRIP",
        saga_participants="flight+hotel, payment", saga_schema_path="saga_orchestrator.participants.trip"))
    assert list(deployment.saga_types) == ["saga_orchestrator.participants.trip:TRIP"]
    assert deployment.workers == [["flight", "hotel"], ["payment"]]
    assert deployment.schema_path == "saga_orchestrator.participants.trip"
    assert deployment.app is None
    assert deployment.named_by == "SAGA_DEFINITIONS='saga_orchestrator.participants.trip:TRIP'"


def test_an_app_names_the_saga_types_participants_and_schema_folder_without_writing_the_environment() -> None:
    before = dict(os.environ)
    deployment = load_deployment(Settings(saga_app="saga_orchestrator.participants.trip:app", saga_participants=""))
    assert dict(os.environ) == before
    assert [definition.saga_type for definition in deployment.saga_types.values()] == ["trip"]
    assert deployment.workers == [["flight"], ["hotel"], ["payment"], ["notification"]]
    assert deployment.schema_path.split(os.pathsep)[0] == TRIP_FOLDER
    assert deployment.named_by == "SAGA_APP='saga_orchestrator.participants.trip:app'"


def test_an_apps_participants_can_be_grouped_into_workers_by_saga_participants() -> None:
    settings = Settings(saga_app="saga_orchestrator.participants.trip:app",
                        saga_participants="flight+hotel+payment+notification")
    assert participant_workers(settings) == [["flight", "hotel", "payment", "notification"]]
    assert [participant.name for participant in deployment_participants(settings)] == [
        "flight", "hotel", "payment", "notification"]


def test_nothing_named_is_refused_in_one_line_naming_the_settings() -> None:
    with pytest.raises(Misconfigured) as refused:
        load_deployment(Settings(saga_app=None, saga_definitions="", saga_participants=""))
    assert str(refused.value) == NOTHING_NAMED
    assert "SAGA_APP" in NOTHING_NAMED and "SAGA_DEFINITIONS" in NOTHING_NAMED and "\n" not in NOTHING_NAMED


def test_a_participant_worker_needs_no_saga_types_named() -> None:
    deployment = load_deployment(Settings(saga_app=None, saga_definitions="", saga_participants="flight"),
                                 saga_types=False)
    assert deployment.saga_types == {} and deployment.workers == [["flight"]]


def test_a_definition_that_cannot_be_loaded_names_the_setting() -> None:
    with pytest.raises(Misconfigured, match=r"^SAGA_DEFINITIONS='no_such_module:X': cannot import"):
        load_deployment(Settings(saga_app=None, saga_definitions="no_such_module:X"))


@pytest.fixture
def nothing_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment of a process whose deployment forgot to name its saga types (the tests' own name the
    trip: tests/conftest.py)."""
    for name in ("SAGA_APP", "SAGA_DEFINITIONS", "SAGA_PARTICIPANTS"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.usefixtures("nothing_named")
def test_settings_name_no_saga_type_and_no_participant_by_default() -> None:
    defaults = Settings()
    assert (defaults.saga_app, defaults.saga_definitions, defaults.saga_participants) == (None, "", "")
    with pytest.raises(Misconfigured) as refused:
        load_deployment(defaults)
    assert str(refused.value) == NOTHING_NAMED


@pytest.mark.usefixtures("nothing_named")
@pytest.mark.parametrize("args", [["run", "all"], ["definitions"], ["start", "trip", "--id", "x", "--input", "{}"]])
def test_a_command_that_runs_saga_types_refuses_in_one_line_when_none_is_named(args: list[str]) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert " ".join(result.output.split()) == f"error: {NOTHING_NAMED}"


TWO_VERSIONS = SagaApp(sagas=[trip.TRIP, replace(trip.TRIP, version=2)], participants=[],
                       schema_folder=Path(TRIP_FOLDER))
"""The trip in versions 1 and 2: a deployment that keeps a version beside the next while it drains."""


def test_an_app_deploys_two_versions_of_one_saga_type_side_by_side() -> None:
    deployment = load_deployment(Settings(saga_app="tests.unit.test_deployment:TWO_VERSIONS", saga_participants=""))
    assert sorted((d.saga_type, d.version) for d in deployment.saga_types.values()) == [("trip", 1), ("trip", 2)]
    assert sorted((d.saga_type, d.version) for d in registry_of(deployment).definitions()) == [
        ("trip", 1), ("trip", 2)]
