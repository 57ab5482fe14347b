"""A participant's definition: name, Postgres schema, action handlers and business tables."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from participants.kit.outcome import Outcome, ReceivedCommand

Handler = Callable[[asyncpg.Connection, ReceivedCommand, Mapping[str, Any]], Awaitable[Outcome]]


@dataclass(frozen=True, kw_only=True)
class Participant:
    """A participant service: its actions, its Postgres schema and its business tables.

    ``business_ddl`` holds idempotent statements (CREATE ... IF NOT EXISTS) run at start;
    ``input_types`` lists the saga input records the handlers understand (empty = any).
    """

    name: str
    schema: str
    handlers: Mapping[str, Handler]
    business_ddl: Sequence[str] = ()
    input_types: frozenset[str] = field(default_factory=frozenset)

    @property
    def outbox_table(self) -> str:
        return f"{self.schema}.outbox"

    @property
    def processed_table(self) -> str:
        return f"{self.schema}.processed_commands"

    @property
    def consumer_name(self) -> str:
        """How this participant names itself in dead letters and logs."""
        return f"participant-{self.name}"
