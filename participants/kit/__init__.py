"""Participant kit: idempotent command handling with the reply written through a local outbox.

- ``outcome``: ReceivedCommand, Succeeded / Failed (the Outcome of a handler), Proceed (a rule verdict).
- ``participant``: Participant (name, schema, handlers, business DDL) and the Handler signature.
- ``handle``: handle_command (one delivery, one local transaction) and Disposition.
- ``ddl``: ensure_participant_schema (processed_commands, outbox, business tables).
- ``replies``: StepResult / DeadLetter outbox messages and the reply message-id format.

The package itself imports nothing, so pure modules (``outcome``, business rules) stay free of I/O.
"""
