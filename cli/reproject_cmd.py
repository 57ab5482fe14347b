"""``saga reproject``: rebuild the saga_summary read model from the event store (``operations.reprojection``)."""

from __future__ import annotations

import typer
from rich.table import Table

from ..operations.postgres import event_store
from ..operations.reprojection import Reprojection, reproject
from .context import console, database, deployed_definitions, run, settings


def reproject_command(
    dry_run: bool = typer.Option(False, "--dry-run", help="Count what would change; change nothing."),
) -> None:
    """Rebuild the saga_summary read model from the event store (safe while the services run)."""

    async def body() -> Reprojection:
        current = settings()
        async with database(current) as pool:
            return await reproject(event_store(pool), deployed_definitions(), dry_run)

    result = run(body())
    verb = "would be" if dry_run else "were"
    table = Table("figure", "value", title="saga_summary from the events")
    table.add_row("sagas folded", str(result.sagas))
    table.add_row(f"rows that {verb} repaired (missing or wrong)", str(result.repaired))
    table.add_row(f"rows that {verb} removed (no events)", str(result.removed))
    table.add_row("sagas that cannot be folded (left as they are)", str(len(result.unfoldable)))
    console.print(table)
    for saga_id, why in result.unfoldable[:20]:
        console.print(f"[red]{saga_id}[/]: {why}")
    if result.unfoldable:
        raise typer.Exit(1)
