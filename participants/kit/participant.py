"""A participant's definition: name, Postgres schema, action handlers and business tables."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from .effects import EffectTable
from .outcome import Outcome, ReceivedCommand

Handler = Callable[[asyncpg.Connection, ReceivedCommand, Mapping[str, Any]], Awaitable[Outcome]]
Call = tuple[ReceivedCommand, Mapping[str, Any]]  # a command and the saga input it carries
BatchHandler = Callable[[asyncpg.Connection, Sequence[Call]], Awaitable[Sequence[Outcome]]]
AnswerReader = Callable[[bytes | None], bytes | None]
"""How a person's answer to a deferred command becomes the step's output: the text given (JSON) in, the encoded
record out; ValueError, saying what does not fit, for an answer the action's output model refuses."""


@dataclass(frozen=True, kw_only=True)
class Participant:
    """A participant service: its actions, its Postgres schema and its business tables.

    ``handlers`` run one command each. ``batch_handlers`` run many commands of one action at once (e.g.
    one multi-row INSERT instead of one per command): the worker's batches hand them consecutive commands
    of their action, and a command on its own is handed over as a batch of one. A batch handler returns one
    outcome per call, in order, and must have the effect of its calls run one after another; a call it answers
    ``Failed`` must have changed nothing (the kit rolls a batch call back only as a whole, when it raises). An
    action has a handler, a batch handler, or both (then the batch handler serves batches of two or more).

    ``business_ddl`` holds idempotent statements (CREATE ... IF NOT EXISTS) run at start;
    ``input_types`` lists the saga input records the handlers understand (empty = any); ``effects`` says where
    its actions' effects show (``kit.effects``: what ``saga effects`` and ``saga verify`` read).
    """

    name: str
    schema: str
    handlers: Mapping[str, Handler] = field(default_factory=dict)
    batch_handlers: Mapping[str, BatchHandler] = field(default_factory=dict)
    business_ddl: Sequence[str] = ()
    input_types: frozenset[str] = field(default_factory=frozenset)
    effects: EffectTable | None = None
    # Action -> how a person's answer to its deferred command is read (typed actions: against the output model);
    # an action without one takes the answer's text as its output, as it is.
    answers: Mapping[str, AnswerReader] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.handlers and not self.batch_handlers:
            raise ValueError(f"participant {self.name!r} has no handlers")
        unknown = sorted(set(self.effects.actions if self.effects else ()) - set(self.actions))
        if unknown:
            raise ValueError(f"participant {self.name!r}: its effects name actions it does not have: "
                             f"{', '.join(unknown)}")

    @property
    def actions(self) -> frozenset[str]:
        """Every action it serves."""
        return frozenset(self.handlers) | frozenset(self.batch_handlers)

    def handler(self, action: str) -> Handler | None:
        """The handler of one ``action`` command (a batch handler given a batch of one), or None."""
        single = self.handlers.get(action)
        if single is not None:
            return single
        many = self.batch_handlers.get(action)
        if many is None:
            return None
        return _one_at_a_time(many)

    def reads(self, command: ReceivedCommand) -> bool:
        """Whether the handlers understand ``command``'s saga input."""
        return not self.input_types or command.input_type in self.input_types

    @property
    def outbox_table(self) -> str:
        return f"{self.schema}.outbox"

    @property
    def processed_table(self) -> str:
        return f"{self.schema}.processed_commands"

    @property
    def awaiting_table(self) -> str:
        """Commands whose handler deferred its answer (``Deferred``), until ``complete`` answers them."""
        return f"{self.schema}.awaiting_commands"

    @property
    def consumer_name(self) -> str:
        """How this participant names itself in dead letters and logs."""
        return f"participant-{self.name}"


def _one_at_a_time(many: BatchHandler) -> Handler:
    async def handle(conn: asyncpg.Connection, command: ReceivedCommand, saga_input: Mapping[str, Any]) -> Outcome:
        outcomes = await many(conn, [(command, saga_input)])
        if len(outcomes) != 1:
            raise RuntimeError(f"batch handler returned {len(outcomes)} outcomes for 1 command")
        return outcomes[0]

    return handle
