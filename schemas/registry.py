"""Schema registry from files: writer schemas by fingerprint, current schemas by full name.

Every ``*.avsc`` below the schemas folder is one top-level schema of the current contract. Files may
refer to named types defined in other files of the same tree (``saga.v1.CommandKind`` lives in
``messages/step_command.avsc`` and is used by ``messages/step_result.avsc``), so a tree is parsed with
one shared table of named types and each schema is then expanded into a self-contained one: its
fingerprint covers the full definition, exactly as any other Avro library computes it.

``released/<version>/`` holds the schemas of earlier releases. They are loaded too, as extra writer
schemas: a value written by an old producer is found by its fingerprint and resolved into the
current schema of the same name, so consumers always see the current shape.
"""

from __future__ import annotations

import functools
import importlib.util
import io
import json
import os
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fastavro
import fastavro.schema

from .codec import (
    HEADER_SIZE,
    InvalidRecord,
    MalformedBody,
    UnknownFingerprint,
    UnknownSchemaName,
    ValueTooLarge,
    WrongSchema,
    fingerprint_of,
    header_for,
    split_header,
)
from .limits import MAX_VALUE_BYTES

SCHEMAS_DIR = Path(__file__).resolve().parent
RELEASED_DIR_NAME = "released"


@dataclass(frozen=True, slots=True)
class LoadedSchema:
    """One top-level schema file, expanded to stand alone."""

    full_name: str
    schema: dict[str, Any]  # self-contained Avro JSON (docs and defaults kept)
    canonical_form: str
    fingerprint: bytes
    path: Path  # relative to the tree's root


@dataclass(frozen=True, slots=True)
class _Writer:
    name: str  # the name decoded values are reported under (the current one)
    writer: Any  # fastavro-parsed writer schema
    reader: Any  # fastavro-parsed reader schema, or None when writer == current


def _strip_internal(node: Any) -> Any:
    """Drop fastavro's bookkeeping keys so the JSON is plain Avro again."""
    if isinstance(node, dict):
        return {k: _strip_internal(v) for k, v in node.items() if not k.startswith("__")}
    if isinstance(node, list):
        return [_strip_internal(item) for item in node]
    return node


def load_tree(root: Path) -> dict[str, LoadedSchema]:
    """Load every ``*.avsc`` under ``root`` (``released/`` excluded), resolving names across files.

    Files are parsed in rounds: a file that uses a named type from a file not parsed yet waits for the
    next round. A round without progress means a name is defined nowhere, which is a loud error.
    """
    pending = {
        path.relative_to(root): json.loads(path.read_text(encoding="utf-8"))
        for path in sorted(root.rglob("*.avsc"))
        if path.relative_to(root).parts[0] != RELEASED_DIR_NAME
    }
    named: dict[str, Any] = {}
    loaded: dict[str, LoadedSchema] = {}
    while pending:
        missing: dict[Path, str] = {}
        parsed_before = len(loaded)
        for relative, raw in list(pending.items()):
            trial = dict(named)  # a failed parse must not leave half its names behind
            try:
                expanded = fastavro.schema.parse_schema(raw, named_schemas=trial, expand=True)
            except fastavro.schema.UnknownType as error:
                missing[relative] = str(error)
                continue
            named = trial
            del pending[relative]
            schema = _strip_internal(expanded)
            if not isinstance(schema, dict) or "name" not in schema:
                raise ValueError(f"{root / relative}: a schema file must hold one named type")
            full_name = str(schema["name"])
            if full_name in loaded:
                raise ValueError(
                    f"{root / relative}: {full_name} is already defined in {loaded[full_name].path}"
                )
            canonical = fastavro.schema.to_parsing_canonical_form(schema)
            loaded[full_name] = LoadedSchema(
                full_name, schema, canonical, fingerprint_of(canonical), relative
            )
        if len(loaded) == parsed_before:
            detail = "; ".join(f"{path}: {name}" for path, name in sorted(missing.items()))
            raise ValueError(f"unresolved named types under {root}: {detail}")
    return loaded


