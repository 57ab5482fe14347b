"""``saga definitions``: the saga types the deployment runs (SAGA_APP or SAGA_DEFINITIONS), step by step, and
how many sagas run and ended on each version (when the database answers), versions no longer deployed too."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg
import typer
from rich.table import Table

from ..client.api import ApiError
from ..infra.db import create_pool
from ..infra.failures import Fault, classify
from ..infra.failures import describe as one_line
from ..operations.postgres import reads_store
from ..operations.versions import (
    DefinitionVersion,
    ShapeCounts,
    VersionCounts,
    definition_versions,
    version_counts,
)
from ..orchestrator.domain.definition import RetryPolicy, SagaDefinition, Step
from .context import console, deployed_definitions, errors, fail, run, settings
from .inspect_cmd import console_api

COUNTS_TIMEOUT_S = 5.0
"""How long the counts may take, connecting included: without them the definitions are still shown."""


def definitions_command(
    saga_type: str | None = typer.Argument(None, help="Only this saga type (every version of it)."),
    as_json: bool = typer.Option(False, "--json", help="As JSON, one object per definition version."),
) -> None:
    """Show each saga type's versions: input record, deadline, its steps in the order they can run, and how many
    of its sagas run and ended (read from the database; versions not deployed that still have sagas too)."""
    registry = deployed_definitions()
    if saga_type is not None and saga_type not in registry.types():  # refused before Postgres is asked
        fail(f"unknown saga type {saga_type!r}; known types: {', '.join(registry.types())} (without a type, the "
             "versions no longer deployed that still have sagas are listed too)")
    counts, unavailable = run(version_counts_or_why())
    found = definition_versions(registry, counts, saga_type)
    if unavailable is not None:
        errors.print(f"counts unavailable: {unavailable}", soft_wrap=True, markup=False, highlight=False)
    if as_json:
        for version in found:
            typer.echo(json.dumps(describe_version(version)))
        return
    for version in found:
        if version.definition is not None:
            console.print(_table(version.definition, version.counts, version.draining))
        elif version.version is None:
            console.print(f"[bold]{version.saga_type}[/], version unrecorded: {_sagas(version.counts)} (started before "
                          "versions were recorded; `saga reproject` records them)", soft_wrap=True)
        else:
            console.print(f"[bold]{version.saga_type} v{version.version}[/]: not deployed; {_sagas(version.counts)}",
                          soft_wrap=True)
        if version.counts is not None and len(version.counts.shapes) > 1:  # one version, several shapes
            for shape in version.counts.shapes:
                console.print(f"  shape {shape.fingerprint or 'unrecorded'}: {shape.running} running, "
                              f"{shape.ended} ended", soft_wrap=True)


async def version_counts_or_why() -> tuple[list[VersionCounts] | None, str | None]:
    """The sagas per type and version, or None and why they cannot be read (Postgres or the console's API away or
    refusing): through the console's API when only SAGA_API_URL is set, else from the database."""
    api = console_api()
    if api is not None:
        try:
            found = await api.definitions()
        except ApiError as error:
            return None, str(error)
        return [VersionCounts(v["saga_type"], v["version"], v["running"], v["ended"], tuple(
                    ShapeCounts(s["fingerprint"], s["running"], s["ended"]) for s in v["shapes"]))
                for v in found if v["shapes"]], None  # a version without sagas has no shape
    try:
        pool = await asyncio.wait_for(create_pool(settings().dsn(), 1, connect_timeout_s=0), COUNTS_TIMEOUT_S)
    except Exception as error:
        return None, f"cannot reach Postgres ({_unavailable(error)})"
    try:
        return await asyncio.wait_for(version_counts(reads_store(pool)), COUNTS_TIMEOUT_S), None
    except Exception as error:
        return None, f"Postgres refused the read ({_unavailable(error)}); `saga migrate` creates the tables"
    finally:
        await pool.close()


def _unavailable(error: Exception) -> str:
    """``error`` in one line when it says the database is away or refuses; anything else is a bug: re-raised."""
    if classify(error) is Fault.PLATFORM or isinstance(error, asyncpg.PostgresError):
        return one_line(error)
    raise error


def describe_version(version: DefinitionVersion) -> dict[str, Any]:
    """A version as plain data (what ``--json`` prints): its definition when deployed, whether it drains (takes
    no new starts), and its sagas (null when they could not be counted)."""
    shown = describe(version.definition) if version.definition is not None else {
        "saga_type": version.saga_type, "version": version.version}
    counts = version.counts
    return {**shown, "deployed": version.deployed, "draining": version.draining, "sagas": None if counts is None else {
        "running": counts.running, "ended": counts.ended,
        "shapes": [{"fingerprint": s.fingerprint, "running": s.running, "ended": s.ended} for s in counts.shapes]}}


def _sagas(counts: VersionCounts | None) -> str:
    return "sagas not counted" if counts is None else f"{counts.running} running, {counts.ended} ended"


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


def _table(definition: SagaDefinition, counts: VersionCounts | None, draining: bool = False) -> Table:
    deadline = f", deadline {definition.deadline_ms / 1000:g} s" if definition.deadline_ms else ""
    sagas = "" if counts is None else f": {_sagas(counts)}"
    drains = ", draining: no new starts" if draining else ""
    table = Table("step", "participant", "command", "after", "undo", "timeout", "tries",
                  title=f"{definition.saga_type} v{definition.version}{drains} ({definition.input_schema}, "
                        f"{definition.failure_mode}{deadline}){sagas}")
    for name in definition.order:
        step = definition.step(name)
        tries = "∞" if step.retry.max_attempts is None else str(step.retry.max_attempts)
        table.add_row(name + (" (pivot)" if step.pivot else ""), step.participant, step.command,
                      ", ".join(step.depends_on) or "-", step.compensation or "-",
                      f"{step.timeout_ms / 1000:g} s", tries)
    return table
