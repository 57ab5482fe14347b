"""Participant kit: idempotent command handling with the reply written through a local outbox.

- ``outcome``: ReceivedCommand, Succeeded / Failed (the Outcome of a handler), Proceed (a rule verdict).
- ``participant``: Participant (name, schema, handlers, batch handlers, business DDL) and the Handler and
  BatchHandler signatures.
- ``handle``: handle_command (one delivery, one local transaction) and Disposition.
- ``batch``: handle_commands (the deliveries that arrived together, one local transaction).
- ``bulk``: insert_rows / record_each, one statement for the business rows of a batch handler's commands.
- ``ddl``: ensure_participant_schema (processed_commands, outbox, business tables).
- ``replies``: StepResult / DeadLetter outbox messages and the reply message-id format.

The package itself imports nothing, so pure modules (``outcome``, business rules) stay free of I/O.
"""
