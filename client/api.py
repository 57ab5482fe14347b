"""The console's HTTP API, read from an application or the command line where the database is not at hand.

``SagaApi(url)`` asks one console (``saga console``; SAGA_API_URL) for a saga's state, its history and lists of
sagas. With a local login on the console, give ``auth`` (SAGA_API_USER and SAGA_API_PASSWORD).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

TIMEOUT_S = 10.0


class SagaNotFound(LookupError):
    """No saga of that id in the deployment's event store."""


class ApiError(RuntimeError):
    """The API could not be reached, or refused the request: the message says which and why, in one line."""


@dataclass(frozen=True)
class StepStatus:
    """One step of a saga, as the API reports it."""

    name: str
    participant: str | None
    status: str
    attempt: int
    last_error_type: str | None
    output: dict[str, Any] | None


@dataclass(frozen=True)
class SagaStatus:
    """A saga's state folded from its whole event stream by the console (older than any topic's retention too)."""

    saga_id: str
    saga_type: str | None
    status: str | None  # None: its history does not fold where the console runs (see ``fold_error``)
    reason: str | None
    paused: bool
    steps: list[StepStatus]
    fold_error: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SagaStatus:
        steps = [StepStatus(name=s["name"], participant=s["participant"], status=s["status"], attempt=s["attempt"],
                            last_error_type=s["last_error_type"], output=s["output"]) for s in data["steps"]]
        return cls(saga_id=data["saga_id"], saga_type=data["saga_type"], status=data["status"],
                   reason=data["reason"], paused=data["paused"], steps=steps, fold_error=data["fold_error"])


class SagaApi:
    """Reads through one console's HTTP API (``url``: e.g. http://127.0.0.1:8089)."""

    def __init__(self, url: str, auth: tuple[str, str] | None = None) -> None:
        self.url = url.rstrip("/")
        self._auth = httpx.BasicAuth(*auth) if auth else None

    async def status(self, saga_id: str) -> SagaStatus:
        """The saga's state; SagaNotFound for an unknown id, ApiError when the API cannot answer."""
        return SagaStatus.from_json(await self._get(f"/api/v1/sagas/{saga_segment(saga_id)}", saga_id))

    async def history(self, saga_id: str) -> list[dict[str, Any]]:
        """The saga's events, oldest first: each ``{seq, type, occurred_at_ms, fields}``."""
        found: list[dict[str, Any]] = await self._get(f"/api/v1/sagas/{saga_segment(saga_id)}/history", saga_id)
        return found

    async def encoded_events(self, saga_id: str) -> list[bytes]:
        """The saga's events as recorded (Avro single-object encoded: ``schemas.wire.decode_event`` reads them)."""
        found = await self._get(f"/api/v1/sagas/{saga_segment(saga_id)}/events", saga_id)
        return [base64.b64decode(item["avro"]) for item in found]

    async def fleet(self) -> dict[str, Any]:
        """Counts by type, state and age, the oldest unfinished sagas, the compensation rate."""
        found: dict[str, Any] = await self._get("/api/v1/fleet", None)
        return found

    async def definitions(self) -> list[dict[str, Any]]:
        """Each definition version deployed, and each version sagas started on: ``{saga_type, version, deployed,
        input_schema, fingerprint, running, ended, shapes}``."""
        found: list[dict[str, Any]] = await self._get("/api/v1/definitions", None)
        return found

    async def sagas(self, **filters: Any) -> list[dict[str, Any]]:
        """Sagas of the read model (``status``, ``saga_type``, ``tenant``, ``older_than_s``, ``limit``)."""
        found: list[dict[str, Any]] = await self._get(
            "/api/v1/sagas", None, {name: value for name, value in filters.items() if value is not None})
        return found

    async def operator_audit(self, limit: int) -> list[dict[str, Any]]:
        """The console's operator audit, newest first: each ``{operator, action, target, detail, outcome, at_ms}``."""
        found: list[dict[str, Any]] = await self._get("/api/v1/audit", None, {"limit": limit})
        return found

    async def _get(self, path: str, saga_id: str | None, params: dict[str, Any] | None = None) -> Any:
        try:
            async with httpx.AsyncClient(base_url=self.url, auth=self._auth, timeout=TIMEOUT_S) as client:
                answer = await client.get(path, params=params)
        except httpx.HTTPError as error:
            raise ApiError(f"cannot reach the console's API at {self.url} ({type(error).__name__}: {error}); "
                           "check SAGA_API_URL and that `saga console` runs") from None
        if answer.status_code == 404 and saga_id is not None:
            raise SagaNotFound(f"no saga {saga_id!r} in the event store")
        if answer.status_code == 401:
            raise ApiError(f"the console at {self.url} wants a login: set SAGA_API_USER and SAGA_API_PASSWORD")
        if answer.status_code != 200:
            raise ApiError(f"the console at {self.url} answered {answer.status_code}: {answer.text[:200]}")
        return answer.json()


def saga_segment(saga_id: str) -> str:
    """``saga_id`` as one segment of a console URL: every character but the unreserved ones percent-encoded
    (UTF-8; ``/``, ``?``, ``#`` and ``%`` too), and the dots of ``.`` and ``..``, which a URL would otherwise
    read as a step up. The console decodes it back to the id."""
    segment = quote(saga_id, safe="")
    return segment.replace(".", "%2E") if segment in (".", "..") else segment
