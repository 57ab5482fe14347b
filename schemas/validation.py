"""Human-readable problems of a JSON-ish record against an Avro record schema (used by the CLI)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .registry import SchemaRegistry

_PYTHON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "long": (int,),
    "int": (int,),
    "boolean": (bool,),
    "double": (int, float),
    "float": (int, float),
    "bytes": (bytes,),
}


def _accepts(avro_type: Any, value: Any) -> bool:
    if isinstance(avro_type, list):
        return any(_accepts(branch, value) for branch in avro_type)
    if avro_type == "null":
        return value is None
    if isinstance(avro_type, str) and avro_type in _PYTHON_TYPES:
        if isinstance(value, bool) and avro_type != "boolean":
            return False
        return isinstance(value, _PYTHON_TYPES[avro_type])
    return True  # nested and named types: left to the encoder's own check


def _type_label(avro_type: Any) -> str:
    if isinstance(avro_type, list):
        return " or ".join(_type_label(branch) for branch in avro_type)
    return avro_type if isinstance(avro_type, str) else str(avro_type.get("type", avro_type))


def input_problems(registry: SchemaRegistry, full_name: str, record: Mapping[str, Any]) -> list[str]:
    """Every missing, unknown or wrongly typed field of ``record`` for the record schema ``full_name``."""
    fields = registry.schema(full_name).schema["fields"]
    known = {field["name"] for field in fields}
    problems = []
    missing = [f["name"] for f in fields if f["name"] not in record and "default" not in f]
    if missing:
        problems.append(f"missing field(s) {', '.join(missing)}")
    unknown = sorted(set(record) - known)
    if unknown:
        problems.append(f"unknown field(s) {', '.join(unknown)} (allowed: {', '.join(sorted(known))})")
    for field in fields:
        name = field["name"]
        if name in record and not _accepts(field["type"], record[name]):
            problems.append(f"field {name} must be {_type_label(field['type'])}, got {record[name]!r}")
    return problems