class SchemaRegistry:
    """Encode and decode single-object Avro values with the schemas of one folder."""

    def __init__(
        self,
        current: Iterable[LoadedSchema],
        released: Iterable[LoadedSchema] = (),
        *,
        max_value_size: int = MAX_VALUE_BYTES,
    ) -> None:
        self.max_value_size = max_value_size
        self._released = tuple(released)
        self._current = {schema.full_name: schema for schema in current}
        self._parsed = {name: fastavro.parse_schema(s.schema) for name, s in self._current.items()}
        self._headers = {name: header_for(s.fingerprint) for name, s in self._current.items()}
        self._writers: dict[bytes, _Writer] = {
            s.fingerprint: _Writer(name, self._parsed[name], None) for name, s in self._current.items()
        }
        for old in self._released:
            if old.fingerprint in self._writers:
                continue  # unchanged since that release
            reader = self._parsed.get(old.full_name)  # None: the type was dropped; decode it as written
            self._writers[old.fingerprint] = _Writer(old.full_name, fastavro.parse_schema(old.schema), reader)

    @classmethod
    def from_directory(
        cls, path: Path | None = None, *, max_value_size: int = MAX_VALUE_BYTES
    ) -> SchemaRegistry:
        """Load the current schemas under ``path`` (default: the installed schemas folder) and the
        released ones under ``path/released/<version>/``."""
        root = SCHEMAS_DIR if path is None else path
        released: list[LoadedSchema] = []
        released_root = root / RELEASED_DIR_NAME
        if released_root.is_dir():
            for version in sorted(p for p in released_root.iterdir() if p.is_dir()):
                released += load_tree(version).values()
        return cls(load_tree(root).values(), released, max_value_size=max_value_size)

    def current_schemas(self) -> list[LoadedSchema]:
        """Every current schema."""
        return list(self._current.values())

    def released_schemas(self) -> list[LoadedSchema]:
        """The released schemas this registry also reads (as writers)."""
        return list(self._released)

    def names(self, under: str | None = None) -> list[str]:
        """Full names of the current schemas, sorted; ``under`` keeps those whose file is in that
        top-level folder (e.g. ``"events"`` or ``"inputs"``)."""
        return sorted(name for name, s in self._current.items() if under is None or s.path.parts[0] == under)

    def schema(self, full_name: str) -> LoadedSchema:
        """The current schema of that name."""
        try:
            return self._current[full_name]
        except KeyError:
            raise UnknownSchemaName(full_name) from None

    def fingerprint(self, full_name: str) -> bytes:
        """The 8-byte CRC-64-AVRO fingerprint of the current schema of that name."""
        return self.schema(full_name).fingerprint

    def encode(self, full_name: str, record: Mapping[str, Any]) -> bytes:
        """Single-object encode ``record`` with the current schema ``full_name``."""
        try:
            header, parsed = self._headers[full_name], self._parsed[full_name]
        except KeyError:
            raise UnknownSchemaName(full_name) from None
        return self._encoded(full_name, header, parsed, record)

    def encode_oldest(self, full_name: str, record: Mapping[str, Any]) -> bytes:
        """Single-object encode ``record`` with the oldest schema ``full_name`` has had, released or current, whose
        fields hold every field of ``record`` that is not None: a value that uses no field added since a release is
        written so that a reader of that release decodes it (an upgrade need not wait for every reader)."""
        self.schema(full_name)  # UnknownSchemaName before anything else
        for old in self._released:
            if old.full_name != full_name:
                continue
            names = {field["name"] for field in old.schema["fields"]}
            if all(value is None or key in names for key, value in record.items()):
                written = {key: value for key, value in record.items() if key in names}
                return self._encoded(full_name, header_for(old.fingerprint), self._writers[old.fingerprint].writer,
                                     written)
        return self.encode(full_name, record)

    def _encoded(self, full_name: str, header: bytes, parsed: Any, record: Mapping[str, Any]) -> bytes:
        buffer = io.BytesIO()
        buffer.write(header)
        try:
            # strict_allow_default: a misspelt or extra field is an error, an omitted defaulted one is not.
            fastavro.schemaless_writer(buffer, parsed, record, strict_allow_default=True)
        except (TypeError, ValueError, KeyError, AttributeError, OverflowError) as error:
            raise InvalidRecord(f"record does not match {full_name}: {error}") from error
        data = buffer.getvalue()
        if len(data) > self.max_value_size:
            raise ValueTooLarge(len(data), self.max_value_size, f"encoded {full_name}")
        return data

    def decode(self, data: bytes) -> tuple[str, dict[str, Any]]:
        """Decode any known value; returns the (current) full name and the record."""
        name, writer = self._writer_for(data)
        return name, self._read(data, name, writer)

    def decode_as(self, data: bytes, expected: str | Collection[str]) -> tuple[str, dict[str, Any]]:
        """Decode a value that must be one of ``expected`` (full names); else raise WrongSchema."""
        name, writer = self._writer_for(data)
        allowed = (expected,) if isinstance(expected, str) else expected
        if name not in allowed:
            raise WrongSchema(name, frozenset(allowed))
        return name, self._read(data, name, writer)

    def _writer_for(self, data: bytes) -> tuple[str, _Writer]:
        if len(data) > self.max_value_size:
            raise ValueTooLarge(len(data), self.max_value_size, "value")
        fingerprint = split_header(data)
        writer = self._writers.get(fingerprint)
        if writer is None:
            raise UnknownFingerprint(fingerprint)
        return writer.name, writer

    @staticmethod
    def _read(data: bytes, name: str, writer: _Writer) -> dict[str, Any]:
        buffer = io.BytesIO(data)
        buffer.seek(HEADER_SIZE)
        try:
            record = fastavro.schemaless_reader(buffer, writer.writer, writer.reader)
        except EOFError as error:
            raise MalformedBody(f"truncated {name} body: {error or 'ended early'}") from error
        except Exception as error:  # fastavro raises many types for bad input; all mean the same here
            raise MalformedBody(f"invalid {name} body: {type(error).__name__}: {error}") from error
        trailing = len(data) - buffer.tell()
        if trailing:
            raise MalformedBody(f"{trailing} trailing bytes after the {name} body")
        if not isinstance(record, dict):
            raise MalformedBody(f"{name} body is not a record")
        return record


