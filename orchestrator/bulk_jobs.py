"""What the console's reads still take from here: bulk jobs are ``operations.bulk_jobs`` (the use-case) and
``orchestrator.store.operations.bulk_jobs`` (their SQL) now; this module holds no statement."""

from __future__ import annotations

from ..operations.bulk_jobs import BulkJobError, Selection, criteria
from .domain.definition import DefinitionRegistry
from .store.operations import bulk_jobs as _store
from .store.operations.bulk_jobs import Where

__all__ = ["BulkJobError", "Selection", "Where", "where"]


def where(selection: Selection, registry: DefinitionRegistry, as_of: str = "now()", first: int = 1) -> Where:
    """``orchestrator.store.operations.bulk_jobs.where`` of ``selection`` resolved against ``registry``."""
    return _store.where(criteria(selection, registry), as_of, first)
