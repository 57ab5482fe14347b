"""``saga definitions``: the saga types the deployment runs (SAGA_APP or SAGA_DEFINITIONS), step by step."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.table import Table

from ..orchestrator.domain.definition import RetryPolicy, SagaDefinition, Step
from .context import console, deployed_definitions, fail


def definitions_command(
    saga_type: str | None = typer.Argument(None, help="Only this saga type (every version of it)."),
    as_json: bool = typer.Option(False, "--json", help="As JSON, one object per definition version."),
) -> None:
    """Show each saga type's versions: input record, deadline, and its steps in the order they can run."""
    registry = deployed_definitions()
    types = registry.types()
    if saga_type is not None and saga_type not in types:
        fail(f"unknown saga type {saga_type!r}; known types: {', '.join(sorted(types))}")
    found = [registry.get(name, version) for name in sorted(types) if saga_type in (None, name)
             for version in registry.versions(name)]
    if as_json:
        for definition in found:
            typer.echo(json.dumps(describe(definition)))
        return
    for definition in found:
        console.print(_table(definition))


def describe(definition: SagaDefinition) -> dict[str, Any]:
    """A definition as plain data (what ``--json`` prints)."""
    return {
        "saga_type": definition.saga_type, "version": definition.version, "input_schema": definition.input_schema,
        "failure_mode": str(definition.failure_mode), "deadline_ms": definition.deadline_ms,
        "steps": [_step(definition.step(name)) for name in definition.order],
    }


def _step(step: Step) -> dict[str, Any]:
    return {
        "name": step.name, "participant": step.participant, "command": step.command,
        "compensation": step.compensation, "depends_on": list(step.depends_on), "pivot": step.pivot,
        "run_if": str(step.run_if), "timeout_ms": step.timeout_ms, "retry": _retry(step.retry),
        "compensation_timeout_ms": step.compensation_timeout_ms, "compensation_retry": _retry(step.compensation_retry),
    }


def _retry(policy: RetryPolicy) -> str:
    attempts = "unlimited" if policy.max_attempts is None else f"{policy.max_attempts} attempts"
    return f"{attempts}, backoff {policy.initial_backoff_ms}-{policy.max_backoff_ms} ms"


def _table(definition: SagaDefinition) -> Table:
    deadline = f", deadline {definition.deadline_ms / 1000:g} s" if definition.deadline_ms else ""
    table = Table("step", "participant", "command", "after", "undo", "timeout", "tries",
                  title=f"{definition.saga_type} v{definition.version} ({definition.input_schema}, "
                        f"{definition.failure_mode}{deadline})")
    for name in definition.order:
        step = definition.step(name)
        tries = "∞" if step.retry.max_attempts is None else str(step.retry.max_attempts)
        table.add_row(name + (" (pivot)" if step.pivot else ""), step.participant, step.command,
                      ", ".join(step.depends_on) or "-", step.compensation or "-",
                      f"{step.timeout_ms / 1000:g} s", tries)
    return table
