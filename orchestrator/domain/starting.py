"""Which definition a StartSaga starts its saga on: the version it names, else the latest of its type that takes
starts. The door refuses a start by the same answer the decision starts it by, so the two never disagree."""

from __future__ import annotations

from ...schemas.message_types import StartSaga
from .definition import DefinitionRegistry, SagaDefinition
from .errors import StartRefused


def start_definition(registry: DefinitionRegistry, start: StartSaga) -> SagaDefinition:
    """The definition ``start`` starts on: ``start.definition_version`` of its type when it names one, else the
    highest version not draining (``DefinitionRegistry.latest``). StartRefused, with a reason that names the type,
    the version and what is registered, when that type is unknown, that version is not registered or drains, or
    (no version named) every version of the type drains."""
    saga_type, version = start.saga_type, start.definition_version
    versions = registry.versions(saga_type)
    if not versions:
        known = ", ".join(registry.types()) or "none"
        raise StartRefused(f"unknown saga_type {saga_type!r} (known: {known})")
    draining = registry.draining(saga_type)
    if version is None:
        definition = registry.latest(saga_type)
        if definition is None:
            raise StartRefused(f"every deployed version of saga_type {saga_type!r} is draining "
                               f"({_listed(draining)}): it takes no new starts")
        return definition
    if version not in versions:
        raise StartRefused(f"saga_type {saga_type!r} has no version {version} (registered: {_listed(versions)})")
    if version in draining:
        open_ = [v for v in versions if v not in draining]
        raise StartRefused(f"saga_type {saga_type!r} v{version} is draining: it takes no new starts (versions "
                           f"taking starts: {_listed(open_) if open_ else 'none'})")
    return registry.get(saga_type, version)


def _listed(versions: tuple[int, ...] | list[int]) -> str:
    return ", ".join(f"v{version}" for version in versions)
