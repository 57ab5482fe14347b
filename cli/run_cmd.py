"""``saga run``: start the orchestrator, the relay, a participant, or all of them as processes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Annotated, Any

import typer

from ..infra.deployment import load_deployment
from ..infra.heap import settle_service_heap
from ..infra.logging import configure_logging
from ..infra.misconfigured import Misconfigured
from ..infra.settings import Settings
from ..infra.tracing import configure_tracing
from ..participants.registry import participant_workers
from .context import console, fail, settings

Services = Mapping[str, subprocess.Popen[bytes]]  # started services by label

run_app = typer.Typer(no_args_is_help=True, help="Run the services (each until Ctrl-C / SIGTERM).")


def _serve(body: Callable[[Settings, asyncio.Event], Coroutine[Any, Any, None]], service: str = "saga") -> None:
    """Run ``body`` until SIGINT/SIGTERM, its logs configured and its spans exported (when an OTLP endpoint is
    set) as ``service``."""
    current = settings()
    configure_logging(current.saga_log_level, "kv" if current.saga_log_format == "kv" else "json")
    configure_tracing(service)
    settle_service_heap()

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await body(current, stop)

    try:
        import uvloop

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())


@run_app.command("orchestrator")
def orchestrator(with_relay: bool = typer.Option(
        False, "--with-relay", help="Also relay the outbox, woken by each commit (as saga run all does).")) -> None:
    """Consume saga.start, saga.control and the results topics; fire durable timers."""
    from ..orchestrator.bootstrap import run_orchestrator

    try:
        _serve(lambda current, stop: run_orchestrator(current, stop, with_relay=with_relay), "saga-orchestrator")
    except Misconfigured as refused:
        fail(str(refused))


@run_app.command("relay")
def relay() -> None:
    """Publish the orchestrator's outbox (commands and saga.events) to Kafka."""
    from ..orchestrator.bootstrap import run_relay

    try:
        _serve(run_relay, "saga-relay")
    except Misconfigured as refused:
        fail(str(refused))


@run_app.command("participant")
def participant(names: Annotated[list[str], typer.Argument(
        help="flight, hotel, payment, notification, or module:attribute of your own Participant; several names: "
             "one worker hosting them all")]) -> None:
    """Run a participant worker (faust), each hosted participant with its own outbox relay."""
    from ..participants.runner import hosted_participants, run_participant

    try:
        hosted_participants(names, load_deployment(settings(), saga_types=False))
    except (ValueError, ImportError, Misconfigured) as error:
        fail(str(error))
    settle_service_heap()
    try:
        run_participant(names, settings())
    except Misconfigured as refused:
        fail(str(refused))


def service_commands(current: Settings) -> dict[str, list[str]]:
    """The command line of every service ``saga run all`` starts: the orchestrator and the participant workers
    (``SAGA_PARTICIPANTS``: a worker per comma-separated entry, hosting the ``+``-joined participants of it;
    labelled by their names, e.g. ``flight`` or ``flight+hotel``).

    The orchestrator relays its own outbox (``--with-relay``), woken by each of its commits: a separate relay
    process only learns of new rows by polling, which put 50-60 ms at p50 on each of a trip's four relay hops
    (three step levels and the terminal event) for the same CPU. ``saga run relay`` remains for deployments
    that want the relay apart, or a standby next to it (one relay per table is active at a time)."""
    base = [sys.executable, "-P", "-m", "saga_orchestrator.cli", "run"]
    commands = {"orchestrator": [*base, "orchestrator", "--with-relay"]}
    for worker in participant_workers(current):
        label = "+".join(path.rpartition(":")[2].lower() for path in worker)
        commands[label] = [*base, "participant", *worker]
    return commands


def service_environment(current: Settings) -> dict[str, str]:
    """The environment that gives a child service exactly ``current``'s settings: every one of them
    (``Settings.environment``), whether it came from this process's environment or was set in code; one left
    unset is taken out, whatever case the parent's environment spelled it in.

    Everything else is inherited, ``SAGA_FAULTS`` (infra/faults.py) included when it is set.
    """
    values = current.environment()
    env = {name: value for name, value in os.environ.items() if name.upper() not in values}
    env.update({name: value for name, value in values.items() if value is not None})
    return env


def health_port(current: Settings, label: str) -> int:
    """The health port of service ``label`` under ``saga run all``: SAGA_HEALTH_PORT counting up in the order
    of ``service_commands`` (0 when SAGA_HEALTH_PORT is 0: no endpoint)."""
    if not current.saga_health_port:
        return 0
    return current.saga_health_port + list(service_commands(current)).index(label)


def start_service(current: Settings, label: str, log_dir: str | None = None,
                  extra_env: dict[str, str] | None = None, name: str | None = None) -> subprocess.Popen[bytes]:
    """Start one service (a label of ``service_commands``) as a child process.

    ``extra_env`` is added to its environment, e.g. ``{"SAGA_FAULTS": "relay.after_publish=3"}``. ``name``
    starts one more instance of the service: its log is ``name``.log and it has no health port (unless
    ``extra_env`` gives one).
    """
    output = open(f"{log_dir}/{name or label}.log", "ab") if log_dir else None
    port = health_port(current, label) if name is None else 0
    env = {**service_environment(current), "SAGA_HEALTH_PORT": str(port), **(extra_env or {})}
    return subprocess.Popen(service_commands(current)[label], stdout=output, stderr=output, env=env)


def start_services(current: Settings, log_dir: str | None = None) -> dict[str, subprocess.Popen[bytes]]:
    """Start every service as a child process (logs to ``log_dir``/NAME.log when given)."""
    return {label: start_service(current, label, log_dir) for label in service_commands(current)}


def exited_services(processes: Services) -> list[str]:
    """Labels of the started services that are no longer running."""
    return [label for label, process in processes.items() if process.poll() is not None]


def stop_services(processes: dict[str, subprocess.Popen[bytes]], timeout_s: float = 15) -> None:
    """SIGTERM every service, then SIGKILL whatever is still running after ``timeout_s``."""
    for process in processes.values():
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + timeout_s
    for process in processes.values():
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@run_app.command("all")
def run_all(log_dir: str | None = typer.Option(None, "--log-dir", help="Write each service's log here.")) -> None:
    """Run the orchestrator (relaying its own outbox) and every participant as child processes until Ctrl-C."""
    current = settings()
    try:
        load_deployment(current)  # refused here, in one line, rather than by each child
    except Misconfigured as refused:
        fail(str(refused))
    processes = start_services(current, log_dir)
    console.print(f"started: {', '.join(f'{k} (pid {p.pid})' for k, p in processes.items())}")
    if current.saga_health_port:
        console.print("health: " + ", ".join(
            f"{label} http://{current.saga_health_host}:{health_port(current, label)}/health" for label in processes))
    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        while not stopping:
            for label in exited_services(processes):
                console.print(f"[red]{label} exited with {processes[label].returncode}; stopping all[/]")
                stopping = True
            time.sleep(0.5)
    finally:
        stop_services(processes)
