"""Schema evolution: a current schema stays compatible, both ways, with each released version of it.

New readers must read old values (reader current, writer released) and old readers must read new values
(reader released, writer current), so producers and consumers can be upgraded in any order. The check is the
``avro`` reference library's own ReaderWriterCompatibilityChecker. ``released/<version>/`` of a schema folder
is a frozen copy of its schemas as released: the contract's own (``tests/contract/test_schema_evolution.py``)
and a deployment's typed records (``saga schemas check``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import avro.compatibility
import avro.schema

from .registry import RELEASED_DIR_NAME, load_tree


def one_way(name: str, reader: dict[str, Any], writer: dict[str, Any], direction: str) -> list[str]:
    """Why a ``reader`` cannot read values of ``writer``, in words; empty when it can."""
    checker = avro.compatibility.ReaderWriterCompatibilityChecker()  # type: ignore[no-untyped-call]
    result = checker.get_compatibility(avro.schema.parse(json.dumps(reader)), avro.schema.parse(json.dumps(writer)))
    if result.compatibility is avro.compatibility.SchemaCompatibilityType.compatible:
        return []
    kinds = ", ".join(sorted(kind.value for kind in result.incompatibilities))
    where = ", ".join(sorted(result.locations))
    details = ", ".join(sorted(str(message) for message in result.messages))
    return [f"{name}: {direction}: {kinds} at {where} ({details})"]


def compatibility_problems(name: str, current: dict[str, Any], released: dict[str, Any], release: str) -> list[str]:
    """Both directions of the check for one schema against one release."""
    return one_way(name, current, released, f"current reader cannot read values written with release {release}"
                   ) + one_way(name, released, current, f"release {release} reader cannot read values written now")


def releases(folder: Path) -> list[Path]:
    """The ``released/<version>/`` folders of a schema folder, oldest first."""
    root = folder / RELEASED_DIR_NAME
    return sorted(path for path in root.iterdir() if path.is_dir()) if root.is_dir() else []


def evolution_problems(current: dict[str, dict[str, Any]], folder: Path) -> list[str]:
    """Every incompatibility of ``current`` (schemas by full name) with the releases under ``folder``, and every
    released schema that is gone."""
    problems = []
    for release in releases(folder):
        for name, released in load_tree(release).items():
            if name not in current:
                problems.append(f"{name}: released in {release.name} and gone now (deprecate it instead)")
                continue
            problems += compatibility_problems(name, current[name], released.schema, release.name)
    return problems
