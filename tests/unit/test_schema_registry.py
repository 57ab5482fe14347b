"""Loading schema trees: names resolved across files, loud errors, released writer schemas."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import avro.io
import avro.schema
import pytest

from saga_orchestrator.schemas import wire
from saga_orchestrator.schemas.codec import MARKER
from saga_orchestrator.schemas.message_types import StartSaga
from saga_orchestrator.schemas.registry import SCHEMAS_DIR, SchemaRegistry, load_tree

START = "saga.v1.StartSaga"


def avro_body(schema: avro.schema.Schema, record: Any) -> bytes:
    buffer = io.BytesIO()
    avro.io.DatumWriter(schema).write(record, avro.io.BinaryEncoder(buffer))
    return buffer.getvalue()


def _write(root: Path, relative: str, schema: dict[str, Any]) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(schema))


def test_names_resolve_across_files_whatever_the_file_order(tmp_path: Path) -> None:
    kind = {"type": "enum", "name": "Kind", "namespace": "t", "symbols": ["A"]}
    _write(
        tmp_path,
        "a/user.avsc",
        {"type": "record", "name": "t.User", "fields": [{"name": "k", "type": "t.Kind"}]},
    )
    _write(tmp_path, "z/kind.avsc", kind)
    loaded = load_tree(tmp_path)
    assert sorted(loaded) == ["t.Kind", "t.User"]
    assert '"type":"enum"' in loaded["t.User"].canonical_form


def test_an_undefined_name_is_a_loud_error(tmp_path: Path) -> None:
    _write(
        tmp_path, "a.avsc", {"type": "record", "name": "t.A", "fields": [{"name": "k", "type": "t.Missing"}]}
    )
    with pytest.raises(ValueError, match=r"unresolved named types.*t\.Missing"):
        load_tree(tmp_path)


def test_a_value_from_a_released_writer_is_resolved_into_the_current_schema(tmp_path: Path) -> None:
    shutil.copytree(SCHEMAS_DIR, tmp_path / "schemas", ignore=shutil.ignore_patterns("released", "*.py"))
    root = tmp_path / "schemas"
    old_start = {
        "type": "record",
        "name": "StartSaga",
        "namespace": "saga.v1",
        "fields": [{"name": "saga_id", "type": "string"}, {"name": "saga_type", "type": "string"},
                   {"name": "input", "type": "bytes"}],
    }  # fmt: skip
    _write(root, "released/0.0.1/commands/start_saga.avsc", old_start)
    registry = SchemaRegistry.from_directory(root)
    old = avro.schema.parse(json.dumps(old_start))
    data = (
        MARKER
        + old.fingerprint("CRC-64-AVRO")
        + avro_body(old, {"saga_id": "s", "saga_type": "trip", "input": b"i"})
    )
    assert registry.decode_as(data, START) == (
        START,
        {"saga_id": "s", "saga_type": "trip", "tenant_id": None, "input": b"i", "definition_version": None},
    )
    assert registry.names() == SchemaRegistry.from_directory().names()  # released schemas are writers only


def test_a_start_from_a_0_2_client_names_no_version() -> None:
    old = avro.schema.parse((SCHEMAS_DIR / "released/0.2.0/commands/start_saga.avsc").read_text())
    data = MARKER + old.fingerprint("CRC-64-AVRO") + avro_body(
        old, {"saga_id": "s", "saga_type": "trip", "tenant_id": None, "input": b"i"})
    assert wire.decode_start(data) == StartSaga(saga_id="s", saga_type="trip", tenant_id=None, input=b"i",
                                                definition_version=None)


def test_two_files_defining_one_name_is_a_loud_error(tmp_path: Path) -> None:
    kind = {"type": "enum", "name": "t.Kind", "symbols": ["A"]}
    _write(tmp_path, "a.avsc", kind)
    _write(tmp_path, "b.avsc", kind)
    with pytest.raises(ValueError, match=r"t\.Kind is already defined in a\.avsc"):
        load_tree(tmp_path)


def test_a_value_of_a_type_dropped_since_its_release_still_decodes_as_written(tmp_path: Path) -> None:
    gone = {"type": "record", "name": "t.Gone", "fields": [{"name": "n", "type": "long"}]}
    _write(tmp_path, "current.avsc", {"type": "record", "name": "t.Here", "fields": []})
    _write(tmp_path, "released/0.0.1/gone.avsc", gone)
    registry = SchemaRegistry.from_directory(tmp_path)
    old = avro.schema.parse(json.dumps(gone))
    data = MARKER + old.fingerprint("CRC-64-AVRO") + avro_body(old, {"n": 5})
    assert registry.decode(data) == ("t.Gone", {"n": 5})
    assert registry.names() == ["t.Here"]
