"""What a search box's text asks for: a saga id, or the start of a searchable field's value (in one field when
the text names one). Pure: the fields it knows are the deployed definitions' ``searchable`` ones."""

from __future__ import annotations

from collections.abc import Collection, Iterable

from ..orchestrator.domain.definition import SagaDefinition
from .ports import SagaSearch


def parse(text: str, fields: Collection[str], *, tenant: str | None = None, started_after_ms: int | None = None,
          started_before_ms: int | None = None) -> SagaSearch | None:
    """The search ``text`` asks for, narrowed by a tenant and a start window; None for a blank text.

    The whole (trimmed) text is a saga id to match exactly. ``field=value``, where ``field`` is one of ``fields``
    and ``value`` is not blank, looks for ``value`` in that field only, and ``value`` may hold ``=`` itself
    (``a=b=c``: field ``a``, value ``b=c``); any other text, ``=`` or not, is a value looked for in every field.
    A value matches a key that starts with it, whatever the case."""
    whole = text.strip()
    if not whole:
        return None
    name, equals, rest = whole.partition("=")
    field, value = (name.strip(), rest.strip()) if equals and rest.strip() and name.strip() in fields else ("", whole)
    return SagaSearch(saga_id=whole, value=value, field=field, tenant=tenant or None,
                      started_after_ms=started_after_ms, started_before_ms=started_before_ms)


def searchable_fields(definitions: Iterable[SagaDefinition]) -> dict[str, tuple[str, ...]]:
    """Saga type → the input fields its sagas are found by: those any deployed version declares searchable (a
    saga started on an older version keeps the keys it was indexed by), in declaration order, newest version's
    first; types without one are left out."""
    found: dict[str, list[str]] = {}
    for definition in sorted(definitions, key=lambda d: (d.saga_type, -d.version)):
        names = found.setdefault(definition.saga_type, [])
        names += [name for name in definition.searchable if name not in names]
    return {saga_type: tuple(names) for saga_type, names in sorted(found.items()) if names}
