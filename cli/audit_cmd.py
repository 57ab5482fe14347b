"""``saga audit``: rebuild every saga from ``saga.events`` alone and compare with the event store (the
comparison is ``orchestrator.audit``'s)."""

from __future__ import annotations

import dataclasses

import typer
from rich.table import Table

from ..orchestrator.audit import audit_all
from .context import console, print_json, refuse_postgres_failure, run, settings


def audit(as_json: bool = typer.Option(False, "--json", help="As one JSON object: the figures, the states "
                                                                 "the topic gives, every difference.")) -> None:
    """Rebuild every saga from saga.events alone, compare with the Postgres event store; exit 1 on any difference.
    (What operators did through the console is `saga operator-log`.)"""
    try:
        differences, statuses, figures = run(audit_all(settings()))
    except Exception as error:
        refuse_postgres_failure(error, settings().dsn())
        raise
    if as_json:
        print_json({"figures": figures, "states_from_topic": dict(sorted(statuses.items())),
                    "differences": [dataclasses.asdict(difference) for difference in differences]})
        raise typer.Exit(1 if differences else 0)
    summary = Table("figure", "value")
    for name, value in figures.items():
        summary.add_row(name, str(value))
    for status, count in sorted(statuses.items()):
        summary.add_row(f"state {status} (from the topic)", str(count))
    summary.add_row("differences", str(len(differences)))
    console.print(summary)
    if differences:
        table = Table("saga", "seq", "problem", title="differences")
        for difference in differences[:50]:
            table.add_row(difference.saga_id, str(difference.seq or ""), difference.problem)
        console.print(table)
        raise typer.Exit(1)
    console.print("[green]audit: the topic and the store agree[/]")
