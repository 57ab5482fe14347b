"""The adapters of the operations wing's store port (``operations.ports``): one module per concern, each holding
the Postgres adapter (every SQL statement on the orchestrator's schema that an operator use-case runs) and the
memory adapter the test kit uses."""
