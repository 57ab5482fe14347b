"""``saga list`` shows what the console's saga table shows: each saga's current step, its failures and its last
error; the step whose failure ended or unwound the saga has a column of its own."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from saga_orchestrator.cli import inspect_cmd
from saga_orchestrator.cli.main import app

runner = CliRunner(env={"DATABASE_URL": "postgresql://saga@127.0.0.1:1/saga", "COLUMNS": "250"})


class _Api:
    async def sagas(self, **filters: Any) -> list[dict[str, Any]]:
        return [{"saga_id": "t-1", "saga_type": "trip", "tenant_id": None, "status": "RUNNING", "started_at_ms": 1,
                 "updated_at_ms": 2, "last_seq": 3, "current_step": "book_hotel", "step_failures": 2,
                 "last_error": "timeout"},
                {"saga_id": "t-2", "saga_type": "trip", "tenant_id": None, "status": "COMPENSATED",
                 "started_at_ms": 1, "updated_at_ms": 2, "last_seq": 9, "failed_step": "charge_card",
                 "reason": "CardDeclined: no funds"}]

    async def fleet(self) -> dict[str, Any]:
        return {"by_status": {"RUNNING": 1, "COMPENSATED": 1}}


def test_the_current_step_is_shown_as_on_the_console_and_the_failed_one_apart(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inspect_cmd, "console_api", _Api)
    result = runner.invoke(app, ["list"])
    assert result.exit_code == 0, result.output
    header, running, ended = ([cell.strip() for cell in line.replace("┃", "│").split("│")[1:-1]]
                              for line in result.stdout.splitlines() if line.startswith(("┃", "│")))
    columns = dict(zip(header, running, strict=True))
    assert (columns["current step"], columns["failures"], columns["last error"], columns["failed step"]) == (
        "book_hotel", "2", "timeout", "")
    columns = dict(zip(header, ended, strict=True))
    assert (columns["current step"], columns["failed step"], columns["reason"]) == ("", "charge_card",
                                                                                    "CardDeclined: no funds")
