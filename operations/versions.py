"""How many sagas run and how many ended on each version of each saga type, beside the versions deployed.

Several versions of a type are served at once on purpose (a saga is decided by the version and shape it started
on), so an operator needs to see when an old version has drained before retiring it, and which versions still
have sagas that no deployed definition serves. Read over the ``ReadsStore`` port in one aggregate."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ..orchestrator.domain.definition import DefinitionRegistry, SagaDefinition
from ..orchestrator.domain.model import UNSETTLED_STATUSES
from .ports import ReadsStore, ShapeStatusCount

__all__ = ["RUNNING_STATUSES", "DefinitionVersion", "OldPath", "ShapeCounts", "VersionCounts", "definition_versions",
           "on_old_path", "tally", "version_counts"]

RUNNING_STATUSES: frozenset[str] = frozenset(status.value for status in UNSETTLED_STATUSES)
"""The states a decision may still move a saga out of (``UNSETTLED_STATUSES``): such a saga still needs its version
deployed. Every other state counts as ended."""


@dataclass(frozen=True)
class ShapeCounts:
    """The sagas of one version that started on one shape (``fingerprint``; None: not recorded)."""

    fingerprint: str | None
    running: int
    ended: int


@dataclass(frozen=True)
class VersionCounts:
    """The sagas of one type that started on one version (None: a row written before versions were recorded,
    "unrecorded"): how many still run (``RUNNING_STATUSES``), how many ended, and the same per shape."""

    saga_type: str
    version: int | None
    running: int
    ended: int
    shapes: tuple[ShapeCounts, ...] = ()


@dataclass(frozen=True)
class DefinitionVersion:
    """One version of a saga type as an operator sees it: its definition when deployed here (None: only sagas
    name it), its sagas (None when they could not be counted), and whether it is draining: deployed but taking no
    new starts (SAGA_DRAINING, as the orchestrator's registry says), while its sagas go on to their end."""

    saga_type: str
    version: int | None
    definition: SagaDefinition | None
    counts: VersionCounts | None = field(default=None)
    draining: bool = False

    @property
    def deployed(self) -> bool:
        return self.definition is not None


def _order(version: int | None) -> int:
    return -1 if version is None else version  # "unrecorded" first: it is the oldest


def tally(cells: Iterable[ShapeStatusCount]) -> list[VersionCounts]:
    """``cells`` summed per (type, version) into running and ended, with each shape's share; by type, then
    version ("unrecorded" first), shapes by fingerprint (an unrecorded one first)."""
    per_shape: dict[tuple[str, int | None], dict[str | None, list[int]]] = {}
    for cell in cells:
        counts = per_shape.setdefault((cell.saga_type, cell.version), {}).setdefault(cell.fingerprint, [0, 0])
        counts[0 if cell.status in RUNNING_STATUSES else 1] += cell.count
    found = []
    for (saga_type, version), shapes in sorted(per_shape.items(), key=lambda item: (item[0][0], _order(item[0][1]))):
        ordered = tuple(ShapeCounts(fingerprint, running, ended) for fingerprint, (running, ended)
                        in sorted(shapes.items(), key=lambda item: (item[0] is not None, item[0] or "")))
        found.append(VersionCounts(saga_type, version, sum(s.running for s in ordered), sum(s.ended for s in ordered),
                                   ordered))
    return found


async def version_counts(store: ReadsStore) -> list[VersionCounts]:
    """How many sagas run and how many ended per saga type and version, over every saga of the read model."""
    return tally(await store.version_counts())


def definition_versions(definitions: DefinitionRegistry, counts: Sequence[VersionCounts] | None,
                        saga_type: str | None = None) -> list[DefinitionVersion]:
    """Every deployed version (of ``saga_type`` only, when given) with its counts (zero when ``counts`` has none
    for it; None when ``counts`` is None: not counted) and whether ``definitions`` drains it, and every version
    ``counts`` names that is not deployed; by type, then version ("unrecorded" first)."""
    counted = {(c.saga_type, c.version): c for c in counts or ()}
    found: dict[tuple[str, int | None], DefinitionVersion] = {(name, version): DefinitionVersion(
                name, version, definitions.get(name, version),
                None if counts is None else counted.get((name, version), VersionCounts(name, version, 0, 0)),
                version in definitions.draining(name))
             for name in definitions.types() for version in definitions.versions(name)}
    for key, count in counted.items():
        found.setdefault(key, DefinitionVersion(count.saga_type, count.version, None, count))
    return [found[key] for key in sorted(found, key=lambda key: (key[0], _order(key[1])))
            if saga_type in (None, key[0])]


@dataclass(frozen=True)
class OldPath:
    """Running sagas of one version and shape whose shape lacks a patch: they may still take the path the patch's
    marker keeps (``SagaDefinition.patches``)."""

    saga_type: str
    version: int
    fingerprint: str | None
    running: int


def on_old_path(definitions: DefinitionRegistry, counts: Sequence[VersionCounts], patch: str) -> list[OldPath]:
    """The running sagas, per version and shape, of every definition declaring ``patch`` whose shape lacks it (one
    recorded before fingerprints counts as lacking every patch): while there are any, the marker must stay; when
    there are none, its steps can become plain steps. ValueError when no definition declares ``patch``."""
    declaring = {(d.saga_type, d.version): d for d in definitions.definitions() if patch in d.patches}
    if not declaring:
        declared = sorted({p for d in definitions.definitions() for p in d.patches})
        raise ValueError(f"no deployed definition declares patch {patch!r} (declared: {', '.join(declared) or 'none'})")
    found = []
    for count in counts:
        definition = declaring.get((count.saga_type, count.version or 0))
        if definition is None:
            continue
        for shape in count.shapes:
            if shape.running and patch in (definition.lacking(shape.fingerprint) or ()):
                found.append(OldPath(definition.saga_type, definition.version, shape.fingerprint, shape.running))
    return found
