"""What a deploy would do to the sagas already running: the check the orchestrator runs before it starts.

A saga is decided only by the shape of the definition it started on (its recorded fingerprint). A deploy that
no longer registers its version, or registers that version with another shape, would quarantine it at its
next message; the orchestrator refuses such a deploy at start, one line per (type, version, shape) it would
hit, unless told to go ahead (``SAGA_ALLOW_STRANDING``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .changes import Verdict, diff_shapes
from .definition import DefinitionRegistry
from .errors import UnknownDefinition


@dataclass(frozen=True)
class RunningShape:
    """How many sagas a decision may still move on run on one (type, version, shape); ``version`` and
    ``fingerprint`` are None for sagas whose read-model row was written before they were recorded."""

    saga_type: str
    version: int | None
    fingerprint: str | None
    sagas: int


def stranded(registry: DefinitionRegistry, running: Sequence[RunningShape],
             recorded: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per group of ``running`` sagas that ``registry`` would strand: their version missing, or
    registered with another shape (named step by step from its ``recorded`` shape). Empty: the deploy keeps
    every running saga on its path. Sagas of no recorded version are decided as before and not counted."""
    problems: list[str] = []
    for group in running:
        if group.version is None:
            continue
        where = f"{group.saga_type} v{group.version}: {group.sagas} running saga{'s' if group.sagas != 1 else ''}"
        try:
            definition = registry.get(group.saga_type, group.version)
        except UnknownDefinition:
            deployed = ", ".join(f"v{version}" for version in registry.versions(group.saga_type)) or "none"
            problems.append(f"{where} would be quarantined: v{group.version} is not deployed (deployed: "
                            f"{deployed}); keep it beside the new version until they end")
            continue
        if group.fingerprint is None or definition.lacking(group.fingerprint) is not None:
            continue  # one of the version's shapes: the full one, or one without some of its patches
        old = recorded.get(group.fingerprint)
        if old is None:
            changed = f"shape {group.fingerprint} was not recorded, so the change cannot be named"
        else:
            changed = "; ".join(change.what for change in diff_shapes(old, definition.shape())
                                if change.verdict is not Verdict.SAFE)
        upcoming = max(registry.versions(group.saga_type)) + 1
        problems.append(f"{where} started on shape {group.fingerprint} would be quarantined: the deployed "
                        f"v{group.version} has shape {definition.fingerprint} ({changed}); deploy the change "
                        f"as v{upcoming} beside v{group.version}")
    return problems
