"""Participant kit: idempotent command handling with the reply written through a local outbox.

- ``outcome``: ReceivedCommand, Succeeded / Failed / Deferred (the Outcome of a handler), Proceed (a rule
  verdict).
- ``participant``: Participant (name, schema, handlers, batch handlers, business DDL) and the Handler and
  BatchHandler signatures.
- ``handling``: handle_commands (the deliveries that arrived together, one local transaction; a lone command
  is a batch of one) and Disposition.
- ``deliveries``: a delivery read and checked before the transaction (parse_delivery), and the DeadLetter row of
  one that cannot run.
- ``handler_calls``: the handlers run inside the transaction, each call in a savepoint, and the kit's limits on
  their outcomes (within_limits).
- ``ledger``: every statement on the participant's record of handled and awaited commands, its DDL and its
  retention.
- ``replies``: the StepResult outbox row a command is answered with.
- ``deferred``: complete, the later answer to a command whose handler returned Deferred.
- ``bulk``: insert_rows / record_each, one statement for the business rows of a batch handler's commands.
- ``ddl``: ensure_participant_schema (the ledger, the outbox, the business tables).

The package itself imports nothing, so pure modules (``outcome``, business rules) stay free of I/O.
"""
