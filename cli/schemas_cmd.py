"""``saga schemas``: the Avro records of a deployment's app, written from its pydantic models and checked.

``write`` (re)writes every record the app's sagas and participants use into its schema folder (``inputs/`` for
saga inputs, ``outputs/`` for step outputs), where every process and an outside client read them. ``check`` fails
when a file is missing or stale, or a record is no longer compatible, both ways, with a version released under
``released/<version>/`` (or is gone); run it in CI. ``release VERSION`` freezes the current records there.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import typer
from rich.table import Table

from ..infra.app import LoadedApp, stale_records
from ..infra.deployment import load_deployment
from ..schemas.evolution import evolution_problems, releases
from ..schemas.registry import RELEASED_DIR_NAME
from ..schemas.typed import schema_files
from .context import console, fail, settings

schemas_app = typer.Typer(no_args_is_help=True, help="Write and check the Avro records of the deployment's app.")


def _loaded() -> tuple[LoadedApp, Path]:
    loaded = load_deployment(settings(), saga_types=False).app
    if loaded is None:
        fail("saga schemas needs the deployment's app: set SAGA_APP=module:attribute, or `app` in the "
             "[tool.saga] table of pyproject.toml")
    folder = loaded.app.schema_folder
    if folder is None:
        fail(f"{loaded.describe()} names no schema_folder: give SagaApp(schema_folder=...)")
    return loaded, folder


@schemas_app.command("write")
def write() -> None:
    """Write the app's records into its schema folder (only files whose content changed are touched)."""
    loaded, folder = _loaded()
    table = Table("record file", "now")
    for name, schema in schema_files(loaded.app.records()).items():
        path = folder / name
        text = json.dumps(schema, indent=2) + "\n"
        before = path.read_text(encoding="utf-8") if path.is_file() else None
        if before == text:
            table.add_row(str(path), "unchanged")
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        table.add_row(str(path), "written" if before is None else "rewritten")
    console.print(table)


@schemas_app.command("check")
def check() -> None:
    """Exit 1 when a record's file is missing or stale, or a record breaks a released version (either way)."""
    loaded, folder = _loaded()
    stale = stale_records(loaded)
    current = {record.full_name: record.schema() for record in loaded.app.records()}
    problems = [f"{path}: missing or stale (run `saga schemas write`)" for path in stale]
    problems += evolution_problems(current, folder)
    checked = ", ".join(path.name for path in releases(folder)) or "none"
    if problems:
        for problem in problems:
            console.print(f"[red]✗[/] {problem}", soft_wrap=True)
        raise typer.Exit(1)
    console.print(f"{len(current)} records up to date in {folder}; compatible both ways with the releases: {checked}")


@schemas_app.command("release")
def release(version: str = typer.Argument(..., help="The version to freeze the records as, e.g. 1.2.0.")) -> None:
    """Freeze the app's current records as ``released/VERSION/`` of its schema folder (for ``check``)."""
    loaded, folder = _loaded()
    if stale_records(loaded):
        fail("the schema folder is not up to date: run `saga schemas write` first")
    target = folder / RELEASED_DIR_NAME / version
    if target.exists():
        fail(f"{target} exists already: a release is frozen once")
    for name in schema_files(loaded.app.records()):
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(folder / name, target / name)
    console.print(f"records frozen in {target}")
