"""Local Postgres: the system's initdb/pg_ctl on a private data folder, as a non-root user when run as root.

Layout under $SAGA_HOME/postgres/: data/ (the cluster; saga.conf holds our settings), logs/postgres.log.
Role `saga` (superuser, login) and database `saga`; trust authentication, listening on 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import glob
import os
import pwd
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path

import asyncpg

from ..failures import Fault, classify
from ..settings import Settings
from .process import (
    LauncherError,
    Report,
    bind_failure,
    is_alive,
    port_trouble,
    read_pid,
    refuse_unusable_port,
    stop_process,
    tail,
)

INSTALL_HINT = "Postgres binaries (initdb, pg_ctl) not found. Install them: apt-get install -y postgresql"
SERVICE_USER = "postgres"  # the account Debian's postgresql package creates; Postgres refuses to run as root


def _version_key(bin_dir: str) -> tuple[int, ...]:
    version = Path(bin_dir).parent.name
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def find_bin_dir(wanted_major: str | None = None) -> Path:
    """The folder holding initdb and pg_ctl: the data folder's major version if installed, else the newest."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key, reverse=True)
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(str(Path(on_path).resolve().parent))
    usable = [Path(c) for c in candidates if (Path(c) / "initdb").exists() and (Path(c) / "pg_ctl").exists()]
    if not usable:
        raise LauncherError(INSTALL_HINT)
    for bin_dir in usable:
        if wanted_major and bin_dir.parent.name == wanted_major:
            return bin_dir
    return usable[0]


