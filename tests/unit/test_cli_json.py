"""Every read of the ``saga`` command prints, with ``--json``, the data its table shows as JSON on stdout alone:
one document, or one object per line for a stream; times as epoch milliseconds (the outbox: ISO 8601)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from saga_orchestrator.cli import audit_cmd, bulk_cmd, dlq_cmd, inspect_cmd, outbox_cmd
from saga_orchestrator.cli.main import app
from saga_orchestrator.infra import launcher
from saga_orchestrator.infra.launcher.stack import ServiceStatus
from saga_orchestrator.operations.bulk_jobs import BulkJob, Count, Selection
from saga_orchestrator.operations.dead_letters import Dismissed, Parked
from saga_orchestrator.orchestrator.audit import Difference
from saga_orchestrator.orchestrator.domain.model import SagaState, SagaStatus, StepState, StepStatus
from saga_orchestrator.outbox.parked import ParkedRow

runner = CliRunner(env={"DATABASE_URL": "postgresql://saga@127.0.0.1:1/saga"})


def _json_lines(output: str) -> list[Any]:
    return [json.loads(line) for line in output.splitlines()]


def test_status_json_is_the_state_and_each_step(monkeypatch: pytest.MonkeyPatch) -> None:
    state = SagaState(saga_id="t-1", saga_type="trip", definition_version=1, tenant_id=None, input=b"",
                      status=SagaStatus.RUNNING, last_seq=4, started_at=1_000, updated_at=2_000,
                      steps={"book_flight": StepState(name="book_flight", idempotency_key="k1", compensation_key="c1",
                                                     status=StepStatus.SUCCEEDED, attempt=1),
                             "book_hotel": StepState(name="book_hotel", idempotency_key="k2", compensation_key="c2",
                                                    status=StepStatus.RETRY_SCHEDULED, attempt=2,
                                                     last_error_type="Busy", last_error_message="full")})

    async def history(saga_id: str) -> list[Any]:
        return []

    monkeypatch.setattr(inspect_cmd, "load_history", history)
    monkeypatch.setattr(inspect_cmd, "folded", lambda saga_id, events: state)
    monkeypatch.setattr(inspect_cmd, "_waits", lambda saga_id, found, events: [("book_hotel", "its retry at 3s")])
    result = runner.invoke(app, ["status", "t-1", "--json"])
    assert result.exit_code == 0, result.output
    [shown] = _json_lines(result.stdout)
    assert (shown["saga_id"], shown["status"], shown["started_at_ms"], shown["updated_at_ms"]) == (
        "t-1", "RUNNING", 1_000, 2_000)
    assert [(s["name"], s["status"], s["attempt"], s["last_error_type"]) for s in shown["steps"]] == [
        ("book_flight", "SUCCEEDED", 1, None), ("book_hotel", "RETRY_SCHEDULED", 2, "Busy")]
    assert shown["waits"] == [{"step": "book_hotel", "waits_on": "its retry at 3s"}] and shown["purge"] is None


class _Api:
    async def sagas(self, **filters: Any) -> list[dict[str, Any]]:
        return [{"saga_id": "t-1", "saga_type": "trip", "tenant_id": None, "status": "RUNNING", "started_at_ms": 1,
                 "updated_at_ms": 2, "last_seq": 3, "current_step": "book_hotel", "step_failures": 2,
                 "last_error": "timeout"}]

    async def fleet(self) -> dict[str, Any]:
        return {"by_status": {"RUNNING": 1}}


def test_list_json_is_the_rows_and_the_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inspect_cmd, "console_api", _Api)
    result = runner.invoke(app, ["list", "--json"])
    assert result.exit_code == 0, result.output
    [shown] = _json_lines(result.stdout)
    assert shown["counts"] == {"RUNNING": 1}
    [row] = shown["sagas"]
    assert (row["saga_id"], row["started_at_ms"], row["current_step"], row["step_failures"]) == ("t-1", 1,
                                                                                                 "book_hotel", 2)


@asynccontextmanager
async def _no_database(current: Any) -> AsyncIterator[None]:
    yield None


def test_outbox_list_json_is_one_object_per_parked_row(monkeypatch: pytest.MonkeyPatch) -> None:
    parked = ParkedRow(7, "saga.commands.flight", "t-1", "m-1", 2_000_000,
                       datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC), "MessageSizeTooLarge")

    async def listed(pool: Any, table: str, key: str | None = None) -> list[ParkedRow]:
        assert (table, key) == ("saga.outbox", "t-1")
        return [parked]

    monkeypatch.setattr(outbox_cmd, "database", _no_database)
    monkeypatch.setattr(outbox_cmd, "list_parked", listed)
    result = runner.invoke(app, ["outbox", "list", "--saga", "t-1", "--json"])
    assert result.exit_code == 0, result.output
    assert _json_lines(result.stdout) == [{"id": 7, "topic": "saga.commands.flight", "key": "t-1",
                                           "message_id": "m-1", "size": 2_000_000,
                                           "parked_at": "2026-01-02T03:04:05+00:00", "reason": "MessageSizeTooLarge"}]


JOB = BulkJob(id=3, operator="ann", reason="stuck", action="Cancel", step=None,
              selection=Selection(saga_type="trip", statuses=("RUNNING",)), rate_per_s=5.0, status="RUNNING",
              total=10, done=4, failed=0, refused=1, last_saga_id="t-4", error=None, created_at_ms=1_000,
              updated_at_ms=2_000, finished_at_ms=None, cancelled_by=None)


def _stored(value: object) -> Callable[[Any], object]:
    return lambda work: value


def test_bulk_list_and_show_json_are_the_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bulk_cmd, "_with_store", _stored([JOB]))
    result = runner.invoke(app, ["bulk", "list", "--json"])
    assert result.exit_code == 0, result.output
    [job] = _json_lines(result.stdout)
    assert (job["id"], job["done"], job["created_at_ms"], job["selection"]) == (
        3, 4, 1_000, {"saga_type": "trip", "statuses": ["RUNNING"]})
    monkeypatch.setattr(bulk_cmd, "_with_store", _stored(JOB))
    result = runner.invoke(app, ["bulk", "show", "3", "--json"])
    assert result.exit_code == 0, result.output
    [shown] = _json_lines(result.stdout)
    assert shown["refused"] == 1 and shown["recorded_as"].startswith("ann")


def test_bulk_count_json_is_the_total_and_the_first_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bulk_cmd, "_with_store", _stored(Count(12, ["t-1", "t-2"])))
    monkeypatch.setattr(bulk_cmd, "deployed_definitions", lambda: None)
    result = runner.invoke(app, ["bulk", "count", "--type", "trip", "--json"])
    assert result.exit_code == 0, result.output
    assert _json_lines(result.stdout) == [{"selection": {"saga_type": "trip"}, "total": 12, "sample": ["t-1", "t-2"]}]


def test_audit_json_has_every_difference_and_exits_1_on_any(monkeypatch: pytest.MonkeyPatch) -> None:
    async def compared(current: Any) -> tuple[list[Difference], Counter[str], dict[str, int]]:
        return [Difference("t-1", 3, "missing from the topic")], Counter({"COMPLETED": 2}), {"sagas": 2}

    monkeypatch.setattr(audit_cmd, "audit_all", compared)
    result = runner.invoke(app, ["audit", "--json"])
    assert result.exit_code == 1, result.output
    assert _json_lines(result.stdout) == [{"figures": {"sagas": 2}, "states_from_topic": {"COMPLETED": 2},
                                           "differences": [{"saga_id": "t-1", "seq": 3,
                                                            "problem": "missing from the topic"}]}]


def test_dlq_list_json_prints_one_object_per_line(monkeypatch: pytest.MonkeyPatch) -> None:
    letters = [Parked(0, 7, 1_000, None), Parked(1, 3, 2_000, None)]

    async def read(current: Any) -> list[Parked]:
        return letters

    async def indexed(current: Any, where: Any, limit: int) -> tuple[list[tuple[Parked, Dismissed | None]], int]:
        return [(letters[1], Dismissed("ana", "garbage", 3_000)), (letters[0], None)], 2  # newest first

    monkeypatch.setattr(dlq_cmd, "read_parked", read)
    monkeypatch.setattr(dlq_cmd, "indexed", indexed)
    expected = [{"position": "0:7", "timestamp": 1_000, "replays": [], "readable": False, "dismissed": None},
                {"position": "1:3", "timestamp": 2_000, "replays": [], "readable": False,
                 "dismissed": {"operator": "ana", "reason": "garbage", "at": 3_000}}]
    for live in ([], ["--live"]):
        result = runner.invoke(app, ["dlq", "list", "--json", *live])
        assert result.exit_code == 0, result.output
        assert _json_lines(result.stdout) == (expected if not live else [  # saga.dlq itself keeps no dismissal
            {**expected[0]}, {**expected[1], "dismissed": None}])


def test_infra_status_json_is_one_object_per_service(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher, "status", lambda current: [
        ServiceStatus("postgres", True, False, "127.0.0.1", 15432, 42, Path("/data/pg")),
        ServiceStatus("kafka", False, True, "broker:9092", None, None, None)])
    result = runner.invoke(app, ["infra", "status", "--json"])
    assert result.exit_code == 0, result.output
    assert _json_lines(result.stdout) == [
        {"name": "postgres", "running": True, "external": False, "address": "127.0.0.1", "port": 15432, "pid": 42,
         "data_dir": "/data/pg"},
        {"name": "kafka", "running": False, "external": True, "address": "broker:9092", "port": None, "pid": None,
         "data_dir": None}]
