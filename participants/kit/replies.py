"""The StepResult a command gets: what the ledger recorded for its key, as an outbox row of the participant."""

from __future__ import annotations

from ...outbox.table import OutboxMessage
from ...schemas import wire
from ...schemas.headers import message_headers
from ...schemas.ids import reply_message_id, withdrawal_reply_message_id
from ...schemas.message_types import ResultStatus, StepResult
from .ledger import RecordedReply
from .outcome import Deferred, Failed, Outcome, ReceivedCommand


def step_result_message(command: ReceivedCommand, results_topic: str, reply: RecordedReply, *,
                        retryable: bool = False, available_at: int | None = None, operator: str | None = None,
                        detail: str | None = None) -> OutboxMessage:
    """The ``saga.v1.StepResult`` answering ``command`` (this delivery's attempt; a withdrawal's answer under an id
    of its own), as an outbox row; ``operator`` and ``detail``: who gave this answer and why, when a person did (a
    deferred command's answer)."""
    result = StepResult(saga_id=command.saga_id, step=command.step, kind=command.kind,
                        idempotency_key=command.idempotency_key, attempt=command.attempt,
                        status=ResultStatus(reply.result_status), retryable=retryable, error_type=reply.error_type,
                        error_message=reply.error_message, output=reply.output, operator=operator, detail=detail)
    message_id = (withdrawal_reply_message_id if command.withdrawal else reply_message_id)(command.idempotency_key,
                                                                                          command.attempt)
    headers = message_headers(message_id, causation_id=command.message_id, saga_id=command.saga_id,
                              saga_type=command.saga_type, traceparent=command.traceparent)
    return OutboxMessage(topic=results_topic, key=command.saga_id, value=wire.encode_result(result),
                         headers=headers, message_id=message_id, available_at=available_at)


def outcome_message(command: ReceivedCommand, results_topic: str, outcome: Outcome, now_ms: int, *,
                    operator: str | None = None, detail: str | None = None) -> OutboxMessage:
    """Reply for a freshly handled command, honouring the outcome's reply delay (never for ``Deferred``);
    ``operator`` and ``detail`` as ``step_result_message`` takes them."""
    if isinstance(outcome, Deferred):
        raise ValueError("a deferred command is answered later, by participants.kit.deferred.complete")
    delay = outcome.reply_delay_ms
    return step_result_message(command, results_topic, RecordedReply.of(outcome),
                               retryable=isinstance(outcome, Failed) and outcome.retryable,
                               available_at=now_ms + delay if delay > 0 else None, operator=operator, detail=detail)
