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


def withdrawal_reply_message_id(idempotency_key: str, attempt: int) -> str:
    """Message id of a participant's answer to the withdrawal of one attempt of a forward command (its own id: the
    attempt's reply, when the command ran, may come as well)."""
    return f"{idempotency_key}:withdrawn:{attempt}"


def position_id(topic: str, partition: int, offset: int) -> str:
    """Identity of a consumed record by its place in the log: the message id of one that carries no
    ``message_id`` header."""
    return f"{topic}:{partition}:{offset}"


def dead_letter_message_id(position: str) -> str:
    """Message id of the dead letter of the record at ``position`` (``position_id``, or a content digest
    for a record handed over without one)."""
    return f"dlq:{position}"


def replay_message_id(letter_position: str) -> str:
    """Message id of a dead letter's record published again; ``letter_position`` is where the letter is
    (``<dlq topic>:<partition>:<offset>``), so replaying one letter twice delivers it once."""
    return f"dlq-replay:{letter_position}"


def purge_causation_id(saga_id: str, seq: int) -> str:
    """Causation id of the SagaPurged event at ``seq``: a purge is no message, so it names itself."""
    return f"purge:{saga_id}:{seq}"


def bulk_message_id(job_id: int, saga_id: str) -> str:
    """Message id of the control command bulk job ``job_id`` sends saga ``saga_id``: one per saga and job, so a
    command queued twice is handled once."""
    return f"bulk:{job_id}:{saga_id}"


def bulk_job_of(message_id: str) -> int | None:
    """The bulk job whose command ``message_id`` is (``bulk_message_id``), None for any other message."""
    prefix, _, rest = message_id.partition(":")
    job, _, saga_id = rest.partition(":")
    return int(job) if prefix == "bulk" and job.isdigit() and saga_id else None
