"""The pacing settings (how long each service waits to fill a batch) come from the environment; nonsense
values are refused at start-up."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from saga_orchestrator.infra.settings import Settings
from saga_orchestrator.orchestrator.consumer import FETCH_WAIT_MS
from saga_orchestrator.participants.runner import BATCH_WITHIN_S


def test_defaults() -> None:
    current = Settings()
    assert (current.saga_relay_poll_ms, current.saga_fetch_wait_ms, current.saga_participant_batch_ms) == (
        50, FETCH_WAIT_MS, 1000 * BATCH_WITHIN_S)


def test_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAGA_RELAY_POLL_MS", "5")
    monkeypatch.setenv("SAGA_FETCH_WAIT_MS", "25")
    monkeypatch.setenv("SAGA_PARTICIPANT_BATCH_MS", "10")
    current = Settings()
    assert (current.saga_relay_poll_ms, current.saga_fetch_wait_ms, current.saga_participant_batch_ms) == (
        5, 25, 10)


@pytest.mark.parametrize("variable", ["SAGA_RELAY_POLL_MS", "SAGA_FETCH_WAIT_MS", "SAGA_PARTICIPANT_BATCH_MS"])
def test_zero_is_refused(monkeypatch: pytest.MonkeyPatch, variable: str) -> None:
    monkeypatch.setenv(variable, "0")
    with pytest.raises(ValidationError, match=variable.lower()):
        Settings()
