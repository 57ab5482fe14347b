"""The saga input records a process needs: found in the schema folders SAGA_SCHEMA_PATH names, or the process
refuses to start, naming the record and the setting.

A worker that cannot read a saga type's input record would dead-letter every command of that type; an
orchestrator that cannot would reject every start. Both are settings to fix, not messages to isolate.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..schemas.registry import SCHEMA_PATH_ENV, SchemaRegistry, registry_for
from .misconfigured import Misconfigured


def schema_registry(schema_path: str) -> SchemaRegistry:
    """The schema registry of a SAGA_SCHEMA_PATH value; Misconfigured when a folder it names cannot be read."""
    try:
        return registry_for(schema_path)
    except Exception as error:  # a folder or package that is not there, a schema file that does not parse
        raise Misconfigured(f"{SCHEMA_PATH_ENV}={schema_path!r} cannot be read: {error}") from None


def refuse_unknown_records(needs: Iterable[tuple[str, str]], schema_path: str) -> None:
    """``needs`` pairs who needs an input record (e.g. "participant inventory") with its full name;
    Misconfigured naming each record no schema folder of ``schema_path`` (a SAGA_SCHEMA_PATH value) defines, who
    needs it, and the setting."""
    known = set(schema_registry(schema_path).names())
    missing = sorted({(reader, record) for reader, record in needs if record not in known})
    if missing:
        named = "; ".join(f"{reader} reads {record}" for reader, record in missing)
        raise Misconfigured(f"{named}, which no schema folder of {SCHEMA_PATH_ENV}={schema_path!r} defines: add "
                            "the folder (or package) holding its .avsc to SAGA_SCHEMA_PATH")
