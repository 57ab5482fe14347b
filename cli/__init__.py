"""The ``saga`` command: start, follow, operate and audit sagas, and run the services."""

from __future__ import annotations

import sys

NEEDS = ("typer", "rich")


def main() -> None:
    """The ``saga`` console script: the command line, or what to install when its libraries are missing."""
    try:
        from .main import app
    except ImportError as error:
        if error.name not in NEEDS:
            raise
        sys.exit(f"saga: the command line needs {error.name}, which this installation lacks; "
                 "install it with: pip install 'saga-orchestrator[orchestrator]'")
    from ..infra import kafka_records
    from ..infra.logging import configure_logging
    from ..infra.misconfigured import Misconfigured

    kafka_records.install()  # `saga dlq list` and the services it runs read records of any shape
    configure_logging("WARNING", "kv")  # a command's own output is its console; `saga run` logs in full
    try:
        app()
    except Exception as error:  # a setting no retry changes, or a dependency away: one line, never a traceback
        line = str(error) if isinstance(error, Misconfigured) else dependency_failure(error)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        sys.exit(2)


def dependency_failure(error: BaseException) -> str | None:
    """One line for a failure of Kafka or Postgres that reached the command line (None for anything else)."""
    import asyncpg

    from ..infra.failures import Fault, classify, describe

    if classify(error) is Fault.PLATFORM:
        return (f"Kafka or Postgres did not answer ({describe(error)}); run `saga infra up`, or set "
                "KAFKA_BOOTSTRAP_SERVERS and DATABASE_URL")
    if isinstance(error, asyncpg.UndefinedTableError):
        return f"Postgres has no saga tables here ({describe(error)}): run `saga migrate`, or check DATABASE_URL"
    if isinstance(error, asyncpg.PostgresError):
        return f"Postgres refused: {describe(error)}; check DATABASE_URL"
    return None
