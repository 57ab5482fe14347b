"""Derived identifiers: idempotency keys and message ids.

FROZEN FORMATS. Participants deduplicate on the idempotency keys and every consumer deduplicates on the
message ids; sagas in flight carry them in their history. Changing a format breaks exactly-once effects for
every saga started before the change, so never change one, add a new one.
"""

from __future__ import annotations


def forward_key(saga_id: str, step: str) -> str:
    """Idempotency key of a step's forward command; identical for every attempt (same operation)."""
    return f"{saga_id}:{step}"


def compensation_key(saga_id: str, step: str) -> str:
    """Idempotency key of a step's compensation; identical for every attempt."""
    return f"{saga_id}:{step}:compensate"


def command_message_id(saga_id: str, seq: int) -> str:
    """Message id of a command; ``seq`` is the seq of its StepCommandSent / CompensationSent event."""
    return f"{saga_id}:command:{seq}"


def event_message_id(saga_id: str, seq: int) -> str:
    """Message id of a saga event published on the events topic."""
    return f"{saga_id}:event:{seq}"


def reply_message_id(idempotency_key: str, attempt: int) -> str:
    """Message id of a participant's reply to one attempt of a command."""
    return f"{idempotency_key}:reply:{attempt}"
