"""``saga operator-log`` lists the operator audit the console records, newest first, from the database or through
the console's API, filtered by saga and operator."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from saga_orchestrator.cli import operator_log_cmd
from saga_orchestrator.cli.main import app
from saga_orchestrator.operations.ports import AuditEntry

runner = CliRunner(env={"DATABASE_URL": "postgresql://saga@127.0.0.1:1/saga"})
ENTRIES = [
    AuditEntry("ann", "Cancel", "saga t-1", {"reason": "stuck"}, "queued", 3_000),
    AuditEntry("bob", "DlqReplay", "dead letter 0:7", {"saga": "t-1", "force": False}, "replayed", 2_000),
    AuditEntry("ann", "SignIn", "console", {"address": "127.0.0.1"}, "signed in", 1_000),
]


@pytest.fixture
def read(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    asked: list[int] = []

    async def entries(limit: int) -> list[AuditEntry]:
        asked.append(limit)
        return ENTRIES[:limit]

    monkeypatch.setattr(operator_log_cmd, "_entries", entries)
    return asked


def _shown(args: list[str]) -> list[Any]:
    result = runner.invoke(app, ["operator-log", *args, "--json"])
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_the_latest_entries_are_listed_newest_first_with_their_times(read: list[int]) -> None:
    shown = _shown(["--limit", "2"])
    assert [(e["operator"], e["action"], e["at_ms"]) for e in shown] == [("ann", "Cancel", 3_000),
                                                                         ("bob", "DlqReplay", 2_000)]
    assert read == [2]


def test_a_saga_s_entries_are_its_levers_and_the_letters_replayed_for_it(read: list[int]) -> None:
    assert [e["action"] for e in _shown(["--saga", "t-1"])] == ["Cancel", "DlqReplay"]
    assert [e["action"] for e in _shown(["--operator", "ann", "--limit", "1"])] == ["Cancel"]
    assert read == [operator_log_cmd.SCANNED] * 2  # filters look through the latest entries, then cut to --limit


def test_the_table_names_who_did_what(read: list[int]) -> None:
    result = runner.invoke(app, ["operator-log"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "SignIn" in result.stdout and "reason=stuck" in result.stdout


class _Api:
    async def operator_audit(self, limit: int) -> list[dict[str, Any]]:
        return [{"operator": "ann", "action": "Pause", "target": "saga t-2", "detail": {}, "outcome": "queued",
                 "at_ms": 5}]


def test_through_the_console_s_api_when_only_its_url_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(operator_log_cmd, "console_api", _Api)
    assert [(e["action"], e["target"]) for e in _shown([])] == [("Pause", "saga t-2")]
