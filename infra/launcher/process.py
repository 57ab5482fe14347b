"""Process helpers shared by the Kafka and Postgres launchers: liveness, stopping, ports, log tails."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import signal
import socket
import time
from collections.abc import AsyncIterator, Callable
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
