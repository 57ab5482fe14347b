"""``saga infra up | down | status``: the local Kafka and Postgres (no Docker needed)."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import typer
from rich.markup import escape
from rich.table import Table

from ..infra import launcher
from ..infra.deployment import load_deployment
from ..infra.failures import describe
from ..infra.launcher.security import SCRAM_USER
from ..infra.misconfigured import Misconfigured
from ..infra.settings import Settings
from ..participants.runner import hosted_participants
from .context import print_json, terminal_console
from .migrate_cmd import create_missing_roles, service_roles

infra_app = typer.Typer(no_args_is_help=True, help="Local Kafka and Postgres: start, stop, inspect.")

_out = terminal_console()
_err = terminal_console(stderr=True)


def _fail(error: launcher.LauncherError) -> typer.Exit:
    # soft_wrap: a one-line cause stays one line however narrow the terminal (a log tail keeps its own lines).
    _err.print(f"[bold red]error:[/] {escape(str(error))}", soft_wrap=True, highlight=False)
    return typer.Exit(1)


@infra_app.command()
def up(brokers: int = typer.Option(
        None, "--brokers", min=1, max=9,
        help="Kafka brokers to run (default SAGA_KAFKA_BROKERS, 1); 3: a KRaft cluster on loopback whose topics "
             "can be replicated three times.")) -> None:
    """Start Kafka and Postgres unless already running, wait until they answer, print where they are.

    KAFKA_BOOTSTRAP_SERVERS / DATABASE_URL, when set, are used as they are: nothing is started for them.
    """
    started = time.monotonic()
    current = Settings() if brokers is None else Settings(saga_kafka_brokers=brokers)
    try:
        endpoints = asyncio.run(launcher.up(current, _err))
    except launcher.LauncherError as error:
        raise _fail(error) from None
    if not current.database_url:  # our own Postgres: its least-privilege roles too (README, "Production")
        _err.print(_local_roles(current, endpoints.database_url), highlight=False, soft_wrap=True)
    _err.print(f"ready in {time.monotonic() - started:.1f} s")
    if endpoints.secure_kafka_bootstrap and endpoints.kafka_secrets:
        _err.print(f"the broker's SASL_SSL listener: {endpoints.secure_kafka_bootstrap}, SCRAM user {SCRAM_USER} "
                   f"(password in {endpoints.kafka_secrets / 'scram.password'}), CA "
                   f"{endpoints.kafka_secrets / 'ca.pem'}",
                   highlight=False, soft_wrap=True)
    # stdout carries only these lines, so `eval "$(saga infra up)"` exports them into a shell.
    _out.print(f"export KAFKA_BOOTSTRAP_SERVERS={endpoints.kafka_bootstrap}", highlight=False, soft_wrap=True)
    _out.print(f"export DATABASE_URL={endpoints.database_url}", highlight=False, soft_wrap=True)


def _local_roles(current: Settings, dsn: str) -> str:
    """Create the roles of the orchestrator, the console and SAGA_PARTICIPANTS in the local Postgres; say which."""
    try:
        loaded = load_deployment(current, saga_types=False)
        hosted = hosted_participants(loaded.participant_names(), loaded)
    except (ValueError, ImportError, Misconfigured) as error:
        return f"roles not created: SAGA_PARTICIPANTS: {error}"
    roles = service_roles(True, hosted)
    try:
        asyncio.run(create_missing_roles(dsn, roles))
    except Exception as error:  # the roles are a convenience of the local stack: say why, go on
        return f"roles not created ({describe(error)})"
    return (f"least-privilege roles (LOGIN, trusted on 127.0.0.1): {', '.join(roles)}; `saga migrate` grants each "
            "its schema, then a service may connect as its role (DATABASE_URL=postgresql://ROLE@...)")


@infra_app.command()
def down() -> None:
    """Stop the local Kafka and Postgres (their data stays; `up` brings it back)."""
    try:
        asyncio.run(launcher.down(Settings(), _err))
    except launcher.LauncherError as error:
        raise _fail(error) from None


@infra_app.command()
def status(as_json: bool = typer.Option(False, "--json", help="One JSON object per service (its address may "
                                                                 "hold a DSN, as the table shows it).")) -> None:
    """Show each service: up or down, address, port, pid, data folder."""
    if as_json:
        for found in launcher.status(Settings()):
            print_json({**dataclasses.asdict(found), "data_dir": str(found.data_dir) if found.data_dir else None})
        return
    table = Table()
    for header in ("service", "state", "address", "port", "pid", "data folder"):
        table.add_column(header, overflow="fold")  # paths and DSNs are worth more than a tidy table
    for row in launcher.status(Settings()):
        state = "[green]up[/]" if row.running else "[red]down[/]"
        if row.external:
            state = "external"
        table.add_row(
            row.name,
            state,
            row.address,
            str(row.port or "-"),
            str(row.pid or "-"),
            str(row.data_dir or "-"),
        )
    _out.print(table)
