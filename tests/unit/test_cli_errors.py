"""The CLI refuses bad arguments with a message that says what to fix, before touching Kafka or Postgres."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from saga_orchestrator.cli.main import app
from saga_orchestrator.participants.trip.scenarios import SCENARIOS

runner = CliRunner()
TRIP = SCENARIOS["happy"].trip("cli-1")


def _run(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


@pytest.mark.parametrize(("args", "expected"), [
    (["start", "cruise", "--id", "x", "--input", "{}"], "unknown saga type 'cruise'; known types: trip"),
    (["start", "trip", "--id", "x", "--input", "{not json"], "--input is not valid JSON"),
    (["start", "trip", "--id", "x", "--input", "[1, 2]"], "--input must be a JSON object"),
    (["start", "trip", "--id", " ", "--input", json.dumps(TRIP)], "--id must not be empty"),
    (["start", "trip", "--id", "x", "--input", json.dumps({**TRIP, "amount_cents": "12"})],
     "field amount_cents must be long, got '12'"),
    (["start", "trip", "--id", "x", "--input", json.dumps({k: v for k, v in TRIP.items() if k != "email"})],
     "missing field(s) email"),
    (["start", "trip", "--id", "x", "--input", json.dumps({**TRIP, "seat": "12A"})], "unknown field(s) seat"),
    (["cancel", "x", "--reason", "  "], "Cancel needs a reason (why the saga is cancelled)"),
    (["definitions", "cruise"], "unknown saga type 'cruise'; known types: trip"),
    (["answer", "flight", "k"], "give exactly one of --output (the step succeeded) or --fail ERROR_TYPE"),
    (["answer", "flight", "k", "--fail", " "], "--fail needs an error type"),
    (["awaiting", "nosuch"], "unknown participant 'nosuch'"),
    (["list", "--state", "DONE"], "--state 'DONE' is not a saga state"),
    (["list", "--older-than", "5 minutes"], "--older-than '5 minutes' is not a duration"),
    (["dlq", "list", "--since", "yesterday"], "--since 'yesterday' is not a duration"),
    (["dlq", "replay"], "name the letters to replay: positions as PARTITION:OFFSET, or --saga ID"),
    (["outbox", "list", "--schema", "Bad-Name"], "--schema 'Bad-Name' is not a schema name"),
    (["dlq", "replay", "3-17"], "'3-17' is not a dead-letter position; use PARTITION:OFFSET"),
    (["dlq", "dismiss", "3:17"], "Missing option '--reason'"),
])
def test_bad_arguments_are_refused_with_what_to_fix(args: list[str], expected: str) -> None:
    code, output = _run(*args)
    assert code == 2
    assert expected in " ".join(output.split())


def test_unknown_participant_is_refused() -> None:
    code, output = _run("run", "participant", "ferry")
    assert code == 2
    assert "unknown participant 'ferry'" in output


def test_a_worker_refuses_to_host_a_participant_twice() -> None:
    code, output = _run("run", "participant", "flight", "hotel", "flight")
    assert code == 2
    assert "name each participant once: flight hotel flight" in output


def test_the_saga_command_says_which_extra_to_install_when_its_libraries_are_missing() -> None:
    blocked = "import sys; sys.modules['typer'] = None; from saga_orchestrator.cli import main; main()"
    result = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip() == ("saga: the command line needs typer, which this installation lacks; install it "
                                     "with: pip install 'saga-orchestrator[orchestrator]'")
