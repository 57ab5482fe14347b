"""A participant's real handlers through the kit's real transaction path, on a real Postgres, without Kafka.

    async with ParticipantHarness(inventory, dsn) as harness:       # makes its tables
        reply = await harness.send(reserve_stock, order, saga_id="o-1")
        assert reply.status == "SUCCEEDED"
        again = await harness.send(reserve_stock, order, saga_id="o-1")   # delivered again
        assert again.duplicate and again == reply.again()                 # answered from the record
        undone = await harness.send(reserve_stock.compensation, order, saga_id="o-1")

Each ``send`` is one delivery of a StepCommand, handled by ``participants.kit.handling`` exactly as a worker
handles it (the idempotency record, the savepoint, the business change and the reply in one transaction); the
reply is read back from the participant's outbox. The typed records of the participant (and of ``records``
given) are written to a folder of their own, which goes first on SAGA_SCHEMA_PATH while the harness is open.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any

import asyncpg
from pydantic import BaseModel

from ..infra.db import create_pool
from ..participants.kit.ddl import ensure_participant_schema
from ..participants.kit.effects import read_effects
from ..participants.kit.handling import Disposition, handle_commands
from ..participants.kit.participant import Participant
from ..participants.kit.typed import Action, ParticipantSpec
from ..schemas import wire
from ..schemas.headers import MESSAGE_ID
from ..schemas.ids import compensation_key, forward_key
from ..schemas.message_types import CommandKind, StepCommand
from ..schemas.records import ConsumedRecord
from ..schemas.registry import DEFAULT_SCHEMA_PATH, SCHEMA_PATH_ENV, default_registry
from ..schemas.topics import Topics
from ..schemas.typed import INPUTS_FOLDER, Record, from_avro, schema_files, to_avro

__all__ = ["ParticipantHarness", "Reply"]


@dataclass(frozen=True)
class Reply:
    """What the participant answered one delivery, and what became of it (``disposition``)."""

    disposition: str  # recorded, transient, duplicate, fenced, dead_lettered, awaiting
    status: str | None  # SUCCEEDED / FAILED; None when nothing was answered (deferred, dead-lettered)
    error_type: str | None = None
    message: str | None = None
    retryable: bool = False
    output: BaseModel | bytes | None = None
    held_ms: int = 0  # how long the reply waits in the outbox before it is sent (``StepContext.hold_reply``)

    @property
    def duplicate(self) -> bool:
        """Answered from the record: the handler did not run."""
        return self.disposition == Disposition.DUPLICATE.value

    def again(self) -> Reply:
        """This reply as a redelivery of its command gets it (the same answer, marked duplicate)."""
        return replace(self, disposition=Disposition.DUPLICATE.value)


class ParticipantHarness:
    """A participant (a ``participant(...)`` declaration or a kit ``Participant``) on the Postgres of ``dsn``."""

    def __init__(self, participant: ParticipantSpec | Participant, dsn: str, *, saga_type: str = "test",
                 records: Iterable[Record] = ()) -> None:
        self._spec = participant if isinstance(participant, ParticipantSpec) else None
        self.participant = participant.build() if isinstance(participant, ParticipantSpec) else participant
        self._dsn = dsn
        self._saga_type = saga_type
        self._records = [*(self._spec.records() if self._spec else []), *records]
        self._topics = Topics()
        self._pool: asyncpg.Pool | None = None
        self._folder: tempfile.TemporaryDirectory[str] | None = None
        self._schema_path: str | None = None
        self._offset = 0

    async def __aenter__(self) -> ParticipantHarness:
        self._folder = tempfile.TemporaryDirectory()
        self._schema_path = os.environ.get(SCHEMA_PATH_ENV)
        self._write_records(Path(self._folder.name))
        self._pool = await create_pool(self._dsn, 2, application_name=f"saga-test-{self.participant.name}")
        await ensure_participant_schema(self._pool, self.participant)
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        trace: TracebackType | None) -> None:
        if self._pool is not None:
            await self._pool.close()
        if self._schema_path is None:
            os.environ.pop(SCHEMA_PATH_ENV, None)
        else:
            os.environ[SCHEMA_PATH_ENV] = self._schema_path
        if self._folder is not None:
            self._folder.cleanup()

    @property
    def pool(self) -> asyncpg.Pool:
        """The harness's pool, for a test's own look at the participant's tables."""
        assert self._pool is not None, "open the harness first: async with ParticipantHarness(...) as harness"
        return self._pool

    async def send(self, action: Action | str, saga_input: BaseModel | Mapping[str, Any], *, saga_id: str = "saga-1",
                   step: str | None = None, attempt: int = 1,
                   outputs: Mapping[str, BaseModel | bytes] | None = None) -> Reply:
        """Deliver one command of ``action`` (a typed action, its compensation, or an action's name) for
        ``saga_id``; what the participant answered. ``step`` defaults to the action's name (the forward
        action's, for a compensation); ``outputs`` are the earlier steps' outputs it carries, by step name."""
        name = action.name if isinstance(action, Action) else action
        forward = action.compensates if isinstance(action, Action) and action.compensates is not None else None
        kind = CommandKind.COMPENSATE if forward is not None else CommandKind.FORWARD
        step = step or (forward.name if forward is not None else name)
        key = (compensation_key if kind is CommandKind.COMPENSATE else forward_key)(saga_id, step)
        self._offset += 1
        message_id = f"{key}:{attempt}:{self._offset}"
        command = StepCommand(
            saga_id=saga_id, saga_type=self._saga_type, step=step, participant=self.participant.name, action=name,
            kind=kind, idempotency_key=key, attempt=attempt, input=self._encode(saga_input), message_id=message_id,
            step_outputs=tuple(sorted((step_name, self._encode_output(value))
                                      for step_name, value in (outputs or {}).items())))
        record = ConsumedRecord(topic=self._topics.commands(self.participant.name), partition=0, offset=self._offset,
                                key=saga_id.encode(), value=wire.encode_command(command),
                                headers=((MESSAGE_ID, message_id.encode()),))
        [disposition] = await handle_commands(self.pool, self.participant, self._topics, [record])
        return await self._reply(disposition, key)

    async def _reply(self, disposition: Disposition, key: str) -> Reply:
        rows = await self.pool.fetch(
            "SELECT value, greatest(0, extract(epoch FROM available_at - created_at) * 1000)::int AS held_ms"
            f" FROM {self.participant.outbox_table} WHERE topic = $1 ORDER BY id DESC",
            self._topics.results(self.participant.name))
        for row in rows:
            result = wire.decode_result(row["value"])
            if result.idempotency_key == key:
                return Reply(disposition.value, result.status.value, result.error_type, result.error_message,
                             result.retryable, self._decode_output(result.output), row["held_ms"])
        return Reply(disposition.value, None)

    async def effects(self, saga_id: str) -> dict[str, int]:
        """The participant's effect counts for ``saga_id``, as ``saga effects`` and ``saga verify`` read them
        (from its ``effects`` declaration; empty without one)."""
        found = await read_effects(self.pool, [self.participant], saga_id)
        return found.counts().get(self.participant.name, {})

    def _write_records(self, folder: Path) -> None:
        for name, schema in schema_files(self._records).items():
            path = folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(schema), encoding="utf-8")
        current = os.environ.get(SCHEMA_PATH_ENV, DEFAULT_SCHEMA_PATH)
        os.environ[SCHEMA_PATH_ENV] = os.pathsep.join((str(folder), current))

    def _encode(self, value: BaseModel | Mapping[str, Any]) -> bytes:
        if isinstance(value, BaseModel):
            record = self._record(type(value), INPUTS_FOLDER)
            return default_registry().encode(record.full_name, to_avro(value))
        names = default_registry().names(INPUTS_FOLDER)
        raise TypeError(f"give the saga input as its pydantic model (typed records known here: {', '.join(names)})")

    def _encode_output(self, value: BaseModel | bytes) -> bytes:
        if isinstance(value, bytes):
            return value
        return default_registry().encode(self._record(type(value)).full_name, to_avro(value))

    def _record(self, model: type[BaseModel], folder: str | None = None) -> Record:
        for record in self._records:
            if record.model is model:
                return record
        if folder == INPUTS_FOLDER:  # a saga input not given: it is recorded under the harness's saga type
            record = Record(model, f"saga.v1.{self._saga_type}", INPUTS_FOLDER)
            self._records.append(record)
            assert self._folder is not None
            self._write_records(Path(self._folder.name))
            return record
        raise TypeError(f"{model.__name__} is no output of {self.participant.name}: give its record in records=")

    def _decode_output(self, output: bytes | None) -> BaseModel | bytes | None:
        if not output:
            return None
        try:
            full_name, record = default_registry().decode(output)
        except Exception:  # not a typed record: the bytes
            return output
        models = {record_.full_name: record_.model for record_ in self._records}
        return from_avro(models[full_name], record) if full_name in models else output
