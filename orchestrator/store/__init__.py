"""Adapters of ``orchestrator.ports``: Postgres for production, in-memory for tests and demos."""
