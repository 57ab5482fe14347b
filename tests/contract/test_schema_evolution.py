"""Every current schema stays compatible, both ways, with each released version of it.

``schemas/released/<version>/`` is a frozen copy of the schema tree as released. New readers must read
old values (reader current, writer released) and old readers must read new values (reader released,
writer current), so producers and consumers can be upgraded in any order. The check is the ``avro``
reference library's own ReaderWriterCompatibilityChecker.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from saga_orchestrator.schemas.evolution import compatibility_problems
from saga_orchestrator.schemas.registry import (
    DEFAULT_SCHEMA_PATH,
    RELEASED_DIR_NAME,
    SCHEMAS_DIR,
    load_tree,
    schema_folders,
)

RELEASES = sorted(p for p in (SCHEMAS_DIR / RELEASED_DIR_NAME).iterdir() if p.is_dir())
# The contract's schemas and the trip example's input record, which 0.1.0 released with them.
CURRENT = {name: schema for folder in (SCHEMAS_DIR, *schema_folders(DEFAULT_SCHEMA_PATH))
           for name, schema in load_tree(folder).items()}
CASES = [(release.name, name) for release in RELEASES for name in sorted(load_tree(release))]


def test_there_is_a_released_contract() -> None:
    assert RELEASES, f"no released schema folder under {SCHEMAS_DIR / RELEASED_DIR_NAME}"
    latest = load_tree(RELEASES[-1])
    assert latest, f"{RELEASES[-1]} holds no schema"


@pytest.mark.parametrize(("release", "name"), CASES, ids=[f"{r}:{n}" for r, n in CASES])
def test_schema_is_compatible_with_its_release(release: str, name: str) -> None:
    assert name in CURRENT, f"{name} was released in {release} and must not be removed (deprecate it instead)"
    released = load_tree(SCHEMAS_DIR / RELEASED_DIR_NAME / release)[name]
    problems = compatibility_problems(name, CURRENT[name].schema, released.schema, release)
    assert not problems, "incompatible schema change:\n" + "\n".join(problems)


# --- the check can fail: deliberate changes to a released schema --------------------------------------


def _fields(schema: dict[str, Any]) -> list[dict[str, Any]]:
    fields: list[dict[str, Any]] = schema["fields"]
    return fields


def _field(schema: dict[str, Any], name: str) -> dict[str, Any]:
    return next(f for f in _fields(schema) if f["name"] == name)


def add_required_field(schema: dict[str, Any]) -> None:
    _fields(schema).append({"name": "currency", "type": "string"})


def rename_field(schema: dict[str, Any]) -> None:
    _field(schema, "step")["name"] = "step_name"


def remove_required_field(schema: dict[str, Any]) -> None:
    schema["fields"] = [f for f in _fields(schema) if f["name"] != "idempotency_key"]


def drop_enum_symbol(schema: dict[str, Any]) -> None:
    _field(schema, "status")["type"]["symbols"] = ["SUCCEEDED"]


def change_type(schema: dict[str, Any]) -> None:
    _field(schema, "attempt")["type"] = "string"


STEP_RESULT = "saga.v1.StepResult"


@pytest.mark.parametrize(
    "change", [add_required_field, rename_field, remove_required_field, drop_enum_symbol, change_type]
)
def test_an_incompatible_change_is_detected_and_named(change: Any) -> None:
    released = CURRENT[STEP_RESULT].schema
    changed = copy.deepcopy(released)
    change(changed)
    problems = compatibility_problems(STEP_RESULT, changed, released, "0.0.0")
    assert problems, f"{change.__name__} went unnoticed"
    assert all(problem.startswith(f"{STEP_RESULT}: ") for problem in problems)


def test_adding_an_optional_field_is_compatible() -> None:
    released = CURRENT[STEP_RESULT].schema
    changed = copy.deepcopy(released)
    _fields(changed).append({"name": "duration_ms", "type": ["null", "long"], "default": None})
    assert compatibility_problems(STEP_RESULT, changed, released, "0.0.0") == []
