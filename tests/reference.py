"""docs/reference.md, written from the public modules' signatures and docstrings, so that it reads as it is
(on a code host, in an editor) and never drifts: tests/unit/test_reference.py fails when it is not what this
writes. ``python -m tests.reference`` writes it again.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
from pathlib import Path
from typing import Any

from saga_orchestrator import authoring, testing
from saga_orchestrator.authoring import saga
from saga_orchestrator.orchestrator.domain import definition
from saga_orchestrator.participants.kit import typed

PATH = Path(__file__).resolve().parents[1] / "docs" / "reference.md"

SECTIONS: list[tuple[str, str, list[tuple[str, Any]]]] = [
    ("Authoring a saga", "`from saga_orchestrator.authoring import ...`", [
        ("Saga", saga.Saga), ("SagaApp", saga.SagaApp), ("StepRef", saga.StepRef), ("SignalRef", saga.SignalRef),
        ("participant", typed.participant), ("ParticipantSpec", typed.ParticipantSpec), ("Action", typed.Action),
        ("StepContext", typed.StepContext), ("EffectTable", authoring.EffectTable),
        ("Succeeded", authoring.Succeeded), ("Failed", authoring.Failed), ("StepFailed", authoring.StepFailed),
        ("Deferred", authoring.Deferred), ("RetryPolicy", authoring.RetryPolicy), ("Expiry", authoring.Expiry),
        ("FailureMode", authoring.FailureMode), ("Condition", authoring.Condition)]),
    ("The engine's form", "A `Saga` builds these; a saga type written as data (a 0.1 deployment) uses them "
     "directly: `from saga_orchestrator.orchestrator.domain.definition import ...`.", [
        ("SagaDefinition", definition.SagaDefinition), ("Step", definition.Step)]),
    ("Testing", "`from saga_orchestrator.testing import ...`", [
        ("SagaEnvironment", testing.SagaEnvironment), ("SagaResult", testing.SagaResult),
        ("succeed", testing.succeed), ("fail", testing.fail), ("fail_transiently", testing.fail_transiently),
        ("time_out", testing.time_out), ("answer_late", testing.answer_late), ("defer", testing.defer),
        ("fault_matrix", testing.fault_matrix), ("FaultCase", testing.FaultCase),
        ("ParticipantHarness", testing.ParticipantHarness), ("Reply", testing.Reply)]),
]


class _Bare(str):
    """An annotation written as the code writes it (no quotes around a postponed annotation)."""

    def __repr__(self) -> str:
        return str(self)


def _signature(name: str, obj: Any) -> str:
    try:
        found = inspect.signature(obj)
    except (TypeError, ValueError):
        return name
    params = [param.replace(annotation=_Bare(param.annotation)) if isinstance(param.annotation, str) else param
              for param in found.parameters.values() if param.name != "self"]
    returns = found.return_annotation
    if inspect.isclass(obj) or returns in ("None", None):
        returns = inspect.Signature.empty
    elif isinstance(returns, str):
        returns = _Bare(returns)
    return f"{name}{found.replace(parameters=params, return_annotation=returns)}"


def _doc(obj: Any) -> str:
    return inspect.getdoc(obj) or ""


def _fields(cls: type) -> list[str]:
    rows = ["| field | type | default |", "| --- | --- | --- |"]
    for field in dataclasses.fields(cls):
        if field.name.startswith("_"):
            continue
        if field.default is not dataclasses.MISSING:
            default = f"`{field.default!r}`"
        elif field.default_factory is not dataclasses.MISSING:
            factory = getattr(field.default_factory, "__name__", "factory")
            default = f"`{factory}()`"
        else:
            default = "required"
        kind = str(field.type).replace("|", "\\|")
        rows.append(f"| `{field.name}` | `{kind}` | {default} |")
    return rows if len(rows) > 2 else []


def _methods(cls: type) -> list[str]:
    lines: list[str] = []
    for name, member in cls.__dict__.items():
        if name.startswith("_") or not (inspect.isfunction(member) or isinstance(member, property)):
            continue
        said = _first_paragraph(_doc(member))
        shown = f"{name}` (property)" if isinstance(member, property) else f"{_signature(name, member)}`"
        lines += [f"- `{cls.__name__}.{shown}" + (f": {said}" if said else "")]
    return lines


def _first_paragraph(text: str) -> str:
    return " ".join(text.split("\n\n")[0].split())


def entry(name: str, obj: Any) -> list[str]:
    """One object's section: its signature, its docstring, its fields or members, its public methods."""
    lines = [f"### {name}", ""]
    if inspect.isclass(obj) and issubclass(obj, enum.Enum):
        lines += [_doc(obj), ""] + [f"- `{name}.{member.name}` = `{member.value!r}`" for member in obj]
        return [*lines, ""]
    lines += ["```python", _signature(name, obj), "```", "", _doc(obj), ""]
    if inspect.isclass(obj):
        if dataclasses.is_dataclass(obj):
            fields = _fields(obj)
            lines += [*fields, ""] if fields else []
        methods = _methods(obj)
        lines += [*methods, ""] if methods else []
    return lines


def render() -> str:
    """The whole page."""
    lines = ["# Reference", "",
             "The public names, with their signatures, fields and defaults, written from the code "
             "(`python -m tests.reference`; a test keeps it current). `saga_orchestrator.authoring`, "
             "`saga_orchestrator.client` and `saga_orchestrator.testing` are the public modules; every other "
             "module is internal.", ""]
    for title, note, objects in SECTIONS:
        lines += [f"## {title}", "", note, ""]
        for name, obj in objects:
            lines += entry(name, obj)
    lines += ["## Settings", "", "Every setting, its default and what it does: [Settings](settings.md).", ""]
    text = "\n".join(lines)
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    return text.rstrip("\n") + "\n"


if __name__ == "__main__":
    PATH.write_text(render())
    print(f"wrote {PATH}")
