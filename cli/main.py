"""The ``saga`` command: start, cancel, inspect, audit and run sagas; manage local infrastructure."""

from __future__ import annotations

import typer

from . import (
    audit_cmd,
    commands,
    deferred_cmd,
    inspect_cmd,
    levers,
    migrate_cmd,
    operator_log_cmd,
    purge_cmd,
    reproject_cmd,
    verify_cmd,
)
from .bulk_cmd import bulk_app
from .console_cmd import console_app
from .definitions_check_cmd import definitions_app
from .dlq_cmd import dlq_app
from .infra_cmd import infra_app
from .outbox_cmd import outbox_app
from .run_cmd import run_app
from .schemas_cmd import schemas_app

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Event-sourced saga orchestrator on Kafka and Postgres.")
app.add_typer(infra_app, name="infra", help="Local Kafka and Postgres: up, down, status.")
app.add_typer(run_app, name="run")
app.add_typer(dlq_app, name="dlq")
app.add_typer(bulk_app, name="bulk")
app.add_typer(console_app, name="console")
app.add_typer(outbox_app, name="outbox")
app.add_typer(schemas_app, name="schemas")
app.command("start")(commands.start)
app.command("signal")(commands.signal)
levers.register(app)
app.command("status")(inspect_cmd.status)
app.command("history")(inspect_cmd.history)
app.command("list")(inspect_cmd.list_sagas)
app.command("effects")(inspect_cmd.effects)
app.command("audit")(audit_cmd.audit)
app.command("operator-log")(operator_log_cmd.operator_log)
app.command("verify")(verify_cmd.verify)
app.command("migrate")(migrate_cmd.migrate_command)
app.command("reproject")(reproject_cmd.reproject_command)
app.command("purge")(purge_cmd.purge)
app.add_typer(definitions_app, name="definitions")
app.command("awaiting")(deferred_cmd.awaiting_command)
app.command("answer")(deferred_cmd.answer_command)


@app.command("demo")
def demo(keep_running: bool = typer.Option(False, "--keep-running", help="Leave the services running.")) -> None:
    """Run 20 trip sagas covering every trigger, with live progress and a final check."""
    from .demo_cmd import run_demo

    raise typer.Exit(run_demo(keep_running))


if __name__ == "__main__":
    app()
