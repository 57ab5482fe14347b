"""``saga console``: serve the web console and its HTTP API; ``saga console add-user``: a local login."""

from __future__ import annotations

import getpass
import ipaddress
from pathlib import Path

import typer

from ..infra.misconfigured import Misconfigured
from ..infra.settings import Settings
from .context import console, fail, settings

console_app = typer.Typer(help="The web console and its HTTP API.", invoke_without_command=True)
DEFAULT_PORT = 8089
USERS_HELP = "The users file (default: SAGA_CONSOLE_USERS)."


@console_app.callback()
def serve(ctx: typer.Context,
          host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (only this machine by default)."),
          port: int = typer.Option(DEFAULT_PORT, "--port", min=1, max=65535, help="Port to listen on.")) -> None:
    """Serve the console on http://HOST:PORT (its API under /api/v1, the OpenAPI document at /api/openapi.json).

    Read-only unless SAGA_CONSOLE_LEVERS=true; the operator comes from SAGA_CONSOLE_OPERATOR_HEADER (a trusted
    proxy) or a local login (SAGA_CONSOLE_USERS)."""
    if ctx.invoked_subcommand is not None:
        return
    import uvicorn

    from ..console.app import console_app as make_app

    current = settings()
    try:
        check_bind(current, host)
        web = make_app(current)
    except Misconfigured as error:
        fail(str(error))
    mode = "levers on" if current.saga_console_levers else "read-only"
    console.print(f"saga console on http://{host}:{port} ({mode}); API at /api/v1, OpenAPI at /api/openapi.json")
    uvicorn.run(web, host=host, port=port, log_level="warning", access_log=False)


def check_bind(current: Settings, host: str) -> None:
    """Misconfigured when the console would take the operator's name from a header on an address others may
    reach, without SAGA_CONSOLE_BEHIND_PROXY saying that only the proxy can."""
    if not current.saga_console_operator_header or current.saga_console_behind_proxy:
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        raise Misconfigured(f"--host {host} with SAGA_CONSOLE_OPERATOR_HEADER: anyone reaching {host} could name "
                            "themselves in the header; bind 127.0.0.1 behind the proxy, or set "
                            "SAGA_CONSOLE_BEHIND_PROXY=true if only the proxy can reach this address")


@console_app.command("add-user")
def add_user_command(name: str = typer.Argument(..., help="The operator's name, as recorded with each action."),
                     users: str | None = typer.Option(None, "--users", help=USERS_HELP)) -> None:
    """Add a local login to the users file (asks for the password twice)."""
    from ..console.identity import add_user

    named = users or settings().saga_console_users
    path = Path(named) if named else None
    if path is None:
        fail("name the users file: --users FILE, or set SAGA_CONSOLE_USERS")
    password = getpass.getpass(f"password for {name}: ")
    if len(password) < 8 or password != getpass.getpass("again: "):
        fail("the passwords differ, or are shorter than 8 characters; nothing written")
    try:
        add_user(path, name, password)
    except (ValueError, Misconfigured) as error:
        fail(str(error))
    console.print(f"{name} can sign in; {path} holds {path.read_text().count(chr(10))} login(s)")
