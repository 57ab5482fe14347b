"""``saga operator-log``: what operators did through the console or its API (the operator audit), newest first.

Not ``saga audit``, which checks ``saga.events`` against the event store."""

from __future__ import annotations

import dataclasses

import typer
from rich.table import Table

from ..client.api import ApiError
from ..operations.audit import OperatorAudit
from ..operations.ports import AuditEntry
from ..operations.postgres import lever_store
from .context import JSON_HELP, console, database, fail, print_json, run, settings
from .inspect_cmd import console_api, when

SCANNED = 1000
"""How many of the latest entries ``--saga`` and ``--operator`` look through (the most the console's API gives)."""


def operator_log(
    limit: int = typer.Option(50, "--limit", min=1, max=SCANNED, help="At most this many entries, newest first."),
    saga_id: str | None = typer.Option(None, "--saga", help=f"Only what was done to this saga (among the latest "
                                                            f"{SCANNED} entries)."),
    operator: str | None = typer.Option(None, "--operator", help=f"Only what this operator did (among the latest "
                                                                 f"{SCANNED} entries)."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per entry; " + JSON_HELP),
) -> None:
    """What operators did through the console or its API, refused actions and sign-ins too (the operator audit),
    newest first: through the console's API when only SAGA_API_URL is set, else from the database. (`saga audit`
    is the check of saga.events against the event store.)"""
    filtered = saga_id is not None or operator is not None
    found = [entry for entry in run(_entries(SCANNED if filtered else limit))
             if _wanted(entry, saga_id, operator)][:limit]
    if as_json:
        for entry in found:
            print_json(dataclasses.asdict(entry))
        return
    table = Table("time (UTC)", "operator", "action", "target", "outcome", "detail")
    for entry in found:
        detail = ", ".join(f"{key}={value}" for key, value in entry.detail.items() if value not in (None, ""))
        table.add_row(when(entry.at_ms), entry.operator, entry.action, entry.target, entry.outcome, detail)
    console.print(table if found else "no operator actions recorded" + (" that match" if filtered else ""))


async def _entries(limit: int) -> list[AuditEntry]:
    api = console_api()
    if api is not None:
        try:
            return [AuditEntry(row["operator"], row["action"], row["target"], row["detail"], row["outcome"],
                               row["at_ms"]) for row in await api.operator_audit(limit)]
        except ApiError as error:
            fail(str(error))
    async with database(settings()) as pool:
        return await OperatorAudit(lever_store(pool)).entries(limit)


def _wanted(entry: AuditEntry, saga_id: str | None, operator: str | None) -> bool:
    if operator is not None and entry.operator != operator:
        return False
    # A lever or a signal targets "saga ID"; a dead letter replayed names its saga in its detail.
    return saga_id is None or entry.target == f"saga {saga_id}" or entry.detail.get("saga") == saga_id
