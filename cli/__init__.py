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

    kafka_records.install()  # `saga dlq list` and the services it runs read records of any shape
    configure_logging("WARNING", "kv")  # a command's own output is its console; `saga run` logs in full
    app()
