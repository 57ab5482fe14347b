"""Typed records: a pydantic model as an Avro record of the contract.

A saga's input and each step's output are pydantic models; their Avro schemas are generated from them by
py-avro-schema (J.P. Morgan's generator, which reads plain ``BaseModel`` classes: no base class of its own to
inherit, unlike dataclasses-avroschema's ``AvroBaseModel``), with Python ints as ``long``, datetimes as
``timestamp-millis`` and no docs. Every record of a saga type lives in one namespace (``Record.namespace``),
so its full name is ``<namespace>.<ClassName>``. ``saga schemas write`` writes the schemas into a schema folder
(``inputs/`` for saga inputs, ``outputs/`` for step outputs), where the registry reads them like any other
``.avsc`` file and the released-schema evolution check covers them (``schemas.evolution``).

Values travel as single-object encoded Avro, as every other value: ``to_avro`` and ``from_avro`` turn a model
into the record the registry encodes, and back.
"""

from __future__ import annotations

import enum
import inspect
import json
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import py_avro_schema
from pydantic import BaseModel

INPUTS_FOLDER = "inputs"
OUTPUTS_FOLDER = "outputs"
SIGNALS_FOLDER = "signals"
_OPTIONS = py_avro_schema.Option.NO_DOC | py_avro_schema.Option.MILLISECONDS | py_avro_schema.Option.NO_AUTO_NAMESPACE


@dataclass(frozen=True)
class Record:
    """A pydantic model as the Avro record ``<namespace>.<model's class name>``, and where its file goes."""

    model: type[BaseModel]
    namespace: str
    folder: str = INPUTS_FOLDER  # inputs/, outputs/ or signals/ of a schema folder

    @property
    def full_name(self) -> str:
        return f"{self.namespace}.{self.model.__name__}"

    def schema(self) -> dict[str, Any]:
        """The Avro schema, every named type nested in it defined in place."""
        _resolve_annotations(self.model)
        generated: dict[str, Any] = json.loads(py_avro_schema.generate(self.model, namespace=self.namespace,
                                                                       options=_OPTIONS))
        return generated

    def file_name(self) -> str:
        """Its file in a schema folder, by its full name (``inputs/saga.v1.checkout.Order.avsc``): one model may be
        the output of actions of two participants, a record in each one's namespace."""
        return f"{self.folder}/{self.full_name}.avsc"


def to_avro(value: BaseModel) -> dict[str, Any]:
    """``value`` as the record its schema encodes (enum members by their value)."""
    plain: dict[str, Any] = _plain(value.model_dump(mode="python"))
    return plain


def from_avro(model: type[BaseModel], record: Mapping[str, Any]) -> BaseModel:
    """The model instance a decoded record holds (validated)."""
    return model.model_validate(dict(record))


def schema_files(records: Iterable[Record]) -> dict[str, dict[str, Any]]:
    """The files of ``records`` (by file name, each a schema): a named type nested in more than one of them is
    defined in the first that holds it and referred to by name in the others, so one folder defines it once."""
    files: dict[str, dict[str, Any]] = {}
    defined: set[str] = set()
    for record in sorted(set(records), key=lambda r: (r.folder, r.full_name)):
        files[record.file_name()] = _define_once(record.schema(), record.namespace, defined)
    return files


def _define_once(node: Any, namespace: str, defined: set[str]) -> Any:
    if isinstance(node, list):
        return [_define_once(item, namespace, defined) for item in node]
    if not isinstance(node, dict):
        return node
    if node.get("type") in ("record", "enum", "fixed") and "name" in node:
        name = node["name"] if "." in node["name"] else f"{node.get('namespace', namespace)}.{node['name']}"
        if name in defined:
            return name
        defined.add(name)
        return {key: _define_once(value, node.get("namespace", namespace), defined) for key, value in node.items()}
    return {key: _define_once(value, namespace, defined) for key, value in node.items()}


def _resolve_annotations(model: type[BaseModel], seen: set[type] | None = None) -> None:
    """Give ``model`` and every model nested in it their annotations as types rather than strings.

    py-avro-schema reads a model's raw ``__annotations__``, which a module under ``from __future__ import
    annotations`` keeps as strings; pydantic resolved them when it built the model, and so does
    ``typing.get_type_hints`` here, with the model's own module as the namespace."""
    seen = set() if seen is None else seen
    if model in seen:
        return
    seen.add(model)
    for cls in model.__mro__:
        own = inspect.get_annotations(cls)
        if not own or cls is BaseModel or not (isinstance(cls, type) and issubclass(cls, BaseModel)):
            continue
        if any(isinstance(hint, str) for hint in own.values()):
            hints = typing.get_type_hints(cls, include_extras=True)
            cls.__annotations__ = {name: hints.get(name, hint) for name, hint in own.items()}
    for field in model.model_fields.values():
        for nested in _models_in(field.annotation):
            _resolve_annotations(nested, seen)


def _models_in(hint: Any) -> list[type[BaseModel]]:
    if isinstance(hint, type) and issubclass(hint, BaseModel):
        return [hint]
    return [model for arg in typing.get_args(hint) for model in _models_in(arg)]


def _plain(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value