class PostgresLauncher:
    """Prepare, start, stop and inspect the local Postgres of one SAGA_HOME."""

    def __init__(self, settings: Settings) -> None:
        self.port = settings.saga_postgres_port
        self.home = settings.saga_home.expanduser().resolve() / "postgres"
        self.data_dir = self.home / "data"
        self.log_file = self.home / "logs" / "postgres.log"

    @property
    def dsn(self) -> str:
        """The application DSN (role and database `saga`)."""
        return f"postgresql://saga@127.0.0.1:{self.port}/saga"

    @property
    def admin_dsn(self) -> str:
        """The bootstrap superuser's DSN, used to create the `saga` role and database."""
        return f"postgresql://{SERVICE_USER}@127.0.0.1:{self.port}/postgres"

    def pid(self) -> int | None:
        """The postmaster's pid when it runs, else None."""
        try:
            pid = read_pid(self.data_dir / "postmaster.pid")
        except PermissionError:
            return None
        return pid if pid is not None and is_alive(pid, str(self.data_dir)) else None

    def prepare(self, report: Report) -> None:
        """Create the folders (owned by the service user), run initdb on first use and write saga.conf."""
        major = self._data_major()
        find_bin_dir(major)  # fail early, with the install hint, before touching any folder
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        (self.home / "logs").mkdir(exist_ok=True)
        owner = self._service_account()
        if owner is not None:
            self._grant_search(owner, report)
            for path in (self.home, self.home / "logs"):
                os.chown(path, owner.pw_uid, owner.pw_gid)
        if major is None:
            if self.data_dir.exists() and any(self.data_dir.iterdir()):
                raise LauncherError(f"{self.data_dir} is not empty but holds no Postgres cluster; remove it")
            report("initdb (first run only)")
            self._initdb(owner)
        self._write(self.data_dir / "saga.conf", self._saga_conf(), owner)
        self._write(self.data_dir / "pg_hba.conf", _PG_HBA, owner)

    def refuse_unusable_ports(self) -> None:
        """LauncherError, in one line naming SAGA_POSTGRES_PORT, when its port cannot be counted on."""
        refuse_unusable_port(self.port, "SAGA_POSTGRES_PORT")

    def start(self, report: Report) -> int:
        """Start the server with pg_ctl (which detaches it) and return the postmaster's pid."""
        report("starting Postgres")
        pg_ctl = str(self._bin_dir() / "pg_ctl")
        data, log = str(self.data_dir), str(self.log_file)
        result = self._run([pg_ctl, "start", "-w", "-t", "60", "-s", "-D", data, "-l", log])
        pid = self.pid()
        if result.returncode != 0 or pid is None:
            failed = bind_failure(tail(self.log_file, 200))
            if failed is not None:
                raise LauncherError("Postgres did not start: " + port_trouble(self.port, "SAGA_POSTGRES_PORT",
                                                                             failed.words, self.log_file))
            output = f"{result.stdout}{result.stderr}"
            raise LauncherError(f"Postgres did not start:\n{output}\n{tail(self.log_file)}")
        return pid

    async def wait_ready(self, pid: int, seconds: float = 60.0) -> None:
        """Wait until the server accepts connections, then create role and database `saga` if missing."""
        deadline = time.monotonic() + seconds
        while True:
            try:
                conn = await asyncpg.connect(self.admin_dsn, timeout=5)
                break
            except Exception as error:
                if classify(error) is not Fault.PLATFORM or not is_alive(pid) or time.monotonic() > deadline:
                    log = tail(self.log_file)
                    raise LauncherError(f"Postgres refuses connections ({error}):\n{log}") from error
                await asyncio.sleep(0.2)
        try:
            if not await conn.fetchval("SELECT 1 FROM pg_roles WHERE rolname = 'saga'"):
                await conn.execute("CREATE ROLE saga SUPERUSER LOGIN")
            if not await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = 'saga'"):
                await conn.execute("CREATE DATABASE saga OWNER saga")
        finally:
            await conn.close()

    def stop(self, report: Report, timeout: float = 30.0) -> bool:
        """Stop the server; False if it was not running.

        SIGINT is Postgres's "fast" shutdown (disconnect clients, checkpoint); SIGTERM would be "smart"
        and wait for every client to leave. Escalates to SIGQUIT (immediate) and finally SIGKILL.
        """
        pid = self.pid()
        if pid is None:
            return False
        report(f"stopping Postgres (pid {pid})")
        stop_process(pid, signal.SIGINT, timeout, then=signal.SIGQUIT, report=report)
        return True

    # -- internals -------------------------------------------------------------------------------------------

    def _bin_dir(self) -> Path:
        return find_bin_dir(self._data_major())

    def _data_major(self) -> str | None:
        try:
            return (self.data_dir / "PG_VERSION").read_text().strip()
        except (FileNotFoundError, NotADirectoryError):
            return None

    @staticmethod
    def _service_account() -> pwd.struct_passwd | None:
        """The account to run Postgres as: `postgres` when we are root, else ourselves (None)."""
        if os.geteuid() != 0:
            return None
        try:
            return pwd.getpwnam(SERVICE_USER)
        except KeyError:
            raise LauncherError(f"running as root needs the `{SERVICE_USER}` user. {INSTALL_HINT}") from None

    def _grant_search(self, owner: pwd.struct_passwd, report: Report) -> None:
        """Let the service user traverse the folders above the data folder (e.g. /root is mode 700).

        Adds only the search bit (o+x) where it is missing: names inside stay unlistable.
        """
        groups = {owner.pw_gid} | set(os.getgrouplist(owner.pw_name, owner.pw_gid))
        for folder in reversed(self.home.parents):
            info = folder.stat()
            if info.st_uid == owner.pw_uid and info.st_mode & stat.S_IXUSR:
                continue
            if info.st_gid in groups and info.st_mode & stat.S_IXGRP:
                continue
            if info.st_mode & stat.S_IXOTH:
                continue
            report(f"granting search permission (o+x) on {folder}: `{owner.pw_name}` must reach the data")
            os.chmod(folder, info.st_mode | stat.S_IXOTH)

    def _run(self, command: list[str]) -> subprocess.CompletedProcess[str]:
        owner = self._service_account()
        # Drop PG* variables: PGDATA/PGPORT from the caller's shell must not redirect the tools.
        env = {key: value for key, value in os.environ.items() if not key.startswith("PG")}
        if owner is not None:
            env["HOME"] = owner.pw_dir
            env["USER"] = env["LOGNAME"] = owner.pw_name
        return subprocess.run(
            command,
            user=owner.pw_uid if owner else None,
            group=owner.pw_gid if owner else None,
            extra_groups=[] if owner else None,
            env=env,
            cwd=self.home,
            capture_output=True,
            text=True,
            start_new_session=True,  # the server must not share our terminal's Ctrl-C
        )

    def _initdb(self, owner: pwd.struct_passwd | None) -> None:
        self.data_dir.mkdir(mode=0o700, exist_ok=True)
        if owner is not None:
            os.chown(self.data_dir, owner.pw_uid, owner.pw_gid)
        initdb = str(self._bin_dir() / "initdb")
        data = str(self.data_dir)
        result = self._run(
            [initdb, "-D", data, "-U", SERVICE_USER, "--auth=trust", "-E", "UTF8", "--no-locale"]
        )
        if result.returncode != 0:
            raise LauncherError(f"initdb failed:\n{result.stdout}{result.stderr}")
        with (self.data_dir / "postgresql.conf").open("a") as conf:
            conf.write(
                "\n# Settings of the saga orchestrator's local launcher (rewritten at every start).\n"
                "include_if_exists = 'saga.conf'\n"
            )

    def _saga_conf(self) -> str:
        return (
            f"port = {self.port}\n"
            "listen_addresses = '127.0.0.1'\n"
            "# No Unix socket: its path length is limited and clients here use TCP.\n"
            "unix_socket_directories = ''\n"
            "max_connections = 200\n"
            "shared_buffers = 128MB\n"
            "fsync = on\n"
            "synchronous_commit = on\n"
            "max_wal_size = 2GB\n"
            "log_checkpoints = off\n"
            "# Analyze and vacuum soon: the outbox and timer tables are queues that swing between empty and\n"
            "# thousands of rows, and statistics taken while one was empty mislead the planner (default 1min).\n"
            "autovacuum_naptime = 5s\n"
        )

    @staticmethod
    def _write(path: Path, text: str, owner: pwd.struct_passwd | None) -> None:
        path.write_text(text)
        if owner is not None:
            os.chown(path, owner.pw_uid, owner.pw_gid)


_PG_HBA = """\
# Local launcher: trust connections from this machine only (the server listens on 127.0.0.1 only).
# TYPE  DATABASE  USER  ADDRESS       METHOD
local   all       all                 trust
host    all       all   127.0.0.1/32  trust
"""
