"""Process helpers shared by the Kafka and Postgres launchers: liveness, stopping, ports, log tails."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import re
import signal
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

Report = Callable[[str], None]
"""Progress callback: one short line saying what a launcher is doing now."""


class LauncherError(RuntimeError):
    """A local service could not be prepared, started or stopped; the message says what to do."""


def _proc_state(pid: int) -> str | None:
    """The one-letter state from /proc/<pid>/stat, or None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name in parentheses may itself contain spaces or parentheses: split after the last ')'.
    return stat.rsplit(")", 1)[1].split()[0]


def _reap(pid: int) -> None:
    """Collect the exit status if the process is our own child, so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def is_alive(pid: int, marker: str | None = None) -> bool:
    """Whether the process runs (zombies count as gone) and, when given, its command line holds `marker`.

    The marker guards against a stale pid file whose pid the kernel has reused for another program.
    """
    _reap(pid)
    state = _proc_state(pid)
    if state is None or state in ("Z", "X"):
        return False
    if marker is None:
        return True
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    return marker.encode() in cmdline


def wait_exit(pid: int, timeout: float) -> bool:
    """Wait up to `timeout` seconds for the process to end; True when it has."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not is_alive(pid):
            return True
        time.sleep(0.1)
    return not is_alive(pid)


def _send(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def stop_process(
    pid: int,
    first: signal.Signals,
    timeout: float,
    then: signal.Signals | None = None,
    report: Report | None = None,
) -> None:
    """Ask a process to stop with `first`; after `timeout` escalate (to `then`, if given), then SIGKILL."""
    _send(pid, first)
    if wait_exit(pid, timeout):
        return
    if then is not None:
        if report:
            report(f"pid {pid} still running after {timeout:.0f} s; sending {then.name}")
        _send(pid, then)
        if wait_exit(pid, 5.0):
            return
    if report:
        report(f"pid {pid} did not stop; sending SIGKILL")
    _send(pid, signal.SIGKILL)
    if not wait_exit(pid, 10.0):
        raise LauncherError(f"process {pid} survived SIGKILL")


def read_pid(path: Path) -> int | None:
    """The pid in the first line of a pid file, or None when the file is missing or unreadable."""
    try:
        first_line = path.read_text().split("\n", 1)[0].strip()
    except OSError:
        return None
    return int(first_line) if first_line.isdigit() else None


EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_ports(source: Path = EPHEMERAL_RANGE_FILE) -> range | None:
    """The ports this machine gives outgoing connections (``net.ipv4.ip_local_port_range``); None where it
    cannot tell."""
    try:
        low, high = (int(part) for part in source.read_text().split())
    except (OSError, ValueError):
        return None
    return range(low, high + 1)


def bind_error(port: int, host: str = "127.0.0.1") -> str | None:
    """Why a server could not listen on host:port now, in the system's words; None when it could."""
    with socket.socket() as probe:
        # As Kafka and Postgres bind: a closed connection still in TIME_WAIT on the port does not count.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
            probe.listen(1)
        except OSError as error:
            return error.strerror or str(error)
    return None


def refuse_unusable_port(port: int, setting: str) -> None:
    """A one-line LauncherError naming ``setting`` when a local server cannot count on ``port``: it lies in the
    ephemeral range (an outgoing connection of any program may hold it at any moment), or a socket holds it now.
    """
    ephemeral = ephemeral_ports()
    if ephemeral is not None and port in ephemeral:
        raise LauncherError(
            f"port {port} ({setting}) is in this machine's ephemeral range ({ephemeral.start}-{ephemeral.stop - 1}, "
            f"net.ipv4.ip_local_port_range), where any outgoing connection may take it; pick a port below "
            f"{ephemeral.start} with {setting}")
    taken = bind_error(port)
    if taken is not None:
        raise LauncherError(f"port {port} ({setting}) is held by another socket: {taken} (`ss -tanp 'sport = :{port}'` "
                            f"shows which program); stop it or pick another port with {setting}")


# How Kafka ("Socket server failed to bind to 127.0.0.1:19092: Address already in use.") and Postgres ('could not
# bind IPv4 address "127.0.0.1": Address already in use') say in their logs that a port could not be had.
_BIND_FAILED = re.compile(r"(failed to bind to \S+:(\d+)|could not bind [^:\n]+): *([^.\n]+)", re.IGNORECASE)


@dataclass(frozen=True)
class BindFailure:
    """A server's own words for a port it could not bind, and the port when they name it."""

    words: str
    port: int | None


def bind_failure(log: str) -> BindFailure | None:
    """The first line of a server's log that says it could not bind its port; None when none does."""
    found = _BIND_FAILED.search(log)
    if found is None:
        return None
    return BindFailure(f"{found.group(1)}: {found.group(3).strip()}", int(found.group(2)) if found.group(2) else None)


def port_trouble(port: int, setting: str, words: str, log: Path) -> str:
    """One line for a server that could not bind ``port``: the port, its setting, the server's words, a hint."""
    return (f"port {port} ({setting}): {words}; another program holds it or held it a moment ago "
            f"(`ss -tanp 'sport = :{port}'` shows which); pick another port with {setting}. Its log: {log}")


def port_open(port: int, host: str = "127.0.0.1", timeout: float = 0.5) -> bool:
    """Whether something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def tail(path: Path, lines: int = 20) -> str:
    """The last lines of a log file (for error messages), or a note that it does not exist."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 16384))
            text = handle.read().decode(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


@contextlib.asynccontextmanager
async def file_lock(path: Path) -> AsyncIterator[None]:
    """Hold an exclusive lock on `path` so two runs do not start or stop the same service at once.

    The wait happens in a thread: a second holder in this same process (flock locks belong to the open file,
    not the process) then waits without blocking the event loop the first holder needs.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        await asyncio.to_thread(fcntl.flock, handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
