"""The one place a deployment's saga types, records and participants are named: its app object.

SAGA_APP names it (``module:attribute`` of a ``SagaApp``), or the ``app`` key of the ``[tool.saga]`` table in the
``pyproject.toml`` of the working directory. The orchestrator, every participant worker, the command line and
the client take their definitions, participants and Avro records from it (through ``infra.deployment``, which
also adapts a 0.1 deployment's SAGA_DEFINITIONS, SAGA_SCHEMA_PATH and SAGA_PARTICIPANTS), so they cannot
disagree.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ..schemas.typed import Record, schema_files
from .misconfigured import Misconfigured
from .references import load_reference

APP_SETTING = "SAGA_APP"
PYPROJECT_TABLE = "[tool.saga] app"


@runtime_checkable
class App(Protocol):
    """What a process asks of a deployment's app object (``authoring.SagaApp``)."""

    schema_folder: Path | None

    def definitions(self) -> Sequence[Any]: ...

    def participant_names(self) -> list[str]: ...

    def participant(self, name: str) -> Any: ...

    def records(self) -> list[Record]: ...

    def problems(self) -> list[str]: ...


@dataclass(frozen=True)
class LoadedApp:
    """An app object and where it was named (for messages: the setting to fix)."""

    app: App
    reference: str
    named_by: str

    def describe(self) -> str:
        return f"{self.named_by}={self.reference!r}"


_loaded: dict[str, LoadedApp] = {}


def app_reference(saga_app: str | None, directory: Path | None = None) -> tuple[str, str] | None:
    """The app reference and what named it: SAGA_APP, else ``[tool.saga] app`` of ``directory``'s (the working
    directory's) pyproject.toml; None when neither does."""
    if saga_app:
        return saga_app, APP_SETTING
    pyproject = (directory or Path.cwd()) / "pyproject.toml"
    if not pyproject.is_file():
        return None
    try:
        table = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("tool", {}).get("saga", {})
    except tomllib.TOMLDecodeError as error:
        raise Misconfigured(f"{pyproject} is no valid TOML ({error}), so its {PYPROJECT_TABLE} cannot be read"
                            ) from None
    reference = table.get("app") if isinstance(table, dict) else None
    if reference is None:
        return None
    if not isinstance(reference, str):
        raise Misconfigured(f"{PYPROJECT_TABLE} in {pyproject} must be a module:attribute string")
    return reference, f"{PYPROJECT_TABLE} ({pyproject})"


def load_app(saga_app: str | None) -> LoadedApp | None:
    """The deployment's app (loaded once per process), or None in a 0.1 deployment; Misconfigured says what is
    wrong with the reference. Processes take it through ``infra.deployment.load_deployment``."""
    found = app_reference(saga_app)
    if found is None:
        return None
    reference, named_by = found
    if reference in _loaded:
        return _loaded[reference]
    try:
        app = load_reference(reference)
    except ValueError as error:
        raise Misconfigured(f"{named_by}={reference!r}: {error}") from None
    if not isinstance(app, App):
        raise Misconfigured(f"{named_by}={reference!r} names {type(app).__name__}, not a SagaApp")
    loaded = _loaded[reference] = LoadedApp(app, reference, named_by)
    return loaded


def schema_path(saga_schema_path: str, loaded: LoadedApp | None) -> str:
    """The SAGA_SCHEMA_PATH a process reads with: the app's schema folder first."""
    if loaded is None or loaded.app.schema_folder is None:
        return saga_schema_path
    folder = str(loaded.app.schema_folder.resolve())
    rest = [entry for entry in saga_schema_path.split(os.pathsep) if entry and entry != folder]
    return os.pathsep.join((folder, *rest))


def stale_records(loaded: LoadedApp) -> list[str]:
    """The app's records whose file in its schema folder is missing or not what its model generates now."""
    folder = loaded.app.schema_folder
    records = loaded.app.records()
    if not records:
        return []
    if folder is None:
        return [f"{record.full_name} (the app names no schema_folder to keep it in)" for record in records]
    stale = []
    for name, schema in schema_files(records).items():
        path = folder / name
        try:
            written = json.loads(path.read_text(encoding="utf-8"))
        except Exception:  # missing, unreadable or no JSON: not what is generated either
            written = None
        if written != schema:
            stale.append(str(path))
    return stale


def refuse_problems(loaded: LoadedApp) -> None:
    """Misconfigured, in one line, when the app cannot work: a participant a saga names that nobody serves, an
    action a saga names that its participant lacks, a record whose file is missing or stale."""
    problems = loaded.app.problems()
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise Misconfigured(f"{loaded.describe()}: {problems[0]}{more}")
    stale = stale_records(loaded)
    if stale:
        raise Misconfigured(f"{loaded.describe()}: the Avro records in {', '.join(stale[:3])} are missing or not "
                            "what their pydantic models generate now: run `saga schemas write`")
