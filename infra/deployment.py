"""The one answer to "which saga types, participants and records does this deployment run": ``load_deployment``.

Every process (the orchestrator, each participant worker, the console, the command line, the client, audit and
verify) takes its deployment from here, so they cannot disagree. A deployment is named by its app object
(SAGA_APP, else ``[tool.saga] app`` in the working directory's pyproject.toml: ``infra.app``), or, as in 0.1, by
SAGA_DEFINITIONS, SAGA_PARTICIPANTS and SAGA_SCHEMA_PATH, which are adapted to the same ``Deployment``. When
neither names a saga type, a process that runs them refuses to start in one line naming both settings: nothing
falls back to the example trip.

Nothing here writes the environment: a child process gets the same settings (``saga run all`` passes them all
on) and loads the same deployment itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..schemas.registry import use_schema_folder
from .app import APP_SETTING, LoadedApp, load_app, refuse_problems, schema_path
from .misconfigured import Misconfigured
from .references import load_references
from .settings import Settings

DEFINITIONS_SETTING = "SAGA_DEFINITIONS"
PARTICIPANTS_SETTING = "SAGA_PARTICIPANTS"
NOTHING_NAMED = (f"no saga types named: set {APP_SETTING}=module:attribute of your SagaApp (or, as in 0.1, "
                 f"{DEFINITIONS_SETTING}=module:attribute,...)")
"""The one line a process refuses with when no setting names what it runs (the demo is `make demo`)."""


@dataclass(frozen=True)
class Deployment:
    """What one deployment runs, whichever way it was named.

    ``saga_types`` are the saga definitions by where they came from (a SAGA_DEFINITIONS reference, or the app's
    saga type); ``workers`` the participant workers ``saga run all`` starts, each the names or
    ``module:attribute`` paths of the participants it hosts; ``schema_path`` the SAGA_SCHEMA_PATH value its
    records are read with (the app's schema folder first); ``app`` the app object, or None for a 0.1
    deployment; ``named_by`` the setting and value that named the saga types (for messages: what to fix).
    """

    saga_types: dict[str, Any]
    workers: list[list[str]]
    schema_path: str
    app: LoadedApp | None
    named_by: str

    def participant_names(self) -> list[str]:
        """Every participant of the deployment (names or paths), whichever worker hosts it."""
        return [name for worker in self.workers for name in worker]

    def refuse_problems(self) -> None:
        """Misconfigured, in one line, when the app cannot work (``infra.app.refuse_problems``); a 0.1
        deployment has nothing to check here."""
        if self.app is not None:
            refuse_problems(self.app)


def load_deployment(settings: Settings, *, saga_types: bool = True) -> Deployment:
    """The deployment ``settings`` name: their app, else the 0.1 settings adapted to one.

    ``saga_types`` False is for a process that runs none itself (a participant worker started with its
    participants' names): it may find none named. Otherwise Misconfigured (``NOTHING_NAMED``) when nothing
    names a saga type, and Misconfigured naming the setting when a reference cannot be loaded. The app's
    schema folder goes first on the path this process's default schema registry reads.
    """
    loaded = load_app(settings.saga_app)
    if loaded is not None:
        if loaded.app.schema_folder is not None:
            use_schema_folder(loaded.app.schema_folder)
        # Keyed by type and version: an app that keeps a version beside the next (draining) names both.
        found = {f"{loaded.describe()} {definition.saga_type} v{definition.version}": definition
                 for definition in loaded.app.definitions()}
        workers = (_workers(settings.saga_participants) if settings.saga_participants
                   else [[name] for name in loaded.app.participant_names()])
        return Deployment(found, workers, schema_path(settings.saga_schema_path, loaded), loaded, loaded.describe())
    named_by = f"{DEFINITIONS_SETTING}={settings.saga_definitions!r}"
    if not settings.saga_definitions.strip() and saga_types:
        raise Misconfigured(NOTHING_NAMED)
    try:
        found = load_references(settings.saga_definitions)
    except ValueError as error:
        raise Misconfigured(f"{named_by}: {error}") from None
    return Deployment(found, _workers(settings.saga_participants), settings.saga_schema_path, None, named_by)


def _workers(saga_participants: str) -> list[list[str]]:
    """The workers of a SAGA_PARTICIPANTS value: comma-separated, each the ``+``-joined participants it hosts."""
    workers = [[path.strip() for path in entry.split("+") if path.strip()] for entry in saga_participants.split(",")]
    return [worker for worker in workers if worker]


__all__ = ["NOTHING_NAMED", "Deployment", "load_deployment"]
