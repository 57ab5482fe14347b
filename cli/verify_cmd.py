"""``saga verify``: check the system's invariants over every saga (or the given ones); exit 1 on any problem
(the checks are ``operations.verify``'s)."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from ..operations.verify import VerifyReport, verify_system
from .context import console, refuse_postgres_failure, run, settings


def verify(
    saga_ids: Annotated[list[str] | None, typer.Argument(help="Only these sagas (default: every saga).")] = None,
    wait: float = typer.Option(0.0, "--wait", min=0, help="Wait up to this many seconds for sagas to finish."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Check every saga ended and its effects match how it ended; exit 1 on any violation or unfinished saga."""
    try:
        report = run(verify_system(settings(), saga_ids or None, wait))
    except Exception as error:
        refuse_postgres_failure(error, settings().dsn())
        raise
    if as_json:
        console.print_json(json.dumps(report.to_dict()))
    else:
        _print(report)
    if not report.ok:
        raise typer.Exit(1)


def _print(report: VerifyReport) -> None:
    summary = Table("figure", "value")
    summary.add_row("sagas started", str(report.started))
    for status, count in report.terminal.items():
        summary.add_row(f"ended {status}", str(count))
    summary.add_row("not terminal", str(len(report.not_terminal)))
    summary.add_row("violations", str(len(report.violations)))
    console.print(summary)
    if report.not_terminal:
        table = Table("saga", "state", "why", title="not terminal")
        for saga_id, status, why in report.not_terminal[:50]:
            table.add_row(saga_id, status, why)
        console.print(table)
    if report.violations:
        table = Table("saga", "problem", title="violations")
        for violation in report.violations[:100]:
            table.add_row(violation.saga_id, violation.problem)
        console.print(table)
    console.print("[green]verify: every saga ended and every invariant holds[/]" if report.ok
                  else "[red]verify: problems found[/]")
