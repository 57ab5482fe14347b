"""An operator's lever on one saga, pulled for a face (the console, its API): checked against its row of
``ACTION_RULES``, queued in the orchestrator's outbox with its audit entry in one transaction.

Nothing here changes a saga: the orchestrator's relay publishes the control command on saga.control and its pure
core decides it, recording ``OperatorAction`` (or ``OperatorActionRefused`` with why) in the saga's stream.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence

from ..outbox.table import OutboxMessage
from ..schemas import wire
from ..schemas.codec import WireError
from ..schemas.headers import message_headers
from ..schemas.message_types import SAGA_ACTIONS, LeverRefused, lever_command
from ..schemas.partitioning import partition_for
from ..schemas.topics import Topics
from .ports import AuditEntry, LeverStore

QUEUED = "queued on saga.control"
"""The outcome the audit records for a lever queued in the outbox."""


def control_row(topics: Topics, saga_id: str, value: bytes, message_id: str, causation_id: str,
                saga_type: str | None = None) -> OutboxMessage:
    """The outbox row that sends the encoded control command ``value`` to saga ``saga_id`` on saga.control."""
    return OutboxMessage(topic=topics.control, key=saga_id, value=value,
                         headers=message_headers(message_id, causation_id=causation_id, saga_id=saga_id,
                                                 saga_type=saga_type),
                         message_id=message_id)


def control_shards(messages: Sequence[OutboxMessage], partitions: tuple[int, ...] | None) -> list[int]:
    """The outbox shard of each control row: its saga's partition of saga.control (None: all in shard 0)."""
    if partitions is None:
        return [0] * len(messages)
    return [partition_for(message.key.encode(), partitions) for message in messages]


class Levers:
    """Pulls levers for operators over ``store``; ``topics`` and ``control_partitions`` (saga.control's) say where
    a command goes, ``via`` names the face in each command's causation id."""

    def __init__(self, store: LeverStore, topics: Topics, control_partitions: tuple[int, ...] | None = (0,), *,
                 via: str = "console", new_id: Callable[[], str] = lambda: str(uuid.uuid4())) -> None:
        self._store = store
        self._topics = topics
        self._partitions = control_partitions
        self._via = via
        self._new_id = new_id

    async def pull(self, operator: str, saga_id: str, action: str, step: str | None, reason: str | None) -> str:
        """Queue ``action`` on ``saga_id`` for ``operator`` with its audit entry, both or neither, and answer the
        control command's message id (the orchestrator's inbox records it once taken); LeverRefused
        when it is asked wrongly (unknown, no step or no reason where its row needs one, or too large to send),
        audited as refused and nothing queued."""
        target = f"saga {saga_id}"
        detail = {"step": step, "reason": reason}
        try:
            value = wire.encode_control(lever_command(action, saga_id, step, operator, reason, offered=SAGA_ACTIONS))
        except (LeverRefused, WireError) as error:
            await self._store.record(AuditEntry(operator, action, target, detail, f"refused: {error}"))
            raise LeverRefused(str(error)) from None
        message_id = self._new_id()
        rows = [control_row(self._topics, saga_id, value, message_id, f"{self._via}:{operator}")]
        await self._store.queue_lever(AuditEntry(operator, action, target, detail, QUEUED), rows,
                                      control_shards(rows, self._partitions))
        return message_id