SCHEMA_PATH_ENV = "SAGA_SCHEMA_PATH"
DEFAULT_SCHEMA_PATH = "saga_orchestrator.participants.trip"
"""SAGA_SCHEMA_PATH when it is not set: the trip example's package (infra.settings has the same default). Its
records are only read; the trip runs only where SAGA_APP or SAGA_DEFINITIONS names it."""


def schema_folders(path: str) -> list[Path]:
    """The folders a SAGA_SCHEMA_PATH value names (``os.pathsep``-separated): each entry a folder, or the name
    of an importable package (its folder; the package itself is not imported)."""
    folders = []
    for entry in (part.strip() for part in path.split(os.pathsep)):
        if not entry:
            continue
        if Path(entry).is_dir():
            folders.append(Path(entry))
            continue
        try:
            spec = importlib.util.find_spec(entry) if _PACKAGE_NAME.fullmatch(entry) else None
        except ImportError:  # a parent package that does not exist
            spec = None
        if spec is None or not spec.submodule_search_locations:
            raise ValueError(f"{SCHEMA_PATH_ENV} names {entry!r}, which is neither a folder nor a package")
        folders.append(Path(next(iter(spec.submodule_search_locations))))
    return folders


_PACKAGE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


_deployment_folders: list[str] = []
"""Schema folders of this process's deployment (``use_schema_folder``), read before SAGA_SCHEMA_PATH's."""


def use_schema_folder(folder: Path) -> None:
    """Put ``folder`` (a deployment's schema folder) first on the path ``default_registry`` reads, for the rest
    of this process; the environment is left alone."""
    resolved = str(folder.resolve())
    if resolved not in _deployment_folders:
        _deployment_folders.insert(0, resolved)


def default_schema_path() -> str:
    """The schema path ``default_registry`` reads: the deployment's folders, then SAGA_SCHEMA_PATH's."""
    rest = [entry for entry in os.environ.get(SCHEMA_PATH_ENV, DEFAULT_SCHEMA_PATH).split(os.pathsep)
            if entry and entry not in _deployment_folders]
    return os.pathsep.join((*_deployment_folders, *rest))


def default_registry() -> SchemaRegistry:
    """The registry of the installed schemas folder plus the deployment's schema folders and those
    SAGA_SCHEMA_PATH names (a saga type's input records go in their ``inputs/`` subfolder), loaded once and
    shared."""
    return registry_for(default_schema_path())


@functools.cache
def registry_for(schema_path: str) -> SchemaRegistry:
    """The registry of the installed schemas folder plus the folders ``schema_path`` names (a SAGA_SCHEMA_PATH
    value), loaded once per value and shared."""
    extra = schema_folders(schema_path)
    base = SchemaRegistry.from_directory()
    if not extra:
        return base
    added = [schema for root in extra for schema in load_tree(root).values()]
    return SchemaRegistry([*base.current_schemas(), *added], base.released_schemas(),
                          max_value_size=base.max_value_size)
